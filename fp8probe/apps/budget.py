"""`fp8probe budget`: the mismatch budget read off a table of training runs (budget/fit.py), from the table alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..budget.design import PAIRINGS, RESPONSES
from ..budget.fit import FITS, fit_budget
from ..budget.words import budget_text, fit_lines, loss_words
from ..core.results import Result
from ..core.settings import Settings, opt


@dataclass(frozen=True)
class BudgetSettings(Settings):
    """How a budget is read off a runs table: the quality loss accepted (on the response), the bootstrap behind its
    interval, which objective's runs (a table with several), and the student they trained."""

    tolerance: float = opt(0.02, "largest quality loss accepted, on the response (your choice)", low=0.0)
    response: str = opt("gain", "a run's quality loss against its mismatch-free twin: gain (the share of what "
                        "training gained that the mismatch cost; needs a quality_start column) or relative",
                        choices=RESPONSES)
    pairing: str = opt("auto", "the baseline of a paired table: each seed's own twin (seed), the twins' mean (mean), "
                       "or whichever the variance components say is steadier (auto)", choices=("auto", *PAIRINGS))
    bootstrap: int = opt(1000, "bootstrap resamples for the interval", low=0)
    seed: int = opt(0, "seed of the resamples", low=0)
    objective: str | None = opt(None, "the objective whose runs to fit (a table with several: opd, grpo, grpo-is)")
    fit: str = opt("dose", "dose: the benchmark dose of fitted dose–response curves (the isotonic fit where none "
                   "fits); isotonic: the largest tested level whose isotonic fit stays within the tolerance",
                   choices=FITS)
    student: str | None = opt(None, "the student the runs trained (a model as every command takes it): recorded by "
                              "its content hash, so `check` refuses to judge another student against this budget")


def run_budget(runs, out, settings: BudgetSettings = BudgetSettings()) -> BudgetResult:
    """The budget fitted to a runs table (budget/fit.py), written as DIR/budget.json and DIR/budget.png."""
    from dataclasses import replace

    from ..core.files import atomic_write_json, check_writable, output_dir
    from ..plots import budget_fit

    check_writable(out)
    b = fit_budget(runs, tolerance=settings.tolerance, bootstrap=settings.bootstrap, seed=settings.seed,
                   objective=settings.objective, fit=settings.fit, response=settings.response,
                   pairing=settings.pairing)
    if settings.student:
        from ..model.identity import identity
        from ..model.student import load_student

        b = replace(b, student=identity(load_student(settings.student)))
    with output_dir(out) as d:
        atomic_write_json(d / "budget.json", b.to_json())
        budget_fit(b, d / "budget.png")
    return BudgetResult(Path(out), b)


@dataclass(frozen=True)
class BudgetResult(Result):
    budget: object  # budget.fit.Budget, budget.json

    def describe(self, seconds: float) -> str:
        return describe_budget(self.budget, self.out)


def describe_budget(b, out) -> str:
    spread = f"; the seeds alone spread {b.seed_spread:.1%}" if b.seed_spread is not None else ""
    lines = [f"budget: {b.metric} {budget_text(b)} at {loss_words(b)}{spread}, from {len(b.runs)} runs -> "
             f"{out}/budget.json"]
    return "\n".join(lines + fit_lines(b))
