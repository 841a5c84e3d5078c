"""The budget as a benchmark dose: one dose–response curve fitted to every run, averaged over model families.

A run's quality loss against its mismatch-free twin (design.py: on the training gain by default) is the response,
its level's dose the x-axis. Monotone families with zero loss at zero dose (families.py: linear, power, exponential,
Hill, with BMDS's restrictions) are fitted to the level means by weighted least squares, each level weighted by its
runs over its own variance moderated toward the pooled one (three seeds that happen to agree cannot take all the
weight), and averaged with Akaike weights that count only the parameters off their bounds. The benchmark dose
(BMD) is where the averaged curve reaches the tolerance; a BMD not reached within the fitted doses is censored at
the highest one (`above_range`, printed "> x"): no curve is extrapolated.

Its 90 % interval (BMDL, BMDU) is the hull of two bootstraps, each refitting every family (with the first fit's
weights) to a thousand redrawn tables:

- by seed: the seeds resampled, a seed's runs together (so the twin a seed's levels share is redrawn with them),
  its percentile interval widened for few seeds by core/stats.expansion, counting the seeds of the levels that
  carry the BMD (the fitted levels on either side of it), not the twins';
- parametric: every run drawn from the fitted model with the seed as a random effect (design.parametric: a shared
  shift per seed, the twins' and the perturbed runs' own noise, their variances drawn from pivotal distributions).

budget.json says which one set each end (`low_from`, `high_from`). Whether each seed's own twin or the twins' mean
is the baseline is decided from the estimated variance components (design.choose_pairing) and recorded.

Goodness of fit: each family's lack-of-fit test, χ²/(L − k) against F(L − k, ν) (L levels, k the parameters off
their bounds, ν the degrees of freedom of the pooled variance; p ≥ 0.1 fits, BMDS's rule); a family with no degree
left is not tested. A ruler fits when some tested family fits, is untested (None) when none could be, and when every
tested one fails, fit.py falls back to the isotonic fit. BMDS's flags beside it: the scaled residual at the level
nearest the BMD (|r| > 2), BMD / BMDL (> 3), a BMD below a third of the lowest fitted dose.

Beneficial low doses (hormesis): the lowest levels whose mean loss lies below zero by a one-sided t test on the
seed-paired losses at 5 %, in order from the lowest (a fixed-sequence test: at most 5 % false positives over the
whole sequence under no effect), are reported and left out of the monotone fit.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.stats import expansion
from . import families as fam
from .design import Design, by_seed, choose_pairing, components, level_means, losses, parametric, twins_of

LEVEL = 0.90  # the BMD interval: (BMDL, BMDU) = its 5 % and 95 % bootstrap quantiles
FIT_P = 0.10  # a family fits when its χ² p-value is at least this (BMDS's default for continuous models)
HORMESIS_ALPHA = 0.05  # the hormesis test's false-positive rate under no effect (the whole fixed sequence)
OTHER_TOLERANCES = (0.05, 0.10)  # BMDs reported beside the tolerance, with one control SD
MODELS = fam.MODELS


def ruler_fits(fits: list[dict]) -> bool | None:
    """A ruler fits when some family passes its χ² test; None when no family could be tested (as few levels as
    parameters off their bounds), False when every tested one fails."""
    tested = [f["fits"] for f in fits if f["fits"] is not None]
    return any(tested) if tested else None


def _p_value(chi2: float, dof: int, nu: float) -> float | None:
    """The lack-of-fit test: χ²/dof against F(dof, ν), ν the degrees of freedom of the variances the weights came
    from (estimated, not known: a χ² test would reject good fits from three seeds far too often)."""
    from scipy.stats import chi2 as chi2_dist
    from scipy.stats import f as f_dist

    if dof <= 0:
        return None
    return float(f_dist.sf(chi2 / dof, dof, nu)) if nu > 0 else float(chi2_dist.sf(chi2, dof))


def level_stats(y: np.ndarray):
    """Each level's mean loss, its standard error and the pooled variance's degrees of freedom, from responses
    y [L, S] (NaN where no run). A level's variance is its own spread moderated toward the pooled one, each weighted
    by its degrees of freedom ((ν s² + ν_p s_p²) / (ν + ν_p), as limma moderates gene-wise variances)."""
    n = (~np.isnan(y)).sum(axis=1)
    nu = np.maximum(n - 1, 0).astype(float)
    spread = np.array([np.nanvar(r, ddof=1) if k > 1 else 0.0 for r, k in zip(y, n)])
    nu_p = float(nu.sum())
    pooled = float((nu * spread).sum() / nu_p) if nu_p > 0 else 0.0
    var = (nu * spread + nu_p * pooled) / np.maximum(nu + nu_p, 1e-12)
    var = np.maximum(var, max(pooled, 1e-12) * 1e-3)
    return level_means(y), np.sqrt(var / np.maximum(n, 1)), nu_p


def quantiles(v) -> list[float] | None:
    v = np.asarray(v, dtype=float)
    v = v[np.isfinite(v)]
    return [float(np.quantile(v, (1 - LEVEL) / 2)), float(np.quantile(v, (1 + LEVEL) / 2))] if len(v) else None


def expanded(point: float, interval: list[float] | None, groups: int, top: float) -> list[float] | None:
    """The percentile interval widened about the point by core/stats.expansion (few seeds: sqrt(n / (n − 1)) x t / z,
    2.17 at three seeds), on the log scale a dose lives on, so the low end stays above zero; the high end stays
    within the tested doses (`top`), as the BMD itself does."""
    if interval is None or point <= 0 or interval[0] <= 0:
        return interval
    e = expansion(groups, LEVEL)
    if not math.isfinite(e):
        return None
    return [point * (interval[0] / point) ** e, min(point * (interval[1] / point) ** e, max(top, interval[1]))]


def hormesis(y: np.ndarray, rows: list[int], alpha: float = HORMESIS_ALPHA) -> tuple[list[int], list[dict]]:
    """The lowest rows (in dose order), in a row, whose seed-paired losses lie below zero by a one-sided t test at
    `alpha` (fixed sequence: the first row that fails ends it), and each tested row's t and p."""
    from scipy.stats import t as t_dist

    beneficial, tests = [], []
    for r in rows:
        v = y[r][~np.isnan(y[r])]
        if len(v) < 2:
            break
        sd = float(np.std(v, ddof=1))
        t = float(np.mean(v)) / (sd / math.sqrt(len(v))) if sd > 0 else (-math.inf if np.mean(v) < 0 else math.inf)
        p = float(t_dist.cdf(t, len(v) - 1))
        tests.append({"row": r, "t": t, "p": p})
        if p >= alpha:
            break
        beneficial.append(r)
    return beneficial, tests


