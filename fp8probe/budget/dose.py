"""The budget as a benchmark dose: one dose–response curve fitted to every run, averaged over model families.

A run's paired quality loss (fit.py) is the response, its level's measured mismatch the dose. Monotone families
with zero loss at zero mismatch (MODELS: linear, power, exponential, Hill, with BMDS's restrictions: power and Hill
exponents ≥ 1) are fitted to the level means by weighted least squares, each level weighted by its runs over its
own variance moderated toward the pooled one (three seeds that happen to agree cannot take all the weight). The
families are averaged with Akaike weights, exp(−ΔAIC/2) with AIC = χ² + 2k, as EPA's BMDS averages its models. The
benchmark dose (BMD) is where the averaged curve reaches the tolerance; its 90 % interval (BMDL, BMDU) comes from
the paired bootstrap over seeds (the same draw for every level; runs within a level when unpaired), each draw
refitting every family with the first fit's weights, the percentiles widened for few seeds (expanded), joined
with a parametric bootstrap's (_parametric: level means drawn about the averaged curve, t noise): at three or four
seeds the seed bootstrap alone spread 0.57-0.74x as wide as the estimate really does on synthetic runs (its few
distinct resamples), and the hull covers (tests/budget/test_dose.py). A BMD not reached
within the tested doses is censored at the highest one (`above_range`): no curve is extrapolated.

Goodness of fit: each family's lack-of-fit test, χ²/(L − k) against F(L − k, ν) (L levels, k parameters, ν the
degrees of freedom of the pooled variance; p ≥ 0.1 fits, BMDS's rule); a family with no degree left is not tested.
A ruler fits when some tested family fits, is untested (None) when none could be tested; when every tested family
fails, fit.py falls back to the isotonic fit.

Beneficial low doses (hormesis): a level whose loss interval lies wholly below zero is reported and left out of
the monotone fit, so the edge is fitted above it instead of a monotone curve being forced through it.

Implementation: scipy.optimize.least_squares (bounded trust-region), scipy.stats.f, scipy.optimize.brentq.
EPA's own `pybmds` (25.2) installs here and fits this data, but it fits the unpaired quality with a free
background (no paired losses, no paired bootstrap), and on the demo's pair A its BMDU failed (−9999) for every
model; the families and the averaging follow its documentation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

MAX_NFEV = 50  # evaluations per least-squares fit (a degenerate fit of two levels would take hundreds)
LEVEL = 0.90  # the BMD interval: (BMDL, BMDU) = its 5 % and 95 % bootstrap quantiles
FIT_P = 0.10  # a family fits when its χ² p-value is at least this (BMDS's default for continuous models)


@dataclass(frozen=True)
class Family:
    """A monotone dose–response family f(u; θ) on the scaled dose u = mismatch / highest tested mismatch, with
    f(0) = 0: its parameters' bounds and the starting points a fit tries."""

    name: str
    f: Callable
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    starts: Callable  # (u, y) -> list of starting parameter vectors
    formula: str

    @property
    def k(self) -> int:
        return len(self.lower)


def _np():
    import numpy as np

    return np


def _linear(u, b):
    return b * u


def _power(u, b, g):
    return b * _np().power(u, g)


def _exponential(u, c, b):
    return c * _np().expm1(b * u) / b  # c: the slope at zero, so a nearly linear curve stays well conditioned


def _hill(u, v, k, n):
    np = _np()
    un = np.power(u, n)
    return v * un / (np.power(k, n) + un)


def _top(u, y) -> float:
    return max(float(max(y)), 1e-6)


# the registry: every family the average may use (a family needs at least as many levels as parameters)
MODELS: dict[str, Family] = {f.name: f for f in (
    Family("linear", _linear, (0.0,), (math.inf,), lambda u, y: [[_top(u, y)]], "b·d"),
    Family("power", _power, (0.0, 1.0), (math.inf, 18.0), lambda u, y: [[_top(u, y), g] for g in (1.0, 2.0, 4.0)],
           "b·d^g (g ≥ 1)"),
    Family("exponential", _exponential, (0.0, 1e-3), (math.inf, 30.0),
           lambda u, y: [[_top(u, y) * b / math.expm1(b), b] for b in (0.5, 3.0, 10.0)], "c·(exp(b·d) − 1) / b"),
    Family("hill", _hill, (0.0, 1e-3, 1.0), (math.inf, 10.0, 18.0),
           lambda u, y: [[2 * _top(u, y), k, n] for k in (0.1, 0.5) for n in (1.0, 3.0)],
           "v·d^n / (k^n + d^n) (n ≥ 1)"),
)}


