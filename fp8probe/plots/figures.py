"""matplotlib figures for the files fp8probe writes (headless: the Agg backend), and `plot_run`, which draws
every figure a run directory's files allow (`fp8probe plot RUN_DIR`).

Each figure function takes the data a file holds (a sensitivity table, recipe.json dicts, capacity.json, a
ladder table) and an optional path; it returns the figure, so a notebook shows it inline.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.records import AgreementRecord, CapacityRecord, CheckRecord, PlanRecord, RecipeRecord
from ..core.stats import spearman
from ..recipe.selection import group_scores, rank_groups

KIND_ORDER = ("q", "k", "v", "qkv", "o", "gate", "up", "gate_up", "down", "expert", "kv")
KIND_LABEL = {"kv": "KV cache", "expert": "experts"}


def capacity_bars(report: CapacityRecord, path: str | Path | None = None):
    """Bar chart of KV tokens and max concurrency, BF16 vs the candidate, from a capacity report."""
    plt = _plt()

    b, c = report.baseline, report.candidate
    labels = ["BF16, auto KV", f"{c['scheme'] or 'BF16'}, {c['kv_cache_dtype']} KV"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, key, title in (
        (axes[0], "kv_tokens", "KV-cache tokens"),
        (axes[1], "max_concurrency", f"max concurrency at {report.max_model_len:,} tokens"),
    ):
        vals = [b[key], c[key]]
        bars = ax.bar(labels, vals, color=["#888888", "#2b7bba"])
        ax.set_title(title, fontsize=10)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if key == "kv_tokens" else f"{v:.2f}x" for v in vals], fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.margins(y=0.15)
    fig.suptitle(
        f"{report.model_type}: x{report.ratio_kv_tokens:.2f} KV tokens "
        f"({report.gpu or 'fixed KV memory'}, vLLM's accounting)",
        fontsize=11,
    )
    fig.tight_layout()
    return _save(fig, path)


def plan_plot(plan, path: str | Path | None = None):
    """plan.json (a PlanRecord) as two panels: held-out quality against MODELLED wall-clock time per configuration
    (its curve's steps x its step time; with a calibration), and the ranking by time to target (refused ones named, no
    bar)."""
    plt = _plt()

    rows = plan.rows
    cal = plan.calibration
    with_curves = cal is not None and any(r.get("curve") for r in rows)
    fig, axes = plt.subplots(1, 2 if with_curves else 1, figsize=(11 if with_curves else 6.5, 4.2), squeeze=False)
    axes = axes[0]
    if with_curves:
        ax = axes[0]
        for r in rows:
            if r.get("curve"):
                hours = [s * r["step_s"] / 3600 for s in cal["steps"]]
                ax.plot(hours, r["curve"], marker=".", label=r["configuration"], lw=1.2)
        ax.axhline(cal["target"], color="k", ls=":", lw=1, label=f"target {cal['target']:.3g}")
        ax.set_xlabel("modelled wall-clock (h)")
        ax.set_ylabel(f"held-out quality ({cal['objective']}; lower is better)")
        ax.legend(fontsize=7)
        ax.set_title("learning curves against modelled time", fontsize=10)
    ax = axes[-1]
    ranked = sorted(rows, key=lambda r: (r["time_to_target_s"] is None, r["time_to_target_s"] or 0.0))
    names = [r["configuration"] for r in ranked][::-1]
    longest = max((r["time_to_target_s"] or 0.0) for r in rows)
    unit, per = ("h", 3600) if longest >= 3600 else ("min", 60)
    vals = [(r["time_to_target_s"] or 0.0) / per for r in ranked][::-1]
    bars = ax.barh(names, vals, color=["#2b7bba" if v else "#cccccc" for v in vals])
    ax.bar_label(bars, labels=[f"{v:.3g} {unit}" if v else "refused / not reached" for v in vals], fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel(f"modelled time to target ({unit})")
    ax.set_title("ranking", fontsize=10)
    ax.margins(x=0.25)
    fig.suptitle(f"{plan.model} on {plan.gpu} x{plan.tensor_parallel_size}: rollout throughput MODELLED", fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def sensitivity_heatmap(sensitivity, path: str | Path | None = None, metric: str = "kl_q_p"):
    """Blocks x unit kinds, colour = log10(metric), from a sensitivity.csv (or its DataFrame)."""
    import numpy as np
    import pandas as pd

    plt = _plt()

    df = sensitivity if isinstance(sensitivity, pd.DataFrame) else pd.read_csv(sensitivity)
    df = df[df["kind"] != "model"]
    table = df.pivot_table(index="kind", columns="block", values=metric, aggfunc="sum")
    order = [k for k in KIND_ORDER if k in table.index]
    table = table.loc[order]
    fig, ax = plt.subplots(figsize=(max(6, 0.28 * table.shape[1]), 0.4 * len(order) + 1.2))
    im = ax.imshow(np.log10(table.clip(lower=1e-12)), aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(order)), order)
    ax.set_xticks(range(table.shape[1]), table.columns, fontsize=7)
    ax.set_xlabel("decoder block")
    ax.set_ylabel("unit kind")
    ax.set_title(f"sensitivity of each unit in FP8: log10 {metric} (mean per response token)", fontsize=10)
    fig.colorbar(im, ax=ax, label=f"log10 {metric}")
    fig.tight_layout()
    return _save(fig, path)


def predicted_frontier(sensitivity, metric: str = "kl_q_p"):
    """(weight MiB saved, predicted mismatch) after each fused group along the recipe ranking, from (0, 0): the
    sum of group scores that `fp8probe recipe` starts its measured search from."""
    import numpy as np

    ranked = rank_groups(group_scores(sensitivity, metric))
    saved = np.cumsum([0] + [g.bytes_saved for g in ranked]) / 2**20
    return saved, np.cumsum([0] + [g.score for g in ranked])


def dose_curve(budget):
    """(mismatch, averaged loss, (band low, band high) or None) of a budget's noise-ruler fit, or None (isotonic)."""
    import numpy as np

    if budget.method != "benchmark dose" or not budget.dose_response:
        return None
    pts = budget.dose_response["rulers"]["noise"].get("curve") or []
    if not pts:
        return None
    x = np.array([p["mismatch"] for p in pts])
    y = np.array([p["loss"] for p in pts])
    band = None
    if all(p["band"] for p in pts):
        band = (np.array([p["band"][0] for p in pts]), np.array([p["band"][1] for p in pts]))
    return x, y, band


