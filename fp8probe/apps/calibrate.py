"""`fp8probe calibrate`: the mismatch budget calibrated with short training runs at known rollout mismatch, paired
by seed (the experiment: training/experiment.py; one run: training/runs.py; the fit: budget/fit.py).

    fp8probe calibrate [--teacher T] [--student S|pruned[:K]] --out DIR [--objectives opd grpo grpo-is]
                       [--levels ...] [--seeds N] [--tolerance 0.02] [--quality auc|final] [--bracket 2]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..budget.words import budget_text, fit_lines, loss_words
from ..core.files import check_writable, output_dir
from ..core.results import Result
from ..training.experiment import Experiment, calibrate, check_resume, prepare, read_marks
from ..training.runs import QUALITY_NAME

__all__ = ["run_calibrate", "CalibrateResult", "prepare", "Experiment"]


def run_calibrate(
    calibration: Experiment,
    out,
    resume: bool = False,
    device: str = "cpu",
    progress: bool = True,
    marks=(),
    log=None,
    refit: bool = False,
) -> CalibrateResult:
    """`fp8probe calibrate`: every run, runs.csv, the budgets and calibration.png in `out` (calibrate()), after
    TRL, the marks and the resume state are checked; a failure keeps the finished runs for `resume`. With `refit`:
    the finished calibration in `out` refitted as this fp8probe reads budgets (every level's dose measured on check's
    scale, the response asked for), nothing trained but a stale level's first steps."""
    from ..plots import calibration_plot
    from ..training.experiment import read_experiment
    from ..training.opd import require_trl

    require_trl()
    marked = read_marks(marks)  # refused before any output; drawn on calibration.png
    out = check_writable(out)
    if refit:
        calibration = read_experiment(out, calibration.response)
    else:
        check_resume(out, calibration, resume)
    with output_dir(out, keep=("runs",)) as d:
        summary = calibrate(calibration, d, device=device, progress=progress, log=log)
        calibration_plot(
            summary["runs"],
            d / "calibration.png",
            budgets=summary["budgets"],
            marks=marked,
            quality=QUALITY_NAME,
            curves=summary["curves"],
        )
    return CalibrateResult(out, summary, calibration)


@dataclass(frozen=True)
class CalibrateResult(Result):
    summary: dict  # the runs table, the budgets, the levels added, the runs allocated, the ratios
    calibration: Experiment

    def describe(self, seconds: float) -> str:
        return _describe(self.summary, self.calibration, self.out, seconds)


def _describe(res: dict, calibration: Experiment, out, seconds: float) -> str:
    """What `fp8probe calibrate` prints: per objective, each level's dose (and the run-mean KL beside it), quality and
    loss, the plateau check, then its budget with its interval and the seeds' spread; the objectives' ratio."""
    df = res["runs"]
    seeds = df.groupby(["objective", "level"])["seed"].nunique()  # a refit's runs, not its settings' defaults
    span = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    lines = [
        f"calibrate: {len(df)} runs ({', '.join(res['budgets'])}; {span} seeds per level) "
        f"in {seconds / 60:.0f} min -> {out}"
    ]
    for objective, b in res["budgets"].items():
        d = df[df["objective"] == objective]
        lines.append(
            f"{objective}: quality = {calibration.quality} of the held-out reverse KL, loss = {b.response} "
            f"against the twin; levels added: {', '.join(res['added'][objective]) or 'none'}"
        )
        rows = [(lv, "") for lv in b.levels] + [
            (lv, f"  ({lv['kind']}: shown, not fitted)") for lv in b.other_levels or []
        ]
        for lv, note in rows:
            at = d[(d["mismatch"] - lv["mismatch"]).abs() <= 1e-12 * max(1.0, lv["mismatch"])]
            if "level" in lv:
                at = d[d["level"] == lv["level"]]
            lo, hi = lv["loss_interval"] or (math.nan, math.nan)
            run_mean = at["mismatch_run_mean"].iloc[0] if "mismatch_run_mean" in at else math.nan
            lines.append(
                f"  level {at['level'].iloc[0]:<16} dose {lv['mismatch']:<10.4g} (run-mean KL "
                f"{run_mean:<8.4g}) quality {at['quality'].mean():.4f}   loss {lv['loss']:+.2%} "
                f"[{lo:+.2%}, {hi:+.2%}]{note}"
            )
        clean = d[d["kind"] == "none"]
        late = clean["late_improvement"].mean()
        lines.append(
            f"  mismatch-free runs: the last fifth of training improved them {late:.1%}"
            f" on average; the seeds alone spread {b.seed_spread or 0:.1%}"
        )
        lines.append(
            f"  budget: kl_q_p {budget_text(b)} at {loss_words(b)} -> {Path(out) / f'budget-{objective}.json'}"
        )
        lines += fit_lines(b)
        spent = res.get("allocated", {}).get(objective)
        if spent and spent.get("runs"):
            where = "; ".join(f"{x['level']} seeds {', '.join(map(str, x['seeds']))}" for x in spent["seeds"])
            lines.append(
                f"  runs added where they narrow the interval most: {spent['runs']} ({where}) in "
                f"{spent['hours']:.2f} h; stopped: {spent.get('stopped', 'done')}"
            )
    for r in res.get("ratios", []):
        lines.append(ratio_line(r))
    return "\n".join(lines)


def ratio_line(r: dict) -> str:
    """How much more mismatch one objective tolerates than another, or why that cannot be said."""
    if r.get("ratio") is None:
        return f"{r['objective']} against {r['other']}: undetermined ({r.get('undetermined')})"
    lo, hi = r["interval"]
    low = f"< {lo:.2g}" if r.get("open_low") else f"{lo:.2g}"  # a censored end: the interval reaches past it
    high = f"> {hi:.2g}" if r.get("open_high") else f"{hi:.2g}"
    sigma = f"; on σ {r['sigma_ratio']:.2g}x" if r.get("sigma_ratio") else ""
    return (
        f"{r['objective']} tolerates {r['ratio']:.2g}x the dose {r['other']} does (benchmark doses, each on all "
        f"its runs; 90 % {low} .. {high}){sigma}"
    )