@dataclass(frozen=True)
class Fit:
    family: str
    params: tuple[float, ...]
    chi2: float
    dof: int
    p: float | None  # None: no degree of freedom left to test the fit

    @property
    def aic(self) -> float:
        return self.chi2 + 2 * MODELS[self.family].k

    @property
    def fits(self) -> bool | None:
        """Whether the χ² test accepts the fit; None when no degree of freedom is left to test it."""
        return None if self.p is None else self.p >= FIT_P


def ruler_fits(fits: list[Fit]) -> bool | None:
    """A ruler fits when some family passes its χ² test; None when no family could be tested (as few levels as
    parameters), False when every tested one fails."""
    tested = [f.fits for f in fits if f.fits is not None]
    return any(tested) if tested else None


def _p_value(chi2: float, dof: int, nu: float) -> float | None:
    """The lack-of-fit test: χ²/dof against F(dof, ν), ν the degrees of freedom of the variances the weights came
    from (estimated, not known: a χ² test would reject good fits from three seeds far too often)."""
    from scipy.stats import chi2 as chi2_dist
    from scipy.stats import f as f_dist

    if dof <= 0:
        return None
    return float(f_dist.sf(chi2 / dof, dof, nu)) if nu > 0 else float(chi2_dist.sf(chi2, dof))


def fit_family(family: Family, u, y, se, starts=None, nu: float = 0.0) -> Fit | None:
    """Weighted least squares of `family` to the level means `y` (standard errors `se`, from variances of `nu`
    degrees of freedom) at scaled doses `u`; the best of its starting points (or `starts`); None when the levels
    are too few for its parameters."""
    from scipy.optimize import least_squares

    np = _np()
    if len(u) < family.k:
        return None
    if family.name == "linear":  # closed form: the weighted least-squares slope, held at zero from below
        w = 1 / se ** 2
        b = max(0.0, float(np.sum(w * u * y) / np.sum(w * u * u)))
        chi2 = float(np.sum(((b * u - y) / se) ** 2))
        dof = len(u) - 1
        return Fit("linear", (b,), chi2, dof, _p_value(chi2, dof, nu))
    best = None
    for x0 in (starts or family.starts(u, y)):
        x0 = np.clip(np.asarray(x0, dtype=float), family.lower, [min(h, 1e6) for h in family.upper])
        try:
            r = least_squares(lambda th: (family.f(u, *th) - y) / se, x0, bounds=(family.lower, family.upper),
                              method="trf", ftol=1e-7, xtol=1e-7, max_nfev=MAX_NFEV)
        except (ValueError, FloatingPointError):
            continue
        if np.isfinite(r.cost) and (best is None or r.cost < best.cost):
            best = r
    if best is None:
        return None
    chi2 = float(2 * best.cost)
    dof = len(u) - family.k
    return Fit(family.name, tuple(float(t) for t in best.x), chi2, dof, _p_value(chi2, dof, nu))


def akaike_weights(fits: list[Fit]) -> list[float]:
    best = min(f.aic for f in fits)
    w = [math.exp(-(f.aic - best) / 2) for f in fits]
    return [x / sum(w) for x in w]


def averaged(fits: list[Fit], weights: list[float], u):
    np = _np()
    u = np.asarray(u, dtype=float)
    return sum(w * MODELS[f.family].f(u, *f.params) for f, w in zip(fits, weights))


def benchmark_dose(fits: list[Fit], weights: list[float], tolerance: float) -> tuple[float, bool]:
    """The scaled dose at which the averaged curve reaches `tolerance`, and whether it does within the tested
    doses (u ≤ 1); when it does not, 1 (censored at the highest tested dose)."""
    from scipy.optimize import brentq

    def g(u):
        return float(averaged(fits, weights, u)) - tolerance

    if g(1.0) < 0:
        return 1.0, False
    if g(0.0) >= 0:
        return 0.0, True
    return float(brentq(g, 0.0, 1.0, xtol=1e-10)), True


