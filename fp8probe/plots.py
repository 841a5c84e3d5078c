"""matplotlib figures for the files fp8probe writes (headless: the Agg backend)."""

from __future__ import annotations

from pathlib import Path

from .selection import group_scores, rank_groups


def capacity_bars(report: dict, path: str | Path) -> None:
    """Bar chart of KV tokens and max concurrency, BF16 vs the candidate, from a capacity report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b, c = report["baseline"], report["candidate"]
    labels = ["BF16, auto KV", f"{c['scheme'] or 'BF16'}, {c['kv_cache_dtype']} KV"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, key, title in ((axes[0], "kv_tokens", "KV-cache tokens"),
                           (axes[1], "max_concurrency", f"max concurrency at {report['max_model_len']:,} tokens")):
        vals = [b[key], c[key]]
        bars = ax.bar(labels, vals, color=["#888888", "#2b7bba"])
        ax.set_title(title, fontsize=10)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if key == "kv_tokens" else f"{v:.2f}x" for v in vals], fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.margins(y=0.15)
    fig.suptitle(f"{report['model_type']}: x{report['ratio_kv_tokens']:.2f} KV tokens", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sensitivity_heatmap(sensitivity, path: str | Path | None = None, metric: str = "kl_q_p"):
    """Blocks x unit kinds, colour = log10(metric), from a sensitivity.csv (or its DataFrame)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    df = sensitivity if isinstance(sensitivity, pd.DataFrame) else pd.read_csv(sensitivity)
    df = df[df["kind"] != "model"]
    table = df.pivot_table(index="kind", columns="block", values=metric, aggfunc="sum")
    order = [k for k in ("q", "k", "v", "qkv", "o", "gate", "up", "gate_up", "down", "expert", "kv") if k in table.index]
    table = table.loc[order]
    fig, ax = plt.subplots(figsize=(max(6, 0.28 * table.shape[1]), 0.4 * len(order) + 1.2))
    im = ax.imshow(np.log10(table.clip(lower=1e-12)), aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(order)), order)
    ax.set_xticks(range(table.shape[1]), table.columns, fontsize=7)
    ax.set_xlabel("block")
    fig.colorbar(im, ax=ax, label=f"log10 {metric}")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def budget_curve(sensitivity, path: str | Path | None = None, metric: str = "kl_q_p"):
    """Predicted mismatch (sum of group scores) against weight bytes saved, along the recipe ranking."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ranked = rank_groups(group_scores(sensitivity, metric))
    saved = np.cumsum([0] + [g.bytes_saved for g in ranked]) / 2**20
    pred = np.cumsum([0] + [g.score for g in ranked])
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(pred, saved, marker=".", markersize=3)
    ax.set_xscale("symlog", linthresh=max(pred[1], 1e-9))
    ax.set_xlabel(f"predicted {metric} (sum of group scores)")
    ax.set_ylabel("weight MiB saved")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def budget_fit(budget, path: str | Path | None = None):
    """Quality loss against mismatch for the runs behind a budget, with the budget and the tolerance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.DataFrame(budget.runs)
    higher = str(df.get("higher_is_better", pd.Series(["true"])).iloc[0]).lower() in ("true", "1")
    base = df[df["mismatch"] == 0]["quality"].mean()
    loss = ((base - df["quality"]) if higher else (df["quality"] - base)) / abs(base)
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    x = df["mismatch"].where(df["mismatch"] > 0, df["mismatch"][df["mismatch"] > 0].min() / 3)
    ax.scatter(x, 100 * loss, s=14, label="training runs (mismatch 0 drawn at the left edge)")
    ax.axhline(100 * budget.tolerance, color="grey", linestyle=":", label=f"tolerance {100 * budget.tolerance:g} %")
    ax.axvline(budget.value, color="tab:red", label=f"budget {budget.value:.3g}")
    if budget.interval:
        ax.axvspan(*budget.interval, color="tab:red", alpha=0.12, label="90 % bootstrap interval")
    ax.set_xscale("log")
    ax.set_xlabel(f"rollout mismatch ({budget.metric})")
    ax.set_ylabel("relative quality loss (%)")
    ax.set_title("mismatch budget from training runs", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
