"""matplotlib figures for the files fp8probe writes (headless: the Agg backend)."""

from __future__ import annotations

from pathlib import Path


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