class _Fitted:
    """Every family fitted to B tables of level means at scaled doses u, averaged; the BMDs at a tolerance."""

    def __init__(self, u, means, w):
        self.fits = fam.fit_all(u, means, w)
        self.w = fam.weights(self.fits)

    def bmd(self, tolerance: float):
        return fam.benchmark_doses(self.fits, self.w, tolerance)

    def curve(self, u):
        return fam.averaged(self.fits, self.w, u)


def _carrying_seeds(design: Design, fitted: list[int], bmd: float) -> int:
    """The seeds of the levels that carry the BMD: the fitted levels on either side of it (the fewest of the two)."""
    doses = design.doses[fitted]
    counts = design.counts()[fitted]
    below = [i for i, d in enumerate(doses) if d <= bmd]
    above = [i for i, d in enumerate(doses) if d >= bmd]
    near = ([max(below, key=lambda i: doses[i])] if below else []) + (
        [min(above, key=lambda i: doses[i])] if above else []
    )
    return int(min(counts[i] for i in near))


def _quality_means(design: Design, loss: np.ndarray, response: str) -> np.ndarray:
    """The level means of quality [L] that the losses `loss` [L − 1] of a design's levels imply against its twins'
    mean (the inverse of design.response); the twins keep their own mean."""
    q0 = float(np.mean(design.q[0]))
    if response == "gain":
        levels = q0 - loss * (q0 - design.start)
    else:
        levels = q0 - loss * abs(q0) if design.higher else q0 + loss * abs(q0)
    return np.concatenate([[q0], levels])


