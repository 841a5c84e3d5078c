"""`fp8probe budget`: the mismatch budget read off a table of training runs (budget/fit.py), from the table alone."""

from __future__ import annotations

from dataclasses import dataclass

from ..budget.fit import fit_budget
from ..core.settings import Settings, opt


@dataclass(frozen=True)
class BudgetSettings(Settings):
    """How a budget is read off a runs table: the relative quality loss accepted, the bootstrap behind its interval,
    and which objective's runs (a table with several)."""

    tolerance: float = opt(0.02, "largest relative quality loss accepted (your choice)", low=0.0)
    bootstrap: int = opt(1000, "bootstrap resamples for the interval", low=0)
    seed: int = opt(0, "seed of the resamples", low=0)
    objective: str | None = opt(None, "the objective whose runs to fit (a table with several: opd, grpo, grpo-is)")


def run_budget(runs, out, settings: BudgetSettings = BudgetSettings()):
    """The budget fitted to a runs table (budget/fit.py), written as DIR/budget.json and DIR/budget.png."""
    from ..core.files import atomic_write_json, check_writable, output_dir
    from ..plots import budget_fit

    check_writable(out)
    b = fit_budget(runs, tolerance=settings.tolerance, bootstrap=settings.bootstrap, seed=settings.seed,
                   objective=settings.objective)
    with output_dir(out) as d:
        atomic_write_json(d / "budget.json", b.to_json())
        budget_fit(b, d / "budget.png")
    return b


def describe_budget(b, out) -> str:
    lo, hi = b.interval or (float("nan"), float("nan"))
    spread = f"; the seeds alone spread {b.seed_spread:.1%}" if b.seed_spread is not None else ""
    return (f"budget: {b.metric} <= {b.value:.4g} (90 % {'paired ' if b.paired else ''}bootstrap interval {lo:.4g} .. "
            f"{hi:.4g}) at a relative quality loss <= {b.tolerance:g}{spread}, from {len(b.runs)} runs -> "
            f"{out}/budget.json")
