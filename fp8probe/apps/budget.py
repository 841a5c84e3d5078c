"""`fp8probe budget`: the mismatch budget read off a table of training runs (budget/fit.py), from the table alone."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..budget.fit import fit_budget
from ..budget.settings import BudgetSettings
from ..budget.words import budget_text, fit_lines, loss_words
from ..core.files import check_writable, output_dir
from ..core.results import Result


def run_budget(runs, out, settings: BudgetSettings = BudgetSettings()) -> BudgetResult:
    """The budget fitted to a runs table (budget/fit.py), written as DIR/budget.json and DIR/budget.png."""
    from ..plots import budget_fit

    check_writable(out)
    b = fit_budget(runs, settings)
    if settings.student:
        from ..model.identity import identity
        from ..model.student import load_student

        b = replace(b, student=identity(load_student(settings.student)))
    with output_dir(out) as d:
        b.write(d / b.KIND)
        budget_fit(b, d / "budget.png")
    return BudgetResult(Path(out), b)


@dataclass(frozen=True)
class BudgetResult(Result):
    budget: object  # budget.fit.Budget, budget.json

    def describe(self, seconds: float) -> str:
        return describe_budget(self.budget, self.out)


def describe_budget(b, out) -> str:
    spread = f"; the seeds alone spread {b.seed_spread:.1%}" if b.seed_spread is not None else ""
    lines = [
        f"budget: {b.metric} {budget_text(b)} at {loss_words(b)}{spread}, from {len(b.runs)} runs -> {out}/budget.json"
    ]
    return "\n".join(lines + fit_lines(b))