def _models(point: _Fitted, levels: int, nu: float, tolerance: float, scale: float) -> list[dict]:
    """Each family's fit as budget.json records it: its parameters, the ones off their bounds, AIC, weight, the
    lack-of-fit test and its own BMD."""
    models = []
    for m, f in enumerate(point.fits):
        dof = levels - int(f.k_eff[0])
        p = _p_value(float(f.chi2[0]), dof, nu)
        alone = fam.benchmark_doses([f], np.ones((1, 1)), tolerance)[0][0]
        models.append(
            {
                "name": f.family.name,
                "formula": f.family.formula,
                "params": list(f.params()),
                "parameters_off_bounds": int(f.k_eff[0]),
                "aic": float(f.chi2[0] + 2 * f.k_eff[0]),
                "weight": float(point.w[0, m]),
                "chi2": float(f.chi2[0]),
                "dof": dof,
                "p": p,
                "fits": None if p is None else p >= FIT_P,
                "bmd": float(alone) * scale,
            }
        )
    return models


def control_sd(design: Design, response: str) -> float:
    """One standard deviation of the mismatch-free runs' quality, on the response's scale."""
    q0 = design.q[0]
    sd = float(np.std(q0, ddof=1)) if len(q0) > 1 else 0.0
    scale = abs(float(np.mean(q0)) - design.start) if response == "gain" else abs(float(np.mean(q0)))
    return sd / scale if scale > 0 else math.nan