def _fit_all(u, y, se, nu: float, starts: dict | None = None) -> list[Fit]:
    out = []
    for name, fam in MODELS.items():
        f = fit_family(fam, u, y, se, [starts[name]] if starts and name in starts else None, nu)
        if f is not None:
            out.append(f)
    return out


def _level_stats(losses: dict, levels: list[float]):
    """Each level's mean loss, its standard error and the variances' degrees of freedom. A level's variance is its
    own spread moderated toward the pooled one, each weighted by its degrees of freedom ((ν s² + ν_p s_p²) / (ν +
    ν_p), as limma moderates gene-wise variances): three seeds that happen to agree cannot take all the weight."""
    np = _np()
    values = [np.array(list(losses[lv].values()), dtype=float) for lv in levels]
    nu = np.array([len(v) - 1 for v in values], dtype=float)
    spread = np.array([v.var(ddof=1) if len(v) > 1 else 0.0 for v in values])
    nu_p = float(nu.sum())
    pooled = float((nu * spread).sum() / nu_p) if nu_p > 0 else 0.0
    var = (nu * spread + nu_p * pooled) / np.maximum(nu + nu_p, 1e-12)
    var = np.maximum(var, max(pooled, 1e-12) * 1e-3)
    se = np.sqrt(var / np.array([len(v) for v in values]))
    return np.array([v.mean() for v in values]), se, nu_p


def draws(losses: dict, paired: bool, n: int, seed: int) -> list[dict]:
    """`n` bootstrap tables {level: {key: loss}}: seeds resampled together (paired: the same draw for every level,
    a seed's runs stay together) or runs within each level (unpaired). Draw keys are positions, so a seed drawn
    twice counts twice.

    Paired draws are stratified by level: every level keeps as many runs as it has, from its own seeds. A level with
    m of the K seeds takes the draw's first m slots; a slot holding a seed it has keeps it, a slot holding one it
    lacks (the allocation adds seeds to some levels only) takes one of its own seeds instead, uniformly, so each of
    its runs is drawn with probability 1/K + (K − m)/K · 1/m = 1/m, and levels with the same seeds take the same
    replacements (they stay paired). A draw over all seeds alone lost whole levels (19 of 1,000 draws on pair A once
    8 allocated runs made the seeds unequal) and drew the levels with fewer seeds with fewer runs. Where every level
    has every seed this is the plain paired draw, unchanged."""
    np = _np()
    rng = np.random.default_rng(seed)
    fill = np.random.default_rng([seed, 1])  # the replacements: a stream of their own, so balanced draws are unchanged
    seeds = sorted({s for d in losses.values() for s in d})
    owns = {lv: tuple(sorted(d)) for lv, d in losses.items()}  # each level's own seeds
    out = []
    for _ in range(n):
        if paired:
            pick = list(rng.choice(seeds, size=len(seeds), replace=True))
            instead: dict = {}  # (the level's seeds, slot) -> its replacement, shared by levels with the same seeds
            table = {}
            for lv, d in losses.items():
                own = owns[lv]
                slots = []
                for i, s in enumerate(pick[:len(own)]):
                    if s not in d and (own, i) not in instead:
                        instead[own, i] = own[int(fill.integers(len(own)))]
                    slots.append(s if s in d else instead[own, i])
                table[lv] = {i: d[s] for i, s in enumerate(slots)}
            out.append(table)
        else:
            out.append({lv: dict(enumerate(rng.choice(list(d.values()), size=len(d), replace=True)))
                        for lv, d in losses.items()})
    return out


def expanded(point: float, interval: list[float] | None, groups: int, top: float) -> list[float] | None:
    """The percentile interval widened about the point by core/stats.expansion (few seeds: sqrt(n / (n − 1)) x t / z,
    2.17 at three seeds), on the log scale a dose lives on, so the low end stays above zero; the high end stays
    within the tested doses (`top`), as the BMD itself does."""
    from ..core.stats import expansion

    if interval is None or point <= 0 or interval[0] <= 0:
        return interval
    e = expansion(groups, LEVEL)
    if not math.isfinite(e):
        return None
    return [point * (interval[0] / point) ** e, min(point * (interval[1] / point) ** e, max(top, interval[1]))]