def budget_fit(budget, path: str | Path | None = None):
    """Quality loss against mismatch for the runs behind a budget (paired with each seed's mismatch-free run when
    the budget was), each level's mean loss with its interval, the fit (the dose–response curve with its band, or
    the isotonic fit), the budget and the tolerance."""
    import pandas as pd

    plt = _plt()

    df = pd.DataFrame(budget.runs)
    higher = str(df.get("higher_is_better", pd.Series(["true"])).iloc[0]).lower() in ("true", "1")
    clean = df[df["mismatch"] == 0]
    base = (
        df["seed"].map(dict(zip(clean["seed"], clean["quality"])))
        if budget.paired
        else pd.Series(clean["quality"].mean(), index=df.index)
    )
    loss = ((base - df["quality"]) if higher else (df["quality"] - base)) / base.abs()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    left = df["mismatch"][df["mismatch"] > 0].min() / 3
    x = df["mismatch"].where(df["mismatch"] > 0, left)
    ax.scatter(
        x,
        100 * loss,
        s=12,
        alpha=0.5,
        label=f"runs ({'paired' if budget.paired else 'unpaired'}; mismatch 0 at the left edge)",
    )
    curve = dose_curve(budget)
    if curve is not None:
        cx, cy, band = curve
        ax.plot(cx, 100 * cy, color="black", linewidth=1, label="dose–response fit (model average)")
        if band is not None:
            ax.fill_between(cx, 100 * band[0], 100 * band[1], color="black", alpha=0.1, label="its 90 % band")
    if budget.levels:
        lx = [lv["mismatch"] or left for lv in budget.levels]
        if curve is None:
            ax.plot(lx, [100 * lv["fitted"] for lv in budget.levels], color="black", linewidth=1, label="isotonic fit")
        for xv, lv in zip(lx, budget.levels):
            if lv["loss_interval"]:
                ax.plot([xv, xv], [100 * v for v in lv["loss_interval"]], color="tab:blue", linewidth=2, alpha=0.6)
    ax.axhline(100 * budget.tolerance, color="grey", linestyle=":", label=f"tolerance {100 * budget.tolerance:g} %")
    what = "benchmark dose" if budget.method == "benchmark dose" else "budget"
    ax.axvline(budget.value, color="tab:red", label=f"{what} {budget.value:.3g}")
    if budget.interval:
        ax.axvspan(*budget.interval, color="tab:red", alpha=0.12, label="90 % bootstrap interval")
    ax.set_xscale("log")
    ax.set_xlabel(f"rollout mismatch ({budget.metric}){': ' + 'as `check` measures it' if budget.dose else ''}")
    ax.set_ylabel(_loss_label(budget))
    ax.set_title("mismatch budget from training runs", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def _plt():
    """pyplot, headless (Agg) unless a notebook's inline backend is active (then its figures show inline)."""
    import matplotlib

    if "inline" not in matplotlib.get_backend():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path):
    if path is not None:
        fig.savefig(path, dpi=120)
        _plt().close(fig)
    return fig


