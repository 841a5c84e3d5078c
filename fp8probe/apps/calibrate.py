"""`fp8probe calibrate`: the mismatch budget calibrated with short training runs at known rollout mismatch, paired
by seed (the experiment: budget/experiment.py; one run: budget/runs.py; the fit: budget/fit.py).

    fp8probe calibrate [--teacher T] [--student S|pruned[:K]] --out DIR [--objectives opd grpo grpo-is]
                       [--levels ...] [--seeds N] [--tolerance 0.02] [--quality auc|final] [--bracket 2]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..budget.experiment import Experiment, calibrate, check_resume, prepare, read_marks
from ..core.results import Result
from .budget import fit_lines, interval_words

__all__ = ["run_calibrate", "CalibrateResult", "prepare", "Experiment"]


def run_calibrate(calibration: Experiment, out, resume: bool = False, device: str = "cpu", progress: bool = True,
                  marks=(), log=None) -> CalibrateResult:
    """`fp8probe calibrate`: every run, runs.csv, the budgets and calibration.png in `out` (calibrate()), after
    TRL, the marks and the resume state are checked; a failure keeps the finished runs for `resume`."""
    from ..budget.opd import require_trl
    from ..core.files import check_writable, output_dir

    require_trl()
    read_marks(marks)
    out = check_writable(out)
    check_resume(out, calibration, resume)
    with output_dir(out, keep=("runs",)) as d:
        summary = calibrate(calibration, d, device=device, progress=progress, marks=marks, log=log)
    return CalibrateResult(out, summary, calibration)


@dataclass(frozen=True)
class CalibrateResult(Result):
    summary: dict  # the runs table, the budgets, the levels added, the runs allocated, the ratios
    calibration: Experiment

    def describe(self, seconds: float) -> str:
        return _describe(self.summary, self.calibration, self.out, seconds)


def _describe(res: dict, calibration: Experiment, out, seconds: float) -> str:
    """What `fp8probe calibrate` prints: per objective, each level's measured mismatch, quality and paired loss, the
    plateau check, then its budget with its interval and the seeds' spread."""
    df = res["runs"]
    lines = [f"calibrate: {len(df)} runs ({', '.join(calibration.objectives)}; {calibration.seeds} seeds per level) "
             f"in {seconds / 60:.0f} min -> {out}"]
    for objective, b in res["budgets"].items():
        d = df[df["objective"] == objective]
        lines.append(f"{objective}: quality = {calibration.quality} of the held-out reverse KL; levels added: "
                     f"{', '.join(res['added'][objective]) or 'none'}")
        for lv in b.levels:
            rows = d[(d["mismatch"] - lv["mismatch"]).abs() <= 1e-12 * max(1.0, lv["mismatch"])]
            lo, hi = lv["loss_interval"] or (math.nan, math.nan)
            lines.append(f"  level {rows['level'].iloc[0]:<10} mismatch kl_q_p {lv['mismatch']:<10.4g} quality "
                         f"{rows['quality'].mean():.4f}   paired loss {lv['loss']:+.2%} [{lo:+.2%}, {hi:+.2%}]")
        for lv in b.other_levels or []:
            lo, hi = lv["loss_interval"] or (math.nan, math.nan)
            lines.append(f"  level {lv['level']:<10} mismatch kl_q_p {lv['mismatch']:<10.4g} quality "
                         f"{d[d['level'] == lv['level']]['quality'].mean():.4f}   paired loss {lv['loss']:+.2%} "
                         f"[{lo:+.2%}, {hi:+.2%}]  ({lv['kind']}: shown, not fitted)")
        clean = d[d["kind"] == "none"]
        lo, hi = b.interval or (math.nan, math.nan)
        late = clean['late_improvement'].mean()
        lines.append(f"  mismatch-free runs: the last fifth of training improved them {late:.1%}"
                     f" on average; the seeds alone spread {b.seed_spread or 0:.1%}")
        lines.append(f"  budget: kl_q_p <= {b.value:.4g} (90 % {interval_words(b)} {lo:.4g} .. {hi:.4g}, x"
                     f"{hi / lo if lo > 0 else math.inf:.2g}) at a relative quality loss <= {b.tolerance:g} -> "
                     f"{Path(out) / f'budget-{objective}.json'}")
        lines += fit_lines(b)
        spent = res.get("allocated", {}).get(objective)
        if spent and spent["runs"]:
            where = "; ".join(f"{x['level']} seeds {', '.join(map(str, x['seeds']))}" for x in spent["seeds"])
            lines.append(f"  runs added where they narrow the interval most: {spent['runs']} ({where}) in "
                         f"{spent['hours']:.2f} h; stopped: {spent.get('stopped', 'done')}")
    for r in res.get("ratios", []):
        if r["ratio"] is not None:
            lo, hi = r["interval"] or (math.nan, math.nan)
            lines.append(f"{r['objective']} tolerates {r['ratio']:.2g}x the mismatch {r['other']} does (benchmark "
                         f"doses, 90 % paired over {r['seeds']} seeds: {lo:.2g} .. {hi:.2g})")
    return "\n".join(lines)
