"""How many runs a calibration would need for its budget's interval to reach a width: a MODELLED projection.

    python benchmarks/budget_projection.py recipes/smollm2-135m/calibration/budget-opd.json --runs 13 40 80 160 \
        [--draws 20] [--ratio 3] [--out runs/projection.json]

The fitted budget is taken as the truth: its averaged dose–response curve, its variance components (the seed effect,
the twins' and the perturbed runs' own noise), its ladder of noise levels and seeds, and the σ → dose map of its runs
table. Each draw runs the package's own calibration procedure (training.experiment.Ladder, as
benchmarks/budget_coverage.py does) on synthetic runs from that truth, with `max_runs` allocated runs, and records
the interval's width BMDU / BMDL. The median width (and the share of draws at or below --ratio) per run budget says
what more runs would buy if the fitted curve and noise were the truth; it is a model, not a measurement: the real
runs' curve may differ, and its own interval says how much.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np


def truth_of(budget) -> tuple:
    """(the averaged curve as a function of the dose, the components, the scale) of a budget.json's noise ruler."""
    from fp8probe.budget.families import MODELS

    noise = budget.dose_response["rulers"]["noise"]
    scale = noise["scale"]
    models = [(MODELS[m["name"]], m["params"], m["weight"]) for m in noise["models"] if m["weight"] > 0]

    def curve(d):
        u = np.asarray(d, dtype=float) / scale
        return sum(w * fam.f(u, *p) for fam, p, w in models)

    return curve, noise["components"], scale


def main():
    from fp8probe.budget.fit import read_budget
    from fp8probe.training.experiment import Experiment, Ladder
    from fp8probe.training.settings import TrainSettings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("budget", help="a budget.json written by calibrate (its runs and fit)")
    ap.add_argument("--runs", type=int, nargs="+", default=[13, 40, 80])
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--bootstrap", type=int, default=300)
    ap.add_argument("--ratio", type=float, default=3.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    b = read_budget(args.budget)
    curve, comp, _ = truth_of(b)
    runs = [r for r in b.runs if r.get("kind") in ("none", "noise")]
    doses = {float(r["value"]): float(r["mismatch"]) for r in runs if r.get("kind") == "noise"}
    levels = ("0", *sorted({str(r["level"]) for r in runs if r.get("kind") == "noise"}, key=float))
    start = float(runs[0]["quality_start"])
    twins = [float(r["quality"]) for r in runs if r.get("kind") == "none"]
    m0 = float(np.mean(twins))
    gain = start - m0
    xs, ys = np.log(sorted(doses)), np.log([doses[s] for s in sorted(doses)])

    def dose(level) -> float:
        if level.kind != "noise":
            return 0.0
        x = math.log(level.value)
        i = int(np.clip(np.searchsorted(xs, x), 1, len(xs) - 1))
        return float(math.exp(ys[i - 1] + (x - xs[i - 1]) * (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])))

    def run(draw, level, seed):
        lv = int(round((level.value or 0.0) * 1e6))
        u = np.random.default_rng([3, draw, seed]).normal(0, math.sqrt(comp["seed"]))
        sd = math.sqrt(comp["twin"] if level.kind == "none" else comp["run"])
        e = np.random.default_rng([5, draw, seed, lv]).normal(0, sd)
        q = m0 + u + e + float(curve(dose(level))) * gain  # lower is better: a loss raises the quality score
        return {
            "objective": "opd",
            "level": level.name,
            "kind": level.kind,
            "value": level.value,
            "scheme": None,
            "seed": seed,
            "steps": 20,
            "seconds": 0.0,
            "mismatch": {"kl_q_p": dose(level), "k3": 0.0, "tokens": 1},
            "quality_start": {"reverse_kl": start, "teacher_logp": 0.0},
            "quality_end": {"reverse_kl": q, "teacher_logp": 0.0},
            "quality": {"auc": q, "final": q, "plateau": q, "late_improvement": 0.0},
            "losses": [],
        }

    out = {
        "budget": str(args.budget),
        "modelled": "the fitted curve and components taken as the truth",
        "truth_bmd": b.value,
        "levels": levels,
        "components": comp,
        "rows": [],
    }
    print(
        f"truth: the fitted curve (BMD {b.value:.3g}), components {comp['seed']:.3g} / {comp['twin']:.3g} / "
        f"{comp['run']:.3g}; levels {', '.join(levels)}; 3 seeds, {args.draws} draws per run budget"
    )
    for n in args.runs:
        widths = []
        for draw in range(args.draws):
            cal = Experiment(
                None,
                "projected",
                levels,
                3,
                TrainSettings(),
                ("a",),
                ("b",),
                max_added=0,
                max_runs=n,
                tolerance=b.tolerance,
            )
            ladder = Ladder(
                cal,
                lambda o, level, seed, d=draw: run(d, level, seed),
                lambda o, level: {"dose": dose(level)},
                bootstrap=args.bootstrap,
            )
            _, got, _ = ladder.objective("opd")
            lo, hi = got.interval or (math.nan, math.nan)
            widths.append(math.inf if got.interval_censored or got.censored or lo <= 0 else hi / lo)
        w = np.array(widths)
        row = {
            "allocated_runs": n,
            "median_width": float(np.median(w)),
            "share_at_ratio": float(np.mean(w <= args.ratio)),
            "widths": [x if math.isfinite(x) else None for x in widths],
        }
        out["rows"].append(row)
        print(
            f"  {n:>4} allocated runs: median BMDU/BMDL x{row['median_width']:.3g}, "
            f"{row['share_at_ratio']:.0%} of draws at or below x{args.ratio:g}",
            flush=True,
        )
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