def sensitivity_by_block(df, path: str | Path | None = None, metric: str = "kl_q_p"):
    """One line per unit kind across the blocks (log scale), the whole model in FP8 as a reference line."""
    plt = _plt()
    units = df[df["kind"] != "model"]
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for kind in [k for k in KIND_ORDER if k in set(units["kind"])]:
        rows = units[units["kind"] == kind].groupby("block")[metric].sum()
        ax.plot(
            rows.index,
            rows.clip(lower=1e-12),
            marker="o",
            markersize=3,
            linewidth=1.2,
            linestyle="--" if kind == "kv" else "-",
            label=KIND_LABEL.get(kind, kind),
        )
    whole = df[df["unit"] == "model.fp8_all"]
    if len(whole):
        ax.axhline(
            float(whole[metric].iloc[0]),
            color="black",
            linestyle=":",
            linewidth=1,
            label="every unit in FP8 (model.fp8_all)",
        )
    ax.set_yscale("log")
    ax.set_xlabel("decoder block")
    ax.set_ylabel(f"{metric} (mean per response token)")
    ax.set_title("sensitivity by block: one unit (or one layer's KV cache) in FP8 at a time", fontsize=10)
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def frontier(df, recipes: list, path: str | Path | None = None, metric: str = "kl_q_p"):
    """Weight bytes saved against mismatch: predicted (sum of group scores along the ranking) and every measured
    point of the recipe searches (on their search prompts), each chosen recipe marked there and, with a held-out
    split, at its held-out value with its interval; its budget as a line. `recipes`: (name, RecipeRecord) pairs."""
    plt = _plt()
    saved, pred = predicted_frontier(df, metric)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(saved[1:], pred[1:], color="grey", linewidth=1.2, label="predicted: sum of group scores, ranked")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, r) in enumerate(recipes):
        c = colors[i % len(colors)]
        pts = [
            (e["bytes_saved"] / 2**20, e["measured"])
            for e in r.search or []
            if e.get("bytes_saved") and e.get("measured") is not None and e["measured"] > 0
        ]
        if pts:
            ax.scatter(*zip(*pts), s=12, color=c, alpha=0.6, label=f"{name}: measured passes")
        found = r.measured_search or r.measured
        if found and r.bytes_saved:
            mib = r.bytes_saved / 2**20
            ax.scatter(
                [mib],
                [found],
                s=120,
                marker="*",
                color=c,
                edgecolor="black",
                zorder=5,
                label=f"{name}: chosen ({mib:.1f} MiB, {found:.3g} where searched)",
            )
            if r.measured_interval:  # its value on the held-out prompts, with the interval
                lo, hi = r.measured_interval
                ax.errorbar(
                    [mib],
                    [r.measured],
                    yerr=[[r.measured - lo], [hi - r.measured]],
                    fmt="D",
                    color=c,
                    markeredgecolor="black",
                    markersize=5,
                    capsize=3,
                    zorder=6,
                    label=f"{name}: held out {r.measured:.3g} [{lo:.3g}, {hi:.3g}]",
                )
        if r.budget is not None:
            ax.axhline(r.budget, color=c, linestyle="--", linewidth=1, label=f"{name}: budget {r.budget:g}")
    ax.set_yscale("log")
    ax.set_xlabel("weight MiB saved (BF16 -> FP8)")
    ax.set_ylabel(f"{metric} (mean per response token)")
    ax.set_title("budget frontier: what each MiB costs in mismatch", fontsize=10)
    ax.legend(fontsize=6.5, loc="lower right")
    fig.tight_layout()
    return _save(fig, path)


