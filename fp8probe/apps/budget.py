"""`fp8probe budget`: the mismatch budget read off a table of training runs (budget/fit.py), from the table alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..budget.fit import FITS, fit_budget
from ..core.results import Result
from ..core.settings import Settings, opt


@dataclass(frozen=True)
class BudgetSettings(Settings):
    """How a budget is read off a runs table: the relative quality loss accepted, the bootstrap behind its interval,
    and which objective's runs (a table with several)."""

    tolerance: float = opt(0.02, "largest relative quality loss accepted (your choice)", low=0.0)
    bootstrap: int = opt(1000, "bootstrap resamples for the interval", low=0)
    seed: int = opt(0, "seed of the resamples", low=0)
    objective: str | None = opt(None, "the objective whose runs to fit (a table with several: opd, grpo, grpo-is)")
    fit: str = opt("dose", "dose: the benchmark dose of fitted dose–response curves (the isotonic fit where none "
                   "fits); isotonic: the largest tested level whose isotonic fit stays within the tolerance",
                   choices=FITS)


def run_budget(runs, out, settings: BudgetSettings = BudgetSettings()) -> BudgetResult:
    """The budget fitted to a runs table (budget/fit.py), written as DIR/budget.json and DIR/budget.png."""
    from ..core.files import atomic_write_json, check_writable, output_dir
    from ..plots import budget_fit

    check_writable(out)
    b = fit_budget(runs, tolerance=settings.tolerance, bootstrap=settings.bootstrap, seed=settings.seed,
                   objective=settings.objective, fit=settings.fit)
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
    lo, hi = b.interval or (float("nan"), float("nan"))
    spread = f"; the seeds alone spread {b.seed_spread:.1%}" if b.seed_spread is not None else ""
    how = interval_words(b)
    lines = [f"budget: {b.metric} <= {b.value:.4g} (90 % {how} {lo:.4g} .. "
             f"{hi:.4g}, x{hi / lo if lo > 0 else float('inf'):.2g}) at a relative quality loss <= {b.tolerance:g}"
             f"{spread}, from {len(b.runs)} runs -> {out}/budget.json"]
    return "\n".join(lines + fit_lines(b))


def interval_words(b) -> str:
    """What the budget's interval is, in the printed line."""
    boot = f"{'paired ' if b.paired else ''}bootstrap"
    return f"interval ({boot} and parametric)" if b.method == "benchmark dose" else f"{boot} interval"


def fit_lines(b) -> list[str]:
    """How the budget was read: the benchmark dose's families (weight, lack-of-fit p, each one's dose), the other
    rulers, the levels read against the noise ruler, and beneficial low doses; or why the isotonic fit was used."""
    rulers = (b.dose_response or {}).get("rulers", {})
    noise = rulers.get("noise", {})
    if b.method != "benchmark dose":
        why = ("no dose–response family fits the noise levels (every lack-of-fit p < 0.1)" if noise.get("fits") is False
               else "asked for" if b.dose_response is None else "too few levels for a curve")
        return [f"  read off the isotonic fit: {why}"]
    families = ", ".join(f"{m['name']} w {m['weight']:.2f} p {_p(m['p'])} dose {m['bmd']:.3g}" for m in noise["models"])
    lines = [f"  benchmark dose of the averaged curve ({families})"]
    if noise.get("above_range") or noise.get("interval_censored"):
        lines.append(f"  the curve stays within the tolerance up to the highest tested mismatch ({noise['scale']:.3g}) "
                     f"{'at the estimate' if noise.get('above_range') else 'in some resamples'}: the upper end is "
                     "censored there")
    if noise.get("hormesis", {}).get("supported"):
        low = ", ".join(f"{x:.3g}" for x in noise["hormesis"]["levels"])
        lines.append(f"  beneficial low levels (loss interval below 0): {low}; the curve is fitted above them")
    for kind, r in rulers.items():
        if kind != "noise" and "bmd" in r:
            lo, hi = r["interval"] or (float("nan"), float("nan"))
            lines.append(f"  {kind} ruler: its own curve reaches the tolerance at {r['bmd']:.4g} [{lo:.4g}, {hi:.4g}]")
    for name, p in noise.get("predictions", {}).items():
        di = p["difference_interval"] or (float("nan"), float("nan"))
        lines.append(f"  {name} at {p['mismatch']:.4g}: the noise ruler predicts a loss of {p['predicted']:+.2%}; "
                     f"measured minus predicted [{di[0]:+.2%}, {di[1]:+.2%}]: {p['reading']}"
                     f"{' (beyond the tested levels: extrapolated)' if p['beyond_tested'] else ''}")
    return lines


def _p(p) -> str:
    return "untested" if p is None else f"{p:.2f}"