def fit_ruler(
    design: Design,
    rows: list[int],
    tolerance: float,
    *,
    response: str = "gain",
    pairing: str = "auto",
    n: int = 1000,
    seed: int = 0,
    predict: dict[str, int] | None = None,
) -> dict:
    """One ruler's dose–response fit: `design` the objective's runs (twins in row 0), `rows` the ruler's levels (its
    other rows: levels of other kinds, read against the curve by `predict` {name: row}), `n` draws per bootstrap.
    Returns the ruler's record for budget.json ("fits": False when no family fits)."""
    rows = sorted((r for r in rows if design.doses[r] > 0), key=lambda r: design.doses[r])
    out: dict = {"levels": [float(design.doses[r]) for r in rows], "fits": False}
    if not rows:
        return out
    ruler = design.rows(rows)  # twins + this ruler's levels: the components and the parametric draws
    comp = components(ruler) if ruler.q.shape[1] > 1 else None
    if not design.paired:
        pairing, why = "mean", "the twins' mean: the runs carry no seeds to pair by"
    elif pairing == "auto":
        pairing, why = choose_pairing(comp, ruler.q.shape[1]) if comp else ("seed", "one seed")
    else:
        why = "asked for"
    y = losses(design, design.q, twins_of(design.q), response, pairing)
    y_seed = y if not design.paired else losses(design, design.q, twins_of(design.q), response, "seed")
    beneficial, tests = hormesis(y_seed, rows)
    out["response"] = {"kind": response, "pairing": pairing, "pairing_reason": why}
    if comp is not None:
        out["components"] = {
            "seed": comp.seed,
            "twin": comp.twin,
            "run": comp.run,
            "df_seed": comp.df_seed,
            "df_twin": comp.df_twin,
            "df_run": comp.df_run,
            "twin_share": comp.twin_share(),
            "seed_share": comp.seed_share(),
        }
    out["hormesis"] = {
        "levels": [float(design.doses[r]) for r in beneficial],
        "supported": bool(beneficial),
        "test": f"one-sided t test of the seed-paired mean loss < 0, lowest level first, at "
        f"{HORMESIS_ALPHA:.0%} (fixed sequence)",
        "tests": [{"level": float(design.doses[t["row"]]), "t": t["t"], "p": t["p"]} for t in tests],
    }
    fitted = rows[len(beneficial) :]
    if not fitted:
        return out
    scale = float(design.doses[fitted[-1]])
    u = design.doses[fitted] / scale
    mean, se, nu = level_stats(y[fitted])
    w = 1 / se**2
    point = _Fitted(u, mean[None], w)
    if not point.fits:
        return out
    bmd_u, reached = (float(x[0]) for x in point.bmd(tolerance))
    reached = bool(reached)
    models = _models(point, len(u), nu, tolerance, scale)
    rng = np.random.default_rng(seed)
    qb, twb = by_seed(design, n, rng)
    seed_means = level_means(losses(design, qb, twb, response, pairing))  # [n, L]
    seeded = _Fitted(u, seed_means[:, fitted], w)
    ok = np.isfinite(seed_means[:, fitted]).all(axis=1)
    par = None
    if comp is not None:
        sub = ruler.rows(range(len(beneficial) + 1, len(rows) + 1))  # twins + the fitted levels
        qp = parametric(sub, _quality_means(sub, point.curve(u)[0], response), comp, n, rng)
        par = _Fitted(u, level_means(losses(sub, qp, twins_of(qp), response, pairing))[:, 1:], w)
    carrying = _carrying_seeds(design, fitted, bmd_u * scale)
    bmd = bmd_u * scale
    ints = _interval(seeded, par, ok, tolerance, bmd, carrying, scale)
    out.update(
        {
            "fits": ruler_fits(models),
            "scale": scale,
            "fitted_levels": [float(design.doses[r]) for r in fitted],
            "bmd": bmd,
            "above_range": not reached,
            **ints,
            "widening": {
                "factor": expansion(carrying, LEVEL),
                "seeds": carrying,
                "why": "the seeds of the fitted levels on either side of the BMD",
            },
            "bootstrap": int(ok.sum()),
            "parametric_draws": n if par is not None else 0,
            "models": models,
            "fitted": {str(float(design.doses[r])): float(point.curve([design.doses[r] / scale])[0, 0]) for r in rows},
        }
    )
    out["interval_censored"] = bool(out["interval"]) and out["interval"][1] >= scale * (1 - 1e-9)
    out["other_responses"] = _other_responses(control_sd(design, response), point, seeded, par, ok, carrying, scale)
    out["flags"] = _flags(out, design, fitted, mean, se, point, u, scale)
    grid = np.unique(np.concatenate([np.geomspace(design.doses[fitted[0]] / 4, scale, 60), design.doses[fitted]]))
    band = seeded.curve(grid / scale)[ok]
    mid = point.curve(grid / scale)[0]
    out["curve"] = [
        {"mismatch": float(x), "loss": float(mid[i]), "band": quantiles(band[:, i])} for i, x in enumerate(grid)
    ]
    if predict:
        out["predictions"] = {
            name: _prediction(design, r, seed_means[ok], seeded, ok, point, scale, y) for name, r in predict.items()
        }
    return out


def _other_responses(sd: float, point: _Fitted, seeded: _Fitted, par, ok, carrying: int, scale: float) -> dict:
    """BMDs at 5 %, 10 % and one control SD (`sd`, on the response's scale) of the same curve, each with its interval
    from the same two bootstraps."""
    out = {}
    for name, tol in [*((f"{t:g}", t) for t in OTHER_TOLERANCES), ("one control sd", sd)]:
        if math.isfinite(tol) and tol > 0:
            b, got = (float(x[0]) for x in point.bmd(tol))
            i = _interval(seeded, par, ok, tol, b * scale, carrying, scale)
            out[name] = {
                "tolerance": tol,
                "bmd": b * scale,
                "above_range": not bool(got),
                "interval": i["interval"],
                "low_from": i["low_from"],
                "high_from": i["high_from"],
                "interval_censored": bool(i["interval"]) and i["interval"][1] >= scale * (1 - 1e-9),
            }
    return out