def _quantiles(v) -> list[float] | None:
    np = _np()
    return [float(np.quantile(v, (1 - LEVEL) / 2)), float(np.quantile(v, (1 + LEVEL) / 2))] if len(v) else None


def _hormesis(losses: dict, levels: list[float], boot: list[dict]) -> list[float]:
    """The lowest levels, in a row, whose loss interval (the bootstrap's) lies wholly below zero."""
    np = _np()
    beneficial = []
    for lv in levels:
        means = [float(np.mean(list(t[lv].values()))) for t in boot if lv in t]
        if not (means and np.quantile(means, (1 + LEVEL) / 2) < 0):
            break
        beneficial.append(lv)
    return beneficial


def fit_ruler(losses: dict, levels: list[float], tolerance: float, boot: list[dict],
              predict_at: dict[str, float] | None = None, groups: int | None = None) -> dict:
    """One ruler's dose–response fit: `losses` {level: {seed: loss}} (0.0 the mismatch-free level), `levels` its
    non-zero levels, `boot` the bootstrap tables (draws()); `predict_at` {name: mismatch} where to read the
    averaged curve off (other sources' levels), with its bootstrap band and the paired difference to that level's
    own loss when it has one; `groups` the seeds (or runs per level) the bootstrap resamples, for the small-sample
    widening of the BMD's interval (expanded; None: the plain percentiles). Returns the ruler's record for
    budget.json ("fits": False when no family fits)."""
    np = _np()
    levels = sorted(lv for lv in levels if lv > 0 and lv in losses)
    out: dict = {"levels": levels, "fits": False}
    if not levels:
        return out
    beneficial = _hormesis(losses, levels, boot)
    out["hormesis"] = {"levels": beneficial, "supported": bool(beneficial),
                       "note": ("loss interval wholly below zero at these levels: fitted above them" if beneficial
                                else "no level's loss interval lies wholly below zero")}
    fitted_levels = levels[len(beneficial):]
    if not fitted_levels:
        return out
    scale = max(fitted_levels)
    u = np.array(fitted_levels) / scale
    y, se, nu = _level_stats(losses, fitted_levels)
    fits = _fit_all(u, y, se, nu)
    if not fits:
        return out
    weights = akaike_weights(fits)
    bmd_u, reached = benchmark_dose(fits, weights, tolerance)
    grid = np.unique(np.concatenate([np.geomspace(min(fitted_levels) / 4, scale, 60), fitted_levels]))
    res = _resample(fits, fitted_levels, u, se, nu, tolerance, boot, grid / scale,
                    {k: (x, x / scale) for k, x in (predict_at or {}).items()})
    bmds = [b * scale for b in res["bmds"]]
    curves = res["curves"]
    out.update({
        "fits": ruler_fits(fits), "scale": float(scale), "fitted_levels": fitted_levels,
        "bmd": float(bmd_u * scale), "percentile_interval": _quantiles(bmds), "above_range": not reached,
        "interval": expanded(float(bmd_u * scale), _quantiles(bmds), groups, scale) if groups else _quantiles(bmds),
        "bootstrap": len(bmds),
        "models": [{"name": f.family, "formula": MODELS[f.family].formula, "params": list(f.params),
                    "aic": f.aic, "weight": w, "chi2": f.chi2, "dof": f.dof, "p": f.p, "fits": f.fits,
                    "bmd": benchmark_dose([f], [1.0], tolerance)[0] * scale} for f, w in zip(fits, weights)],
        "fitted": {str(lv): float(averaged(fits, weights, lv / scale)) for lv in levels},
        "curve": [{"mismatch": float(x), "loss": float(averaged(fits, weights, x / scale)),
                   "band": _quantiles(curves[:, i]) if len(curves) else None} for i, x in enumerate(grid)],
    })
    sims = _parametric(fits, weights, u, se, nu, tolerance, len(boot), seed=len(levels))
    out["parametric_interval"] = _quantiles([x * scale for x in sims])
    if out["interval"] and out["parametric_interval"]:  # the hull: the seed bootstrap alone is too narrow at 3-4 seeds
        out["interval"] = [min(out["interval"][0], out["parametric_interval"][0]),
                           max(out["interval"][1], out["parametric_interval"][1])]
    out["interval_censored"] = bool(out["interval"]) and out["interval"][1] >= scale * (1 - 1e-9)
    out["draws"] = [b * scale for b in res["aligned"]]  # not written: fit.py pops it (bmd_ratio pairs two rulers)
    if predict_at:
        out["predictions"] = {name: _prediction(losses, x, float(averaged(fits, weights, x / scale)), scale,
                                                res["predictions"][name], groups)
                              for name, x in predict_at.items()}
    return out