def token_kl(df, path: str | Path | None = None, top: int = 8):
    """The per-token KL(q||p) distribution (p50, p90, p99, max) of the most sensitive measured units and of the
    whole model in FP8: is a unit's mismatch spread thin or a few tokens' worth?"""
    import numpy as np

    plt = _plt()
    exact = df[df["method"] == "exact"] if "method" in df.columns else df
    units = exact[exact["kind"] != "model"].sort_values("kl_q_p", ascending=False).head(top)
    rows = list(units.itertuples())
    rows += list(exact[exact["unit"] == "model.fp8_all"].itertuples())
    stats = [("kl_p50", "p50"), ("kl_p90", "p90"), ("kl_p99", "p99"), ("kl_max", "max")]
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(rows))
    w = 0.2
    for j, (col, label) in enumerate(stats):
        vals = [max(getattr(r, col), 1e-12) for r in rows]
        ax.bar(x + (j - 1.5) * w, vals, w, label=label)
    names = [r.unit.replace("model.layers.", "L").replace("self_attn.", "").replace("mlp.", "") for r in rows]
    ax.set_xticks(x, names, rotation=35, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("per-token KL(q||p)")
    ax.set_title("per-token KL distribution: most sensitive units vs every unit in FP8", fontsize=10)
    ax.legend(fontsize=7, title="over response tokens", title_fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def fast_vs_exact(estimate: dict, exact: dict, path: str | Path | None = None, rho: float | None = None):
    """The fast estimate against the exact value, one point per row, log-log with the diagonal."""
    import numpy as np

    plt = _plt()
    keys = [k for k in estimate if k in exact and estimate[k] > 0 and exact[k] > 0]
    if rho is None:
        rho = spearman([estimate[k] for k in keys], [exact[k] for k in keys])
    e = np.array([exact[k] for k in keys])
    f = np.array([estimate[k] for k in keys])
    fig, ax = plt.subplots(figsize=(5, 4.6))
    kv = np.array(["kv_cache" in k for k in keys])
    ax.scatter(e[~kv], f[~kv], s=12, label="units")
    if kv.any():
        ax.scatter(e[kv], f[kv], s=12, marker="s", label="KV-cache layers")
    lo, hi = min(e.min(), f.min()), max(e.max(), f.max())
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle=":", label="estimate = exact")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("exact kl_q_p (measured)")
    ax.set_ylabel("fast estimate (fisher)")
    ax.set_title(f"fast vs exact: Spearman rho = {rho:.3f} over {len(keys)} rows", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def ladder_plot(df, path: str | Path | None = None, metric: str = "kl_q_p", budget: float | None = None):
    """Every rollout shortcut on one mismatch scale (noise ladder, recipes, KV cache, staleness), the budget line."""
    plt = _plt()
    d = df.sort_values(metric)
    colors = {"noise": "#999999", "recipe": "#2b7bba", "kv": "#e08214", "stale": "#7b3294", "combination": "#1a9850"}
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(d) + 1.4))
    ax.barh(range(len(d)), d[metric].clip(lower=1e-12), color=[colors.get(k, "#444444") for k in d["kind"]])
    ax.set_yticks(range(len(d)), [_short_source(x) for x in d["source"]], fontsize=7)
    ax.set_ylabel("rollout shortcut")
    if budget is not None:
        ax.axvline(budget, color="tab:red", linestyle="--", label=f"budget {budget:.3g}")
        ax.legend(fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel(f"{metric} (mean per response token)")
    ax.set_title("the mismatch ladder: every rollout shortcut on one scale", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def _short_source(name: str) -> str:
    """ "recipe runs/x/kl_q_p-0.008/recipe.yaml" -> "recipe kl_q_p-0.008": the directory names the recipe."""
    parts = name.split(" ", 1)
    if len(parts) == 2 and parts[1].endswith(".yaml"):
        p = Path(parts[1])
        return f"{parts[0]} {p.parent.name if p.name == 'recipe.yaml' and p.parent.name else p.stem}"
    return name


# ---------------------------------------------------------------------------------------------------
# every figure a run directory allows


def plot_run(run_dir: str | Path, out: str | Path | None = None, fmt: str = "png") -> dict[str, Path]:
    """Draw every figure the files in run_dir (and the directories below it) allow; returns name -> file.

    sensitivity.csv: by block, heatmap, per-token KL; + recipe.json files: the budget frontier; kl_fisher
    next to exact rows (--method auto) or agreement.json with its exact sweep: fast vs exact; capacity.json: KV
    capacity; plan.json: the plan; ladder.csv (+ check.json or budget.json beside it): the mismatch ladder;
    runs.csv beside budget-<objective>.json: the calibration; a budget.json `fp8probe budget` wrote: its fit. Every
    figure found in a directory below run_dir is named after it (_name): one rule, one place."""
    import pandas as pd

    from ..sweeps.files import read_sweep

    d = Path(run_dir)
    if not d.is_dir():
        raise FP8ProbeError(f"no such run directory: {run_dir}")
    out = Path(out) if out is not None else d / "plots"
    todo = _budget_figures(d)  # (name, fn(path))
    if (d / "sensitivity.csv").exists():
        df = read_sweep(d).table
        todo += [
            ("sensitivity_by_block", lambda p: sensitivity_by_block(df, p)),
            ("sensitivity_heatmap", lambda p: sensitivity_heatmap(df, p)),
        ]
        if (df["method"] == "exact").any():
            todo.append(("token_kl", lambda p: token_kl(df, p)))
        recipes = recipes_of(d)
        if recipes:
            todo.append(("frontier", lambda p: frontier(df, recipes, p)))
        pair = fast_exact_pair(d, df)
        if pair:
            todo.append(("fast_vs_exact", lambda p: fast_vs_exact(*pair, p)))
    for cap in sorted(d.rglob("capacity.json")):
        report = CapacityRecord.read(cap, "run `fp8probe capacity` again")
        todo.append((_name("capacity", cap, d), lambda p, r=report: capacity_bars(r, p)))
    for plan in sorted(d.rglob("plan.json")):
        record = PlanRecord.read(plan, "run `fp8probe plan` again")
        todo.append((_name("plan", plan, d), lambda p, r=record: plan_plot(r, p)))
    for lad in sorted(d.rglob("ladder.csv")):
        table = pd.read_csv(lad)
        todo.append((_name("ladder", lad, d), lambda p, t=table, b=_budget_beside(lad): ladder_plot(t, p, budget=b)))
    if not todo:
        raise FP8ProbeError(
            f"{run_dir} holds none of the files fp8probe plots (sensitivity.csv, recipe.json, "
            "capacity.json, ladder.csv, plan.json, budget.json, runs.csv); pass a directory "
            "written by fp8probe"
        )
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, fn in todo:
        path = out / f"{name}.{fmt}"
        fn(path)
        written[name] = path
    return written


def _name(stem: str, f: Path, root: Path) -> str:
    rel = f.parent.relative_to(root)
    return stem if str(rel) == "." else f"{stem}-{'-'.join(rel.parts)}"


def _budget_figures(d: Path) -> list:
    """(name, draw) for the budgets below `d`: a calibration (runs.csv beside budget-<objective>.json) as one
    figure with every objective's runs, fitted curve and band; a `fp8probe budget` directory as its fit."""
    import pandas as pd

    from ..budget.fit import read_budget

    out = []
    for runs in sorted(d.rglob("runs.csv")):
        budgets = {f.stem.split("-", 1)[1]: read_budget(str(f)) for f in sorted(runs.parent.glob("budget-*.json"))}
        if budgets:
            out.append(
                (
                    _name("calibration", runs, d),
                    lambda p, t=pd.read_csv(runs, dtype={"level": str}), b=budgets: calibration_plot(t, p, budgets=b),
                )
            )
    for f in sorted(d.rglob("budget.json")):
        if (f.parent / "runs.csv").exists():
            continue
        try:
            b = read_budget(str(f))
        except FP8ProbeError:  # not one `fp8probe budget` wrote (a number beside a ladder, say): no fit to draw
            continue
        if b.runs:
            out.append((_name("budget", f, d), lambda p, b=b: budget_fit(b, p)))
    return out


def recipes_of(d: Path) -> list[tuple[str, RecipeRecord]]:
    """(name, record) of the recipe.json files below the run directory made from its sweep, named by their directory."""
    out = []
    for f in sorted(d.rglob("recipe.json")):
        r = RecipeRecord.read(f, "run `fp8probe recipe` again")
        # the sweep is absolute, or relative to the recipe's directory (shipped recipes)
        if r.sweep and (f.parent / r.sweep).resolve() != d.resolve():
            continue
        out.append((f.parent.name if f.parent != d else "recipe", r))
    return out


def fast_exact_pair(d: Path, df):
    """(estimate, exact) by row, when the run has both: exact rows of --method auto, or agreement.json's exact sweep."""
    from ..sweeps.files import read_sweep

    agreement = d / "agreement.json"
    if agreement.exists():
        other = Path(AgreementRecord.read(agreement, "run the fast sweep again").exact_sweep or "")
        if (other / "sensitivity.csv").exists():
            ex = read_sweep(other).table
            units = df[df["kind"] != "model"]
            return dict(zip(units["unit"], units["kl_fisher"])), dict(zip(ex["unit"], ex["kl_q_p"]))
    both = df[(df["method"] == "exact") & (df["kind"] != "model")]
    both = both[[not math.isnan(v) for v in both["kl_fisher"]]]
    if len(both) >= 3:
        return dict(zip(both["unit"], both["kl_fisher"])), dict(zip(both["unit"], both["kl_q_p"]))
    return None


def _budget_beside(f: Path) -> float | None:
    """The budget a ladder's line is drawn at: the check's (check.json) or the budget's own (budget.json) beside it."""
    from ..budget.fit import Budget

    for record in (CheckRecord, Budget):
        p = f.parent / record.KIND
        if p.exists():
            try:
                value = record.read(p, "").budget if record is CheckRecord else record.read(p, "").value
            except FP8ProbeError:  # a line is drawn where a file allows it; the ladder is drawn either way
                continue
            if isinstance(value, (int, float)):
                return float(value)
    return None


OBJECTIVE_COLORS = {"opd": "tab:blue", "grpo": "tab:orange", "grpo-is": "tab:green", "grpo-bypass": "tab:red"}


def calibration_plot(
    runs,
    path: str | Path | None = None,
    budgets: dict | None = None,
    marks=(),
    quality: str = "quality",
    curves: dict | None = None,
):
    """Left: each run's paired quality loss (its rise over its own seed's mismatch-free run, %) against the measured
    rollout mismatch, per objective (symlog x: level 0 at 0): the runs, the level means with their paired-bootstrap
    intervals, the tolerance, each objective's budget with its interval, configurations measured elsewhere marked.
    Right: held-out quality along training for the first objective, one line per level (mean over seeds)."""
    plt = _plt()
    budgets = budgets or {}
    fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(12, 4.6) if curves else (6.5, 4.6), squeeze=False)
    ax = axes[0][0]
    objectives = list(dict.fromkeys(runs["objective"])) if "objective" in runs else ["opd"]
    for obj in objectives:
        d = runs[runs["objective"] == obj] if "objective" in runs else runs
        color = OBJECTIVE_COLORS.get(obj, "tab:purple")
        b = budgets.get(obj)
        ax.scatter(d["mismatch"], 100 * _run_losses(d, b), s=10, color=color, alpha=0.35)
        if b is not None and b.levels:
            xs = [lv["mismatch"] for lv in b.levels]
            ys = [100 * lv["loss"] for lv in b.levels]
            lo = [100 * (lv["loss"] - (lv["loss_interval"] or [lv["loss"]] * 2)[0]) for lv in b.levels]
            hi = [100 * ((lv["loss_interval"] or [lv["loss"]] * 2)[1] - lv["loss"]) for lv in b.levels]
            lo_b, hi_b = b.interval or (b.value, b.value)
            ax.errorbar(
                xs,
                ys,
                yerr=[lo, hi],
                color=color,
                marker="o",
                capsize=3,
                ls="none" if dose_curve(b) else "-",
                label=f"{obj}: budget {b.value:.3g} [{lo_b:.3g}, {hi_b:.3g}]",
            )
            curve = dose_curve(b)
            if curve is not None:
                cx, cy, band = curve
                ax.plot(cx, 100 * cy, color=color, linewidth=1.2)
                if band is not None:
                    ax.fill_between(cx, 100 * band[0], 100 * band[1], color=color, alpha=0.12)
            ax.axvspan(lo_b, hi_b, color=color, alpha=0.08)
            ax.axvline(b.value, color=color, linewidth=1.2)
        for lv in (b.other_levels or []) if b is not None else []:  # other sources: shown, not fitted
            li = lv["loss_interval"] or [lv["loss"]] * 2
            ax.errorbar(
                [lv["mismatch"]],
                [100 * lv["loss"]],
                yerr=[[100 * (lv["loss"] - li[0])], [100 * (li[1] - lv["loss"])]],
                color=color,
                marker="X",
                markersize=9,
                capsize=3,
                ls="none",
            )
            ax.annotate(
                f"{obj} {lv['level']}",
                (lv["mismatch"], 100 * lv["loss"]),
                fontsize=7,
                color=color,
                xytext=(4, 4),
                textcoords="offset points",
            )
    tol = next((b.tolerance for b in budgets.values() if b.tolerance is not None), None)
    if tol is not None:
        ax.axhline(100 * tol, color="tab:red", linestyle="--", linewidth=1, label=f"tolerance {100 * tol:.3g} %")
    ax.axhline(0, color="grey", linewidth=0.6)
    positive = [v for v in [*runs["mismatch"], *(m for _, m in marks)] if v > 0]
    ax.set_xscale("symlog", linthresh=min(positive) / 2 if positive else 1e-4)
    ax.set_xlim(left=0)
    top = ax.get_ylim()[1]
    for label, value in marks:
        inside = [o for o, b in budgets.items() if value <= b.value]
        ax.axvline(value, color="black", linestyle=":", linewidth=0.8)
        ax.annotate(
            f"{label}{' (' + ', '.join(inside) + ')' if inside else ''}",
            (value, top),
            rotation=90,
            fontsize=6.5,
            va="top",
            ha="right",
            xytext=(-2, -4),
            textcoords="offset points",
        )
    first = next(iter(budgets.values()), None)
    ax.set_xlabel(
        "dose: the level's KL(q‖p) as `check` measures it on the student before training"
        if first is not None and first.dose
        else "measured rollout mismatch, mean per-token KL(q‖p)"
    )
    ax.set_ylabel(_loss_label(first))
    ax.set_title("quality loss vs rollout mismatch (each run against its seed's twin)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    if curves:
        _learning_curves(axes[0][1], runs, curves, objectives[0], quality)
    fig.tight_layout()
    return _save(fig, path)


def _run_losses(d, budget):
    """Each run's loss on the budget's response against its own seed's mismatch-free run (the scatter; the level
    means and intervals are the budget's own)."""
    if budget is None or budget.response != "gain" or "quality_start" not in d:
        return d["paired_loss"]
    twin = d[d["kind"] == "none"].set_index("seed")["quality"]
    q0 = d["seed"].map(twin)
    return (q0 - d["quality"]) / (q0 - d["quality_start"])


def _loss_label(budget) -> str:
    if budget is not None and budget.response == "gain":
        return "loss: share of the training gain lost vs the twin (%)"
    return "relative quality loss vs the mismatch-free run (%)"


def _learning_curves(ax, runs, curves: dict, objective: str, quality: str) -> None:
    import pandas as pd

    plt = _plt()
    by_level: dict = {}
    for key, f in curves.items():
        obj, level = (key[0], key[1]) if len(key) == 3 else ("opd", key[0])
        if obj == objective and Path(f).exists():
            by_level.setdefault(level, []).append(pd.read_csv(f).set_index("step")["reverse_kl"])
    d = runs[runs["objective"] == objective] if "objective" in runs else runs
    order = list(dict.fromkeys(d.sort_values("mismatch")["level"]))
    cmap = plt.get_cmap("viridis")
    for i, level in enumerate(order):
        if level in by_level:
            mean = pd.concat(by_level[level], axis=1).mean(axis=1)
            m = d[d["level"] == level]["mismatch"].iloc[0]
            ax.plot(
                mean.index,
                mean.values,
                marker=".",
                color=cmap(i / max(len(order) - 1, 1)),
                label=f"level {level} (KL {m:.2g})",
            )
    ax.set_xlabel("training step")
    ax.set_ylabel(quality if len(quality) < 40 else "held-out reverse KL to the teacher")
    ax.set_title(f"{objective}: held-out learning curves (mean over seeds)", fontsize=10)
    ax.legend(fontsize=7)