def _interval(
    seeded: _Fitted, par: _Fitted | None, ok, tolerance: float, at: float, carrying: int, scale: float
) -> dict:
    """The BMD's interval at `tolerance` about the point `at`: the seed bootstrap's percentiles widened for the
    seeds carrying the BMD, the parametric bootstrap's, their hull, and which one set each end."""
    pct = quantiles(seeded.bmd(tolerance)[0][ok] * scale)
    widened = expanded(at, pct, carrying, scale)
    p_int = quantiles(par.bmd(tolerance)[0] * scale) if par is not None else None
    hull, low_from, high_from = widened, "seed bootstrap", "seed bootstrap"
    if widened and p_int:
        hull = [min(widened[0], p_int[0]), max(widened[1], p_int[1])]
        low_from = "seed bootstrap" if widened[0] <= p_int[0] else "parametric bootstrap"
        high_from = "seed bootstrap" if widened[1] >= p_int[1] else "parametric bootstrap"
    elif p_int:
        hull, low_from, high_from = p_int, "parametric bootstrap", "parametric bootstrap"
    return {
        "percentile_interval": pct,
        "seed_interval": widened,
        "parametric_interval": p_int,
        "interval": hull,
        "low_from": low_from,
        "high_from": high_from,
    }


def _flags(out: dict, design: Design, fitted, mean, se, point, u, scale) -> dict:
    """BMDS-style warnings: the scaled residual at the fitted level nearest the BMD, BMD / BMDL, a BMD far below
    the lowest fitted dose."""
    bmd = out["bmd"]
    i = int(np.argmin(np.abs(np.log(design.doses[fitted] / max(bmd, 1e-300)))))
    resid = float((mean[i] - point.curve([u[i]])[0, 0]) / se[i])
    lo = (out["interval"] or [math.nan])[0]
    ratio = bmd / lo if lo and lo > 0 else math.inf
    warnings = []
    if abs(resid) > 2:
        warnings.append(f"the scaled residual at the level nearest the BMD is {resid:+.2f} (|r| > 2)")
    if ratio > 3:
        warnings.append(f"BMD / BMDL is {ratio:.3g} (> 3)")
    if bmd < design.doses[fitted[0]] / 3:
        warnings.append("the BMD lies below a third of the lowest fitted dose: extrapolated")
    return {
        "nearest_level": float(design.doses[fitted[i]]),
        "scaled_residual": resid,
        "bmd_bmdl": ratio,
        "warnings": warnings,
    }


def _prediction(design: Design, row: int, seed_means, seeded, ok, point, scale, y) -> dict:
    """The ruler's curve read at another source's level: its predicted loss there, that level's measured loss (its
    own interval, widened for its seeds), and measured − predicted paired by seed draw, with what it says."""
    x = float(design.doses[row])
    predicted = float(point.curve([x / scale])[0, 0])
    pred_draws = seeded.curve([x / scale])[ok][:, 0]
    own = seed_means[:, row]
    k = int((~np.isnan(y[row])).sum())
    e = expansion(k, LEVEL)
    measured = float(np.nanmean(y[row]))
    d = quantiles(own - pred_draws)
    diff = (
        None
        if d is None
        else [
            measured - predicted - e * (measured - predicted - d[0]),
            measured - predicted + e * (d[1] - (measured - predicted)),
        ]
    )
    li = quantiles(own)
    loss_interval = None if li is None else [measured - e * (measured - li[0]), measured + e * (li[1] - measured)]
    return {
        "mismatch": x,
        "predicted": predicted,
        "predicted_interval": quantiles(pred_draws),
        "measured": measured,
        "measured_interval": loss_interval,
        "seeds": k,
        "beyond_tested": bool(x > scale),
        "difference_interval": diff,
        "reading": (
            None
            if diff is None
            else "as the ruler predicts"
            if diff[0] <= 0 <= diff[1]
            else "costs more than the ruler predicts"
            if diff[0] > 0
            else "costs less than the ruler predicts"
        ),
    }