def _resample(fits, fitted_levels, u, se, nu, tolerance, boot, grid_u, predict_u: dict) -> dict:
    """Every bootstrap table refitted: its BMD (scaled; `aligned` keeps NaN where a draw could not be fitted, so two
    rulers' draws pair up), the averaged curve on `grid_u`, and (predicted loss, the level's own loss) at each
    `predict_u` (name -> (its mismatch, scaled))."""
    np = _np()
    starts = {f.family: list(f.params) for f in fits}
    bmds, curves, aligned = [], [], []
    predictions = {k: [] for k in predict_u}
    for t in boot:
        aligned.append(math.nan)
        if not all(lv in t for lv in fitted_levels):
            continue
        fb = _fit_all(u, np.array([np.mean(list(t[lv].values())) for lv in fitted_levels]), se, nu, starts)
        if not fb:
            continue
        wb = akaike_weights(fb)
        bmds.append(benchmark_dose(fb, wb, tolerance)[0])
        aligned[-1] = bmds[-1]
        curves.append(averaged(fb, wb, grid_u))
        for name, (x, xu) in predict_u.items():
            own = t.get(x)
            predictions[name].append((float(averaged(fb, wb, xu)),
                                      float(np.mean(list(own.values()))) if own else math.nan))
    return {"bmds": bmds, "aligned": aligned, "predictions": predictions,
            "curves": np.array(curves) if curves else np.zeros((0, len(grid_u)))}


def _prediction(losses: dict, x: float, predicted: float, scale: float, pairs: list, groups: int | None) -> dict:
    """The noise ruler read at another source's level `x`: its predicted loss and interval, and measured − predicted
    (paired by draw, widened about the point for few seeds as the BMD's interval is) with what it says."""
    from ..core.stats import expansion

    np = _np()
    pairs = np.array(pairs) if pairs else np.zeros((0, 2))
    diff = pairs[:, 1] - pairs[:, 0] if len(pairs) and np.isfinite(pairs[:, 1]).all() else []
    di = _quantiles(diff)
    if di is not None and groups and x in losses:
        point = float(np.mean(list(losses[x].values()))) - predicted
        e = expansion(groups, LEVEL)
        di = [point - e * (point - di[0]), point + e * (di[1] - point)]
    return {"mismatch": float(x), "predicted": predicted,
            "predicted_interval": _quantiles(pairs[:, 0]) if len(pairs) else None,
            "beyond_tested": bool(x > scale), "difference_interval": di,
            "reading": (None if di is None else "as the ruler predicts" if di[0] <= 0 <= di[1]
                        else "costs more than the ruler predicts" if di[0] > 0
                        else "costs less than the ruler predicts")}


def _parametric(fits: list[Fit], weights: list[float], u, se, nu: float, tolerance: float, n: int,
                seed: int = 0) -> list[float]:
    """The parametric bootstrap's benchmark doses (scaled): level means drawn about the averaged curve with their
    standard errors, the noise Student-t with the pooled variance's degrees of freedom (an estimated variance),
    every family refitted and averaged again."""
    np = _np()
    rng = np.random.default_rng(seed)
    mean = averaged(fits, weights, u)
    starts = {f.family: list(f.params) for f in fits}
    out = []
    for _ in range(n):
        noise = rng.standard_t(nu, size=len(u)) if nu > 0 else rng.standard_normal(len(u))
        fb = _fit_all(u, mean + np.asarray(se) * noise, se, nu, starts)
        if fb:
            out.append(benchmark_dose(fb, akaike_weights(fb), tolerance)[0])
    return out


