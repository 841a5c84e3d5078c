"""OPD against RL where RL can break: the same rollout mismatch under on-policy distillation and under three GRPO
variants whose PPO ratio sees it, side by side along training.

    fp8probe calibrate --out runs/collapse --student pruned:3 --objectives opd grpo grpo-is grpo-bypass \
        --levels 0 0.1 0.2 --seeds 3 --steps 40 --iterations 2 --max-added 0
    python benchmarks/rl_collapse.py runs/collapse [--out runs/collapse/rl-collapse.png]

With `--iterations 2` every generation serves two optimisation steps, so the PPO ratio's anchor matters:

    grpo         anchored at the trainer's own log-probs at generation time: the mismatch is ignored (verl's "common
                 implementation mistake": π_old taken for the behaviour policy)
    grpo-is      the same ratio, each token weighted by min(π_old / q, 2): verl's decoupled token-level TIS
    grpo-bypass  anchored at the rollout's own log-probs q (verl's bypass mode): the clip at 1 ± 0.2 acts on π_θ / q
    opd          TRL's on-policy distillation (per-token reverse KL to the teacher over the full vocabulary)

Per objective and level, the mean over seeds of the held-out reverse KL to the teacher along training (the quality
every objective is read on), and per step the rollout batch's mismatch (kl_q_p), the GRPO reward, the policy's
entropy and the share of tokens the PPO clip cut. A collapse would show as a held-out curve that turns up and stays
up while its mismatch-free twin keeps falling, the reward falling, the entropy running away. The table gives each
run's quality (its held-out curve's mean over training, as calibrate scores it) against its own seed's twin on the
package's default response (`gain_loss`: the share of what the twin gained that the run lost, (q - q_twin) / (q_start
- q_twin)) and as the relative shortfall (`loss_vs_twin`), every seed's value, the rise of the curve over its last 10
steps from its best point, and the policy's entropy early and late (an entropy collapse: late / early below 0.1, run
by run, mismatch-free twins included). With n and m seeds per arm no permutation test of two arms can reach a
one-sided p below 1 / C(n + m, n): `comparable` says whether the arms' seeds could ever show a difference at 5 %.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

OBJECTIVES = ("opd", "grpo", "grpo-is", "grpo-bypass")
COLORS = {"opd": "tab:blue", "grpo": "tab:orange", "grpo-is": "tab:green", "grpo-bypass": "tab:red"}


def runs(root: Path) -> list[dict]:
    out = []
    for f in sorted(root.glob("runs/*/*/run.json")):
        r = json.loads(f.read_text())
        d = f.parent
        ev = pd.read_csv(d / "eval.csv")
        st = pd.read_csv(d / "steps.csv")
        out.append(
            {
                "objective": r["objective"],
                "level": r["level"],
                "seed": r["seed"],
                "eval": ev,
                "steps": st,
                "quality": r["quality"]["auc"],
                "copied": r.get("copied_from"),
            }
        )
    return out


def table(rs: list[dict]) -> pd.DataFrame:
    twins = {(r["objective"], r["seed"]): r["quality"] for r in rs if r["level"] == "0"}
    rows = []
    for r in rs:
        ev = r["eval"].set_index("step")["reverse_kl"]
        best = ev.loc[: ev.index.max() - 10].min()
        late = ev.loc[ev.index.max() - 10 :]
        t = twins.get((r["objective"], r["seed"]))
        s = r["steps"]
        start = float(ev.iloc[0])  # the held-out curve before training (step 0)
        entropy = s["entropy"] if "entropy" in s else None
        rows.append(
            {
                "objective": r["objective"],
                "level": r["level"],
                "seed": r["seed"],
                "quality": r["quality"],
                "gain_loss": (r["quality"] - t) / (start - t) if t and start != t else np.nan,
                "loss_vs_twin": (r["quality"] - t) / t if t else np.nan,
                "final": float(ev.iloc[-1]),
                "late_rise": float(late.max() - best),
                "kl_q_p": float(s["kl_q_p"].mean()) if "kl_q_p" in s else 0.0,
                "reward_last10": float(s["reward"].iloc[-10:].mean()) if "reward" in s else np.nan,
                "entropy_last10": float(s["entropy"].iloc[-10:].mean()) if "entropy" in s else np.nan,
                "clipped": float(s["clip_ratio/region_mean"].mean()) if "clip_ratio/region_mean" in s else np.nan,
                "entropy_first5": float(entropy.iloc[:5].mean()) if entropy is not None else np.nan,
                "entropy_collapsed": bool(
                    entropy is not None and entropy.iloc[-10:].mean() < 0.1 * entropy.iloc[:5].mean()
                ),
            }
        )
    return pd.DataFrame(rows)


def best_p(n: int, m: int) -> float:
    """The smallest one-sided p any permutation test of two arms of n and m runs can give: 1 / C(n + m, n)."""
    from math import comb

    return 1.0 / comb(n + m, n)


def per_seed(t: pd.DataFrame) -> str:
    """The markdown table docs/admission.md shows: every arm's per-seed losses on the default response, their mean,
    and whether any comparison with OPD at the same level could reach p < 0.05."""
    head = ["objective", "σ", "seeds", "share of the gain lost, per seed", "mean", "relative shortfall (mean)"]
    head += ["entropy late / early", "vs OPD at this σ"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (o, lv), g in t[t["level"] != "0"].groupby(["objective", "level"], sort=False):
        opd = t[(t["objective"] == "opd") & (t["level"] == lv)]
        each = ", ".join(f"{x:+.1%}" for x in g["gain_loss"])
        ratio = ", ".join(f"{a / b:.2f}" for a, b in zip(g["entropy_last10"], g["entropy_first5"]))
        if o == "opd":
            vs = "–"
        else:
            p = best_p(len(g), len(opd))
            vs = f"no comparison possible (best one-sided p {p:.2f})" if p >= 0.05 else f"testable (best p {p:.3f})"
        lines.append(
            f"| `{o}` | {lv} | {len(g)} | {each} | {g['gain_loss'].mean():+.1%} | {g['loss_vs_twin'].mean():+.1%} | "
            f"{ratio} | {vs} |"
        )
    collapsed = t[t["entropy_collapsed"]].drop_duplicates(["level", "seed", "quality"])  # twins shared by GRPO arms
    for _, r in collapsed.iterrows():
        lines.append(
            f"\nentropy collapse: `{r['objective']}` σ {r['level']} seed {r['seed']} (entropy "
            f"{r['entropy_first5']:.2f} in its first 5 steps, {r['entropy_last10']:.2f} in its last 10)"
        )
    return "\n".join(lines)


def figure(rs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({r["level"] for r in rs}, key=float)
    fig, axes = plt.subplots(3, len(levels), figsize=(4.2 * len(levels), 9), squeeze=False, sharey="row")
    for j, lv in enumerate(levels):
        for o in OBJECTIVES:
            sel = [r for r in rs if r["objective"] == o and r["level"] == lv]
            if not sel:
                continue
            ev = pd.concat([r["eval"].set_index("step")["reverse_kl"] for r in sel], axis=1).mean(axis=1)
            axes[0][j].plot(ev.index, ev.values, marker=".", color=COLORS[o], label=f"{o} ({len(sel)} seeds)")
            st = [r["steps"].set_index("step") for r in sel]
            if o != "opd" and all("reward" in s for s in st):
                rw = pd.concat([s["reward"] for s in st], axis=1).mean(axis=1).rolling(4, min_periods=1).mean()
                axes[1][j].plot(rw.index, rw.values, color=COLORS[o], label=o)
            if all("entropy" in s for s in st):
                en = pd.concat([s["entropy"] for s in st], axis=1).mean(axis=1).rolling(4, min_periods=1).mean()
                axes[2][j].plot(en.index, en.values, color=COLORS[o], label=o)
        axes[0][j].set_title(f"σ = {lv}" if lv != "0" else "no mismatch (σ = 0)", fontsize=10)
        axes[2][j].set_xlabel("optimizer step")
    axes[0][0].set_ylabel("held-out reverse KL to the teacher\n(lower is better; mean over seeds)")
    axes[1][0].set_ylabel("GRPO reward (teacher log-lik.;\nrolling mean of 4 steps)")
    axes[2][0].set_ylabel("policy entropy (rolling mean of 4)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        "pair A: the same rollout mismatch under OPD and under GRPO whose PPO ratio sees it "
        "(2 optimisation steps per generation)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a calibrate directory with the four objectives")
    ap.add_argument("--out", default=None, help="the figure (default: DIR/rl-collapse.png); the table beside it")
    args = ap.parse_args()
    root = Path(args.dir)
    rs = runs(root)
    t = table(rs)
    out = Path(args.out) if args.out else root / "rl-collapse.png"
    figure(rs, out)
    t.to_csv(out.with_suffix(".csv"), index=False)
    summary = t.groupby(["objective", "level"]).agg(
        seeds=("seed", "size"),
        quality=("quality", "mean"),
        gain_loss=("gain_loss", "mean"),
        loss_vs_twin=("loss_vs_twin", "mean"),
        loss_sd=("loss_vs_twin", "std"),
        final=("final", "mean"),
        late_rise=("late_rise", "max"),
        kl_q_p=("kl_q_p", "mean"),
        clipped=("clipped", "mean"),
        entropy=("entropy_last10", "mean"),
    )
    pd.set_option("display.width", 160)
    print(summary.round(4).to_string())
    print()
    print(per_seed(t.drop_duplicates(["objective", "level", "seed"])))
    print(f"-> {out}, {out.with_suffix('.csv')}")


if __name__ == "__main__":
    main()