# -- where the next runs inform the BMD most ---------------------------------------------------------------------


def _jacobian(family, u, params, h: float = 1e-6):
    """∂f/∂θ at the doses `u` (rows) by central differences, each step relative to its parameter."""
    u = np.atleast_1d(np.asarray(u, dtype=float))
    cols = []
    for i, t in enumerate(params):
        step = h * max(abs(t), 1e-3)
        up, dn = list(params), list(params)
        up[i], dn[i] = t + step, t - step
        cols.append((family.f(u, *up) - family.f(u, *dn)) / (2 * step))
    return np.stack(cols, axis=1)


def bmd_variance(fits, wts, u, information, bmd_u: float) -> float:
    """The delta method's variance of the benchmark dose (scaled) for a design: `information` the weight (runs /
    variance) of each scaled dose in `u`. Each family's var f̂(BMD) = gᵀ (JᵀWJ)⁻¹ g over its slope there squared,
    averaged with the Akaike weights (the spread between families does not change with the design)."""
    total = 0.0
    for fit, a in zip(fits, wts):
        if a <= 0:
            continue
        family, params = fit.family, fit.params()
        J = _jacobian(family, u, params)
        g = _jacobian(family, [bmd_u], params)[0]
        step = 1e-6 * max(bmd_u, 1e-3)
        slope = float(
            (family.f(np.asarray([bmd_u + step]), *params) - family.f(np.asarray([bmd_u - step]), *params))[0]
            / (2 * step)
        )
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
    (lo, hi), b = ruler["interval"], ruler["bmd"]
    if "low_from" in ruler:
        side = "low" if lo <= 0 or math.log(b / lo) >= math.log(hi / b) else "high"
        part = ruler["low_from" if side == "low" else "high_from"]
        return ("seed" if part.startswith("seed") else "parametric"), side
    plo, phi = ruler["parametric_interval"]
    if lo <= 0 or math.log(b / lo) >= math.log(hi / b):
        return ("seed" if lo < plo else "parametric"), "low"
    return ("seed" if hi > phi else "parametric"), "high"


TAIL_DRAWS = 300  # the seed bootstrap's draws the allocation reads the tail off
TAIL = 0.10  # the share of those draws, on the binding side, that make the tail


def _tail_shifts(design: Design, fitted: list[int], u, w, tolerance: float, side: str, response: str, pairing: str, se):
    """Per fitted level, how many of its standard errors its resampled mean sits away, in the seed bootstrap's draws
    that make the binding tail (the TAIL of draws with the lowest BMD for side "low", the highest for "high"), from
    where it sits in the other draws; None when too few draws could be fitted."""
    rng = np.random.default_rng(len(fitted))
    qb, twb = by_seed(design, TAIL_DRAWS, rng)
    means = level_means(losses(design, qb, twb, response, pairing))[:, fitted]
    ok = np.isfinite(means).all(axis=1)
    if ok.sum() < 20:
        return None
    means = means[ok]
    bmds = _Fitted(u, means, w).bmd(tolerance)[0]
    cut = np.quantile(bmds, TAIL if side == "low" else 1 - TAIL)
    tail = bmds <= cut if side == "low" else bmds >= cut
    if tail.all() or not tail.any():
        return None
    return (means[tail].mean(axis=0) - means[~tail].mean(axis=0)) / np.asarray(se)