def _jacobian(family: Family, u, params, h: float = 1e-6):
    """∂f/∂θ at the doses `u` (rows) by central differences, each step relative to its parameter."""
    np = _np()
    u = np.atleast_1d(np.asarray(u, dtype=float))
    cols = []
    for i, t in enumerate(params):
        step = h * max(abs(t), 1e-3)
        up, dn = list(params), list(params)
        up[i], dn[i] = t + step, t - step
        cols.append((family.f(u, *up) - family.f(u, *dn)) / (2 * step))
    return np.stack(cols, axis=1)


def bmd_variance(fits: list[Fit], weights: list[float], u, information, bmd_u: float) -> float:
    """The delta method's variance of the benchmark dose (scaled) for a design: `information` the weight (runs /
    variance) of each scaled dose in `u`. Each family's var f̂(BMD) = gᵀ (JᵀWJ)⁻¹ g over its slope there squared,
    averaged with the Akaike weights (the spread between families does not change with the design)."""
    np = _np()
    total = 0.0
    for fit, a in zip(fits, weights):
        fam = MODELS[fit.family]
        J = _jacobian(fam, u, fit.params)
        g = _jacobian(fam, [bmd_u], fit.params)[0]
        step = 1e-6 * max(bmd_u, 1e-3)  # df/du at the BMD, by the same central difference as _jacobian's
        slope = float((fam.f(np.asarray([bmd_u + step]), *fit.params) - fam.f(np.asarray([bmd_u - step]),
                                                                             *fit.params))[0] / (2 * step))
        cov = np.linalg.pinv(J.T @ (np.asarray(information)[:, None] * J))
        total += a * float(g @ cov @ g) / max(slope * slope, 1e-300)
    return total


NEW_LEVEL_FACTOR = 1.5  # a new level at the BMD only when no tested level lies within this factor of it


def binding(ruler: dict | None) -> tuple[str, str] | None:
    """What decides a ruler's interval width (fit_ruler's record): (part, side), side "low" or "high" the hull's
    wider side on the log scale about the BMD, part "seed" when the seed bootstrap's end is the hull's there,
    "parametric" when the parametric bootstrap's is; None without both intervals."""
    if not ruler or not ruler.get("interval") or not ruler.get("parametric_interval") or not ruler.get("bmd"):
        return None
    (lo, hi), (plo, phi), b = ruler["interval"], ruler["parametric_interval"], ruler["bmd"]
    if lo <= 0 or math.log(b / lo) >= math.log(hi / b):
        return ("seed" if lo < plo else "parametric"), "low"
    return ("seed" if hi > phi else "parametric"), "high"


TAIL_DRAWS = 300  # the seed bootstrap's draws the allocation reads the tail off
TAIL = 0.10  # the share of those draws, on the binding side, that make the tail


def _tail_shifts(losses: dict, levels: list[float], fits, u, se, nu: float, tolerance: float, side: str):
    """Per level, how many of its standard errors its resampled mean sits away, in the seed bootstrap's draws that
    make the binding tail (the TAIL of draws with the lowest BMD for side "low", the highest for "high"), from
    where it sits in the other draws; None when too few draws could be fitted."""
    np = _np()
    boot = draws({lv: d for lv, d in losses.items() if lv == 0 or lv in levels}, True, TAIL_DRAWS, seed=len(levels))
    bmds = np.array(_resample(fits, levels, u, se, nu, tolerance, boot, u[:1], {})["aligned"])
    ok = np.isfinite(bmds)
    if ok.sum() < 20:
        return None
    means = np.array([[np.mean(list(t[lv].values())) for lv in levels] for t in boot])[ok]
    cut = np.quantile(bmds[ok], TAIL if side == "low" else 1 - TAIL)
    tail = bmds[ok] <= cut if side == "low" else bmds[ok] >= cut
    if tail.all() or not tail.any():
        return None
    return (means[tail].mean(axis=0) - means[~tail].mean(axis=0)) / np.asarray(se)


