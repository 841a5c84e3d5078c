"""What a calibration's design can decide, before it trains: MODELLED from variance components, not measured.

A budget at 2 % of the training gain is read off paired runs whose losses spread far more than that: pair A's OPD
runs had a paired loss's standard deviation of 8 % of the gain (σ0² + σ1², the twin's and the perturbed run's own
noise, over the gain 3.21 nats), so one level's 90 % interval with three seeds is about ±23 % and showing that one
level lost less than 2 % takes over a hundred paired seeds. `fp8probe calibrate` prints this before its first run,
for the tolerance asked and two others, so a user sizes the runs to the tolerance or the tolerance to the runs:

    one level      the half-width of a level's 90 % loss interval at the planned seeds (Student-t, paired by
                   seed), and the seeds at which a level that truly lost nothing is shown within the tolerance 9
                   times in 10 (t_0.95 + z_0.9 standard errors below it)
    the budget     the median BMDU / BMDL of `draws` budgets fitted by the package's own fit_budget (bootstrap
                   `bootstrap`) to synthetic tables at the planned doses and seeds, drawn from the same random-effect
                   model (a seed effect shared by a seed's runs, the twin's and the runs' own noise) under a linear
                   truth that reaches the tolerance at the ladder's middle dose (geometric mean of the planned
                   non-zero doses); and the runs a x3 interval would take: the same simulated at 4 and 16 times the
                   seeds, then the square-root law (runs x (ln width / ln 3)²) from the largest run count whose width
                   was finite and above 3: the allocation's preset budget to ask for

The components come from a pilot (a budget.json of the same student and objective, `--pilot`) or, without one, from
pair A's OPD calibration (PAIR_A_OPD; recipes/smollm2-135m/calibration/budget-opd.json), said in the printed line.
The full procedure (adaptive ladder, allocation, every refit) is benchmarks/budget_projection.py's: slower, and what
the docs' figures come from; this is its quick stand-in before training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from ..core.stats import LEVEL


@dataclass(frozen=True)
class Components:
    """Variance components of a run's quality as shares of the training gain, squared (budget/design.py's σ_u², σ0²,
    σ1² over the gain²), and where they come from."""

    seed: float
    twin: float
    run: float
    source: str

    @property
    def sd_pair(self) -> float:
        """A paired loss's standard deviation on the gain scale (a run against its own twin: the seed cancels)."""
        return math.sqrt(self.twin + self.run)


# pair A's OPD calibration (budget-opd.json's noise ruler: σ_u² 0.0414, σ0² 0.0155, σ1² 0.0499 nats², the twins
# gaining 3.21 nats of held-out reverse KL)
PAIR_A_OPD = Components(
    0.0414 / 3.21**2, 0.0155 / 3.21**2, 0.0499 / 3.21**2, "pair A's OPD calibration (recipes/smollm2-135m)"
)


def components_of(budget) -> Components | None:
    """A pilot budget's components on the gain scale (its noise ruler's, over its twins' mean gain), None when it
    records none."""
    import numpy as np

    noise = ((budget.dose_response or {}).get("rulers") or {}).get("noise") or {}
    comp = noise.get("components")
    twins = [r for r in budget.runs or [] if r.get("kind") == "none"]
    if not comp or not twins:
        return None
    gain = abs(float(np.mean([r["quality_start"] - r["quality"] for r in twins])))
    if not gain > 0:
        return None
    g2 = gain**2
    name = f"the pilot {budget.source}"
    return Components(comp["seed"] / g2, comp["twin"] / g2, comp["run"] / g2, name)


def level_halfwidth(c: Components, seeds: int, level: float = LEVEL) -> float:
    """The half-width of one level's loss interval over `seeds` paired runs (Student-t)."""
    from scipy import stats

    if seeds < 2:
        return math.inf
    return float(stats.t.ppf((1 + level) / 2, seeds - 1)) * c.sd_pair / math.sqrt(seeds)


def seeds_to_show(c: Components, tolerance: float, level: float = LEVEL, power: float = 0.9) -> int:
    """Paired seeds at which a level that truly lost nothing has its interval's upper end within `tolerance` 9 times
    in 10: the least n with (t_{(1+level)/2, n-1} + z_power) x sd / sqrt(n) <= tolerance."""
    from scipy import stats

    z = NormalDist().inv_cdf(power)
    n = 2
    while (stats.t.ppf((1 + level) / 2, n - 1) + z) * c.sd_pair / math.sqrt(n) > tolerance and n < 100_000:
        n += 1
    return n


