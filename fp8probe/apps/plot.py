"""`fp8probe plot`: every figure a run directory's files allow (plots/, reading only the files the commands write)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.results import Result


def run_plot(run_dir, out=None, fmt: str = "png") -> PlotResult:
    """`fp8probe plot`: every figure the files of `run_dir` allow."""
    from ..plots import plot_run

    written = plot_run(run_dir, out, fmt, extra=budget_figures(Path(run_dir)))
    return PlotResult(next(iter(written.values())).parent, written)


@dataclass(frozen=True)
class PlotResult(Result):
    figures: dict  # figure name -> its file

    def describe(self, seconds: float) -> str:
        return f"plot: {len(self.figures)} figures ({', '.join(self.figures)}) -> {self.out}"


def budget_figures(d: Path) -> list:
    """(name, draw) for the budgets below `d`: a calibration (runs.csv beside budget-<objective>.json) as one
    figure with every objective's runs, fitted curve and band; a `fp8probe budget` directory as its fit."""
    import pandas as pd

    from ..budget.fit import read_budget
    from ..core.errors import FP8ProbeError
    from ..plots import budget_fit, calibration_plot

    if not d.is_dir():
        return []
    out = []
    for runs in sorted(d.rglob("runs.csv")):
        budgets = {f.stem.split("-", 1)[1]: read_budget(str(f)) for f in sorted(runs.parent.glob("budget-*.json"))}
        if budgets:
            rel = runs.parent.relative_to(d)
            name = "calibration" if str(rel) == "." else f"calibration-{'-'.join(rel.parts)}"
            out.append((name, lambda p, t=pd.read_csv(runs, dtype={"level": str}), b=budgets:
                        calibration_plot(t, p, budgets=b)))
    for f in sorted(d.rglob("budget.json")):
        if (f.parent / "runs.csv").exists():
            continue
        try:
            b = read_budget(str(f))
        except FP8ProbeError:  # not one `fp8probe budget` wrote (a number beside a ladder, say): no fit to draw
            continue
        if b.runs:
            rel = f.parent.relative_to(d)
            name = "budget" if str(rel) == "." else f"budget-{'-'.join(rel.parts)}"
            out.append((name, lambda p, b=b: budget_fit(b, p)))
    return out