def allocate(
    design: Design,
    rows: list[int],
    tolerance: float,
    runs: int = 1,
    bind: tuple[str, str] | None = None,
    response: str = "gain",
    pairing: str = "seed",
) -> list[dict]:
    """Where the next `runs` runs inform the benchmark dose most: each one a tested level (its next seed), or a new
    level at the current BMD (when no tested level lies within NEW_LEVEL_FACTOR of it), whose added run most lowers
    the delta-method variance of the BMD (bmd_variance), greedily: a c-optimal design for the BMD, the criterion
    toxicology uses to design benchmark-dose studies. Returns [{"mismatch", "new_level", "criterion", "share",
    "variance_before", "variance_after"}] (empty when the ruler cannot be fitted).

    When the seed bootstrap's end decides the interval (`bind` = binding(ruler) = ("seed", side)) and a tested level
    lies at the BMD, the runs go where that tail comes from instead: the delta method sees one curve, the seed
    bootstrap also redraws which curve, and a level whose three seeds scatter can make a curve of another shape fit.
    Each tested level's `share` is its tail shift (_tail_shifts, in standard errors) squared × 1/(n + 1), the part of
    its variance one more run removes, per run it costs (two when its next seed has no mismatch-free twin yet)."""
    rows = sorted((r for r in rows if design.doses[r] > 0), key=lambda r: design.doses[r])
    if not rows:
        return []
    scale = float(design.doses[rows[-1]])
    u = list(design.doses[rows] / scale)
    y = losses(design, design.q, twins_of(design.q), response, pairing)
    mean, se, nu = level_stats(y[rows])
    w = 1 / se**2
    point = _Fitted(np.array(u), mean[None], w)
    if not point.fits:
        return []
    wts = list(point.w[0])
    bmd_u = float(point.bmd(tolerance)[0][0])
    counts = [int(c) for c in design.counts()[rows]]
    var_one = list(se**2 * np.array(counts))  # one run's variance at each level
    if bind and bind[0] == "seed" and any(max(x, bmd_u) <= NEW_LEVEL_FACTOR * min(x, bmd_u) for x in u):
        shifts = _tail_shifts(design, rows, np.array(u), w, tolerance, bind[1], response, pairing, se)
        if shifts is not None:
            return _allocate_to_the_tail(design, rows, shifts, counts, runs)
    pooled = float(np.mean(var_one))
    info = [c / v for c, v in zip(counts, var_one)]
    out = []
    for _ in range(runs):
        before = bmd_variance(point.fits, wts, u, info, bmd_u)
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
            after = bmd_variance(point.fits, wts, uu, ii, bmd_u)
            if best is None or after < best[0]:
                best = (after, i, new)
        after, i, new = best
        if new is None:
            info[i] += 1 / var_one[i]
        else:
            u.append(new)
            info.append(1 / pooled)
            var_one.append(pooled)
        out.append(
            {
                "mismatch": float((u[i] if new is None else new) * scale),
                "new_level": new is not None,
                "criterion": "delta method",
                "share": None,
                "variance_before": before * scale**2,
                "variance_after": after * scale**2,
            }
        )
    return out


def _allocate_to_the_tail(design: Design, rows: list[int], shifts, counts, runs: int) -> list[dict]:
    """allocate()'s seed-bootstrap criterion, greedily over `runs`: the level whose next run takes the most of the
    tail's shift away per run it costs."""
    seeds = list(design.seeds)
    counts, out = list(counts), []
    for _ in range(runs):
        shares = []
        for i, r in enumerate(rows):
            added = counts[i] - int(design.counts()[r])  # runs this call already gave the level
            have = {seeds[s] for s in np.flatnonzero(design.present[r])}
            nxt = [s for s in range(counts[i] + 1 + len(seeds)) if s not in have][added]  # the seed its next run takes
            shares.append(float(shifts[i]) ** 2 / (counts[i] + 1) / (1 if nxt in seeds else 2))
        i = max(range(len(rows)), key=lambda k: shares[k])
        counts[i] += 1
        out.append(
            {
                "mismatch": float(design.doses[rows[i]]),
                "new_level": False,
                "criterion": "seed bootstrap's tail",
                "share": shares[i],
                "variance_before": None,
                "variance_after": None,
            }
        )
    return out