def modelled_width(c: Components, doses, seeds: int, tolerance: float, draws: int = 24, bootstrap: int = 100, seed=0):
    """The median BMDU / BMDL of `draws` budgets fitted to synthetic runs at `doses` (the non-zero planned doses) with
    `seeds` seeds each and their twins, under a linear truth reaching `tolerance` at the doses' geometric middle; and
    how many runs a x3 interval would take. A draw whose upper end is censored counts as unbounded (inf)."""
    import numpy as np
    import pandas as pd

    from .fit import fit_budget
    from .settings import BudgetSettings

    doses = sorted(d for d in doses if d > 0)
    middle = math.exp(np.mean(np.log(doses)))
    slope = tolerance / middle
    rng = np.random.default_rng(seed)
    start, gain = 2.0, 1.0  # quality before training and the twins' gain: the loss is on the gain scale
    widths = []
    for _ in range(draws):
        rows = []
        for s in range(seeds):
            u = rng.normal(0, math.sqrt(c.seed))
            rows.append(
                {
                    "level": "0",
                    "kind": "none",
                    "seed": s,
                    "mismatch": 0.0,
                    "quality": 1.0 + u + rng.normal(0, math.sqrt(c.twin)),
                }
            )
            for d in doses:
                loss = slope * d + rng.normal(0, math.sqrt(c.run))
                rows.append(
                    {"level": f"{d:g}", "kind": "noise", "seed": s, "mismatch": d, "quality": 1.0 + u + loss * gain}
                )
        table = pd.DataFrame(rows).assign(higher_is_better=False, quality_start=start)
        b = fit_budget(table, BudgetSettings(tolerance=tolerance, bootstrap=bootstrap, seed=int(rng.integers(1 << 30))))
        if not b.interval or b.interval[0] <= 0 or b.interval_censored or b.censored:
            widths.append(math.inf)
        else:
            widths.append(b.interval[1] / b.interval[0])
    width = float(np.median(widths))
    return {"median_width": width, "runs": seeds * (len(doses) + 1), "draws": draws, "truth_bmd": middle}


GROWTH = (1, 4, 16)  # the planned seeds times these: where the width is simulated to find what a x3 interval takes


def runs_for_x3(c: Components, doses, seeds: int, tolerance: float, draws: int = 12) -> dict:
    """The planned design's modelled width, and the runs a x3 interval takes: the design simulated at GROWTH times
    its seeds (stopping once the median width is at most 3), then the square-root law (runs x (ln width / ln 3)²)
    from the largest run count whose width was finite and above 3 (`from_runs`); the planned runs when they already
    reach x3; None when every width simulated was censored."""
    tried = []
    for g in GROWTH:
        w = modelled_width(c, doses, seeds * g, tolerance, draws=draws)
        tried.append({"runs": w["runs"], "median_width": w["median_width"]})
        if w["median_width"] <= 3:
            break
    if tried[0]["median_width"] <= 3:
        return {"runs_for_x3": tried[0]["runs"], "from_runs": tried[0]["runs"], "tried": tried}
    above = [t for t in tried if math.isfinite(t["median_width"]) and t["median_width"] > 3]
    if not above:
        return {"runs_for_x3": None, "from_runs": None, "tried": tried}
    base = max(above, key=lambda t: t["runs"])
    need = math.ceil(base["runs"] * (math.log(base["median_width"]) / math.log(3)) ** 2)
    return {"runs_for_x3": need, "from_runs": base["runs"], "tried": tried}


def sizing(c: Components, doses, seeds: int, tolerances, draws: int = 12) -> list[dict]:
    """Per tolerance: what one level and the whole design can decide (module docstring)."""
    out = []
    for tol in tolerances:
        x3 = runs_for_x3(c, doses, seeds, tol, draws=draws)
        planned = x3["tried"][0]
        out.append(
            {
                "tolerance": tol,
                "level_halfwidth": level_halfwidth(c, seeds),
                "seeds_to_show_a_level": seeds_to_show(c, tol),
                "median_width": planned["median_width"],
                "runs": planned["runs"],
                "draws": draws,
                **x3,
            }
        )
    return out


def sizing_lines(c: Components, seeds: int, rows: list[dict]) -> list[str]:
    """The printed lines: MODELLED, with their inputs."""
    head = (
        f"what this design can decide (MODELLED before training, from {c.source}: a paired loss's sd "
        f"{c.sd_pair:.1%} of the gain): one level's 90 % interval is ±{rows[0]['level_halfwidth']:.1%} with "
        f"{seeds} seeds"
    )
    lines = [head]
    for r in rows:
        width = "unbounded (censored)" if not math.isfinite(r["median_width"]) else f"x{r['median_width']:.3g}"
        if r["runs_for_x3"] is None:
            x3 = f"more than {r['tried'][-1]['runs']} runs (still censored there)"
        else:
            x3 = f"about {r['runs_for_x3']} runs (square-root law from {r['from_runs']})"
        lines.append(
            f"  at {r['tolerance']:.0%} of the gain: a level within it needs ~{r['seeds_to_show_a_level']} seeds; "
            f"the budget's interval {width} (median of {r['draws']} simulated fits of the planned {r['runs']} runs); "
            f"x3 needs {x3}"
        )
    return lines