def allocate(losses: dict, levels: list[float], tolerance: float, runs: int = 1,
             bind: tuple[str, str] | None = None) -> list[dict]:
    """Where the next `runs` runs inform the benchmark dose most: each one the tested level, or a new level at the
    current BMD (when no tested level lies within NEW_LEVEL_FACTOR of it), whose added run most lowers the
    delta-method variance of the BMD (bmd_variance), greedily: a c-optimal design for the BMD, the criterion
    toxicology uses to design benchmark-dose studies. Returns [{"mismatch", "new_level", "criterion", "share",
    "variance_before", "variance_after"}] (empty when the ruler cannot be fitted).

    When the seed bootstrap's end decides the interval (`bind` = binding(ruler) = ("seed", side)) and a tested level
    lies at the BMD, the runs go where that tail comes from instead: the delta method sees one curve and the
    parametric bootstrap draws about it, the seed bootstrap also redraws which curve, and a level whose three seeds
    scatter can make a curve of another shape fit (on pair A, the draws with the lowest tenth of BMDs read the KL
    0.50 level 3 standard errors higher than the rest did: a rise to a plateau). Each tested level's `share` is
    its tail shift (_tail_shifts, in standard errors) squared × 1/(n + 1), the part of its variance one more run
    removes, per run it costs (two when its next seed has no mismatch-free twin yet)."""
    np = _np()
    levels = sorted(lv for lv in levels if lv > 0 and lv in losses)
    if not levels:
        return []
    scale = max(levels)
    u = list(np.array(levels) / scale)
    y, se, nu = _level_stats(losses, levels)
    fits = _fit_all(np.array(u), y, se, nu)
    if not fits:
        return []
    weights = akaike_weights(fits)
    bmd_u, _ = benchmark_dose(fits, weights, tolerance)
    counts = [len(losses[lv]) for lv in levels]
    var_one = list(se ** 2 * np.array(counts))  # one run's variance at each level
    if bind and bind[0] == "seed" and any(max(x, bmd_u) <= NEW_LEVEL_FACTOR * min(x, bmd_u) for x in u):
        shifts = _tail_shifts(losses, levels, fits, np.array(u), se, nu, tolerance, bind[1])
        if shifts is not None:
            return _allocate_to_the_tail(losses, levels, shifts, counts, runs)
    pooled = float(np.mean(var_one))
    info = [c / v for c, v in zip(counts, var_one)]
    out = []
    for _ in range(runs):
        before = bmd_variance(fits, weights, u, info, bmd_u)
        options = [(i, None) for i in range(len(u))]
        if all(max(x, bmd_u) > NEW_LEVEL_FACTOR * min(x, bmd_u) for x in u):
            options.append((None, bmd_u))
        best = None
        for i, new in options:
            uu, ii = list(u), list(info)
            if new is None:
                ii[i] += 1 / var_one[i]
            else:
                uu.append(new)
                ii.append(1 / pooled)
            after = bmd_variance(fits, weights, uu, ii, bmd_u)
            if best is None or after < best[0]:
                best = (after, i, new)
        after, i, new = best
        if new is None:
            info[i] += 1 / var_one[i]
        else:
            u.append(new)
            info.append(1 / pooled)
            var_one.append(pooled)
        out.append({"mismatch": float((u[i] if new is None else new) * scale), "new_level": new is not None,
                    "criterion": "delta method", "share": None, "variance_before": before * scale ** 2,
                    "variance_after": after * scale ** 2})
    return out


def _allocate_to_the_tail(losses: dict, levels: list[float], shifts, counts, runs: int) -> list[dict]:
    """allocate()'s seed-bootstrap criterion, greedily over `runs`: the level whose next run takes the most of the
    tail's shift away per run it costs."""
    twins = set(losses.get(0.0, {}))
    counts, out = list(counts), []
    for _ in range(runs):
        shares = []
        for i, lv in enumerate(levels):
            added = counts[i] - len(losses[lv])  # runs this call already gave the level
            nxt = [s for s in range(counts[i] + 1) if s not in losses[lv]][added]  # the seed its next run takes
            shares.append(float(shifts[i]) ** 2 / (counts[i] + 1) / (1 if nxt in twins else 2))
        i = max(range(len(levels)), key=lambda k: shares[k])
        counts[i] += 1
        out.append({"mismatch": float(levels[i]), "new_level": False, "criterion": "seed bootstrap's tail",
                    "share": shares[i], "variance_before": None, "variance_after": None})
    return out
