"""`fp8probe budget`: the mismatch budget read off a table of training runs (budget/fit.py), from the table alone."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..budget.fit import fit_budget
from ..budget.settings import BudgetSettings
from ..budget.words import budget_text, fit_lines, loss_words
from ..core.errors import FP8ProbeError
from ..core.files import atomic_write_text, check_writable, output_dir
from ..core.results import Result
from ..training.verl_runs import VerlRunsSettings, verl_runs, verl_runs_table


def run_budget(
    runs, out, settings: BudgetSettings = BudgetSettings(), verl: VerlRunsSettings | None = None
) -> BudgetResult:
    """The budget fitted to a runs table (budget/fit.py), or to a user's verl runs (`verl.from_verl`: their
    file-logger JSONL, training/verl_runs.py; the table is written as DIR/runs.csv), written as DIR/budget.json and
    DIR/budget.png."""
    from ..plots import budget_fit

    check_writable(out)
    if (runs is None) == (verl is None or not verl.from_verl):
        raise FP8ProbeError("give either a runs table (RUNS) or verl runs (`from_verl`), not both or neither")
    configured = verl is not None and bool(verl.from_verl) and any(r.config for r in verl_runs(verl))
    if configured and not settings.student:
        raise FP8ProbeError(
            "`from_verl` runs with config= are dosed on check's scale on the student they trained: give `student`"
        )
    used = None
    student = None
    if settings.student:
        from ..model.student import load_student

        student = load_student(settings.student)
    with output_dir(out) as d:
        if runs is None:
            dose = _doses(student, d) if configured else None
            runs, used = verl_runs_table(verl, dose)
        b = fit_budget(runs, settings)
        if student is not None:
            from ..model.identity import identity

            b = replace(b, student=identity(student))
        if configured:
            from ..budget.fit import CHECK_SCALE
            from ..training.doses import HOW

            b = replace(b, dose=HOW, dose_scale=dict(CHECK_SCALE))
        if used is not None:
            atomic_write_text(d / "runs.csv", runs.to_csv(index=False))
        b.write(d / b.KIND)
        budget_fit(b, d / "budget.png")
    return BudgetResult(Path(out), b, used)


def _doses(student, d: Path):
    """configuration text -> its dose on check's scale on `student` (training/doses.py, kept in DIR/doses.json)."""
    from ..sources.sources import parse_source
    from ..training.doses import Doses

    doses = Doses(student, d / "doses.json")
    return lambda config: doses.dose("verl", parse_source(config))["dose"]


@dataclass(frozen=True)
class BudgetResult(Result):
    budget: object  # budget.fit.Budget, budget.json
    keys: str | None = None  # verl runs: the keys read, in words

    def describe(self, seconds: float) -> str:
        head = f"from verl's logs: {self.keys}\n" if self.keys else ""
        return head + describe_budget(self.budget, self.out)


def describe_budget(b, out) -> str:
    spread = f"; the seeds alone spread {b.seed_spread:.1%}" if b.seed_spread is not None else ""
    lines = [
        f"budget: {b.metric} {budget_text(b)} at {loss_words(b)}{spread}, from {len(b.runs)} runs -> {out}/budget.json"
    ]
    return "\n".join(lines + fit_lines(b))
