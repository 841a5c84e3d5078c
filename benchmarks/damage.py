"""A damage model: a recipe's mismatch predicted before it is measured, from per-group terms and a link.

Selection adds single-group costs: a recipe R is predicted to cost S(R) = Σ_{i in R} u_i. Groups interact through the
residual stream, so the measured cost of a combination is not that sum: on a large recipe it can fall short (the
errors partly cancel or saturate: ModelOpt's saturation-aware AutoQuantize models D = c·(1 − Π(1 − a_i)), NVIDIA
Model-Optimizer PR #2183) or exceed it (errors compound through later layers). One link covers both:

    D(R) = (1 − exp(−ρ·S(R))) / ρ,      S(R) = Σ_{i in R} u_i,      u_i = k · s_i · exp(ε_i)

ρ > 0 saturates at 1/ρ (ModelOpt's form with c = 1/ρ and a_i = 1 − exp(−ρ·u_i)), ρ = 0 is the plain sum, ρ < 0
compounds. s_i is a prior cost per group (its single-group row of the sweep, its in-context cost or its path
attribution: benchmarks/pricing.py and attribution.py), k one scale for all of them, and ε_i a per-group correction in
log units, shrunk toward 0 with a prior standard deviation τ (a ridge penalty), so that a group only moves away from its
prior where the measured combinations say so. τ is chosen by k-fold cross-validation over the measured combinations (τ =
0: the prior costs, rescaled, with the link). The fit is scipy's least_squares on log D − log m (relative errors, as the
mismatch spans decades), so the median relative error is what it minimises.

With in-context costs (`context`: each group's cost left out of the whole model in FP8, l_i = m(all) − m(all \\ i),
against its single cost s_i), a group's marginal cost is interpolated between the two ends by how much of the whole
is already in FP8, linearly in the prior mass: m_i(E) = s_i + (l_i − s_i)·S_s(E)/S_s(all) for the groups E already
in FP8 (S_s: the plain sum of single costs). Adding a recipe's groups one at a time along the straight path from
BF16 to R averages that over E = τ·R, τ in [0, 1], and adds a per-recipe interaction term to the link's input:

    S(R) = Σ_{i in R} u_i + k·γ·q(R),      q(R) = S_s(R) · Σ_{i in R} (l_i − s_i) / (2·S_s(all))

(γ = 1 is that interpolation; it is fitted), a group's own interaction with the rest: one that saturates (l_i < s_i)
costs less in a large recipe, one that compounds (l_i > s_i) more, each by its own measured amount, where the link
alone bends every group alike.

Since D is increasing in S for every ρ, the recipe with the least predicted damage under a memory target is the
knapsack on u_i per byte, and the most bytes under a damage budget b the knapsack with S ≤ S(b) (damage_to_sum):
make_recipe ranks groups by any per-group score, so the model plugs in by handing it u_i (pricing.py's `damage`
prices, beside this file). It was `recipe --damage-model N` until the peer table showed it never measurably better
than the default at 16 and 128 search prompts on either student, in 5-10x the time (docs/modelopt.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from fp8probe.core.errors import FP8ProbeError

TAUS = (0.0, 0.1, 0.3, 1.0)  # prior sd of the per-group log-corrections tried by cross-validation
FOLDS = 5
_FLOOR = 1e-12  # measured values below this are not fitted (log scale)


def link(s: np.ndarray | float, rho: float) -> np.ndarray | float:
    """D = (1 − exp(−ρ·S)) / ρ, the plain sum S at ρ = 0, continuous through it."""
    s = np.asarray(s, dtype=float)
    if abs(rho) < 1e-12:
        return s
    return -np.expm1(np.clip(-rho * s, -700, 700)) / rho


def damage_to_sum(d: float, rho: float) -> float:
    """The sum S at which the link reaches damage d (inf where a saturating link never does)."""
    if abs(rho) < 1e-12:
        return d
    x = 1 - rho * d
    return -math.log(x) / rho if x > 0 else math.inf


@dataclass
class DamageModel:
    """Fitted per-group terms and link: predict(groups) is the recipe's predicted mismatch."""

    names: list[str]
    u: np.ndarray  # per group: its additive term (on the link's input scale)
    rho: float
    k: float  # the prior costs' fitted scale
    tau: float  # the per-group corrections' prior sd, chosen by cross-validation
    fitted_on: int  # measured combinations
    cv_error: float  # the chosen tau's cross-validated median |relative error|
    cv: dict = field(default_factory=dict)  # tau -> its cross-validated median |relative error|
    context: "Context | None" = None  # the in-context interaction term, where in-context costs were given

    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    def terms(self) -> dict[str, float]:
        """The additive terms u_i (without the in-context interaction, which depends on the whole recipe)."""
        return dict(zip(self.names, map(float, self.u)))

    def predict(self, groups: Iterable[str]) -> float:
        idx = self.index()
        rows = [idx[g] for g in groups]
        s = sum(self.u[i] for i in rows)
        if self.context is not None:
            s = max(s + self.k * self.context.gamma * self.context.q(rows), 0.0)  # no recipe gains from FP8
        return float(link(s, self.rho))

    @classmethod
    def from_json(cls, d: dict) -> "DamageModel":
        """The model as recipe.json records it (to_json)."""
        terms = d["terms"]
        ctx = d.get("context")
        return cls(
            list(terms),
            np.array([float(v) for v in terms.values()]),
            float(d["rho"]),
            float(d["k"]),
            float(d["tau"]),
            int(d["fitted_on"]),
            float(d["cv_median_rel_error"]),
            {float(t): e for t, e in d.get("cv", {}).items()},
            Context.of([ctx["single"][n] for n in terms], [ctx["in_context"][n] for n in terms], float(ctx["gamma"]))
            if ctx
            else None,
        )

    def to_json(self) -> dict:
        out = {
            "link": "(1 - exp(-rho*S)) / rho, S = sum of the groups' terms",
            "rho": self.rho,
            "k": self.k,
            "tau": self.tau,
            "fitted_on": self.fitted_on,
            "cv_median_rel_error": self.cv_error,
            "cv": {str(t): e for t, e in self.cv.items()},
            "terms": self.terms(),
        }
        if self.context is not None:
            c = self.context
            out["link"] += (
                " + k*gamma*q(R), q(R) = S_single(R) * sum over R of (in_context - single) / (2 S_single(all))"
            )
            out["context"] = {
                "gamma": c.gamma,
                "single": dict(zip(self.names, map(float, c.single))),
                "in_context": dict(zip(self.names, map(float, c.single + c.delta))),
            }
        return out


@dataclass
class Context:
    """The in-context interaction term (module doc): per group its single cost s_i and l_i − s_i, and γ."""

    single: np.ndarray
    delta: np.ndarray  # l_i − s_i
    gamma: float = 1.0

    @classmethod
    def of(cls, single, in_context, gamma: float = 1.0) -> "Context":
        s = np.asarray(single, dtype=float)
        return cls(s, np.asarray(in_context, dtype=float) - s, gamma)

    def q(self, rows) -> float:
        """q(R) for the groups at index `rows`."""
        x = np.zeros(len(self.single))
        x[list(rows)] = 1.0
        return float(self.features(x))

    def features(self, x: np.ndarray) -> np.ndarray:
        """q(R) of every combination, rows of the 0/1 design matrix x."""
        return (x @ self.single) * (x @ self.delta) / (2 * self.single.sum())


def _design(names: Sequence[str], sets: Sequence[Iterable[str]]) -> np.ndarray:
    idx = {n: i for i, n in enumerate(names)}
    x = np.zeros((len(sets), len(names)))
    for j, s in enumerate(sets):
        for g in s:
            if g not in idx:
                raise FP8ProbeError(f"damage model: {g} has no prior cost (is it a group of this model?)")
            x[j, idx[g]] = 1.0
    return x


def _sums(x, prior, lk, eps, gamma=0.0, q=None) -> np.ndarray:
    """The link's input S of every combination (rows of x): the scaled, corrected prior terms, plus k·γ·q with an
    in-context term."""
    s = x @ (np.exp(lk) * prior * np.exp(eps))
    return s + np.exp(lk) * gamma * q if q is not None else s


def _fit(
    x: np.ndarray, m: np.ndarray, prior: np.ndarray, tau: float, sigma: float = 0.05, q: np.ndarray | None = None
) -> tuple[float, float, np.ndarray, float]:
    """(log k, rho, eps, gamma) minimising Σ (log D − log m)² + σ² Σ (ε / τ)²: the posterior mode with residuals of sd
    σ and corrections of prior sd τ (τ = 0: ε ≡ 0); q, each combination's in-context term (Context.features), adds
    k·γ·q to the link's input (γ fitted; 0 without q)."""
    from scipy.optimize import least_squares

    n = x.shape[1]
    logm = np.log(m)
    # start: the additive fit's scale, no saturation, the in-context term as the interpolation has it
    base = x @ prior
    lk0 = float(np.median(logm - np.log(np.maximum(base, _FLOOR))))
    free_eps, free_gamma = tau > 0, q is not None
    head = 3 if free_gamma else 2

    def unpack(th):
        return th[0], th[1], (th[head:] if free_eps else np.zeros(n)), (th[2] if free_gamma else 0.0)

    def resid(th):
        lk, rho, eps, gamma = unpack(th)
        d = np.maximum(link(_sums(x, prior, lk, eps, gamma, q), rho), _FLOOR)
        r = np.log(d) - logm
        return np.concatenate([r, eps / tau * sigma]) if free_eps else r

    th0 = np.concatenate([[lk0, 0.0], [1.0] if free_gamma else [], np.zeros(n if free_eps else 0)])
    # the link's scale 1/rho stays beyond a tenth of the largest sum seen (a link that saturates inside the data
    # range cannot be told from noise); the bound keeps exp() finite for rho < 0
    smax = float(np.max(base)) * math.exp(lk0)
    lim = 10.0 / max(smax, _FLOOR)
    lo = np.concatenate([[-np.inf, -lim], [-10.0] if free_gamma else [], np.full(len(th0) - head, -np.inf)])
    hi = np.concatenate([[np.inf, lim], [10.0] if free_gamma else [], np.full(len(th0) - head, np.inf)])
    lk, rho, eps, gamma = unpack(least_squares(resid, th0, bounds=(lo, hi)).x)
    return float(lk), float(rho), np.asarray(eps, dtype=float), float(gamma)


def _rel_errors(x, m, prior, lk, rho, eps, gamma=0.0, q=None) -> np.ndarray:
    return np.abs(link(_sums(x, prior, lk, eps, gamma, q), rho) / m - 1)


def fit_damage(
    sets: Sequence[Iterable[str]],
    measured: Sequence[float],
    prior: dict[str, float],
    taus: Sequence[float] = TAUS,
    folds: int = FOLDS,
    seed: int = 0,
    context: dict[str, float] | None = None,
) -> DamageModel:
    """Fit the model on measured combinations (each a set of group names in FP8 and its measured excess mismatch),
    starting from the prior per-group costs (every group a recipe may hold, each > 0). τ by `folds`-fold
    cross-validation over the combinations (median |relative error| on the left-out fold), then refitted on all.
    `context` (every group's in-context cost l_i, with the prior as its single cost s_i) adds the in-context
    interaction term (module doc)."""
    names = list(prior)
    p = np.array([max(float(prior[n]), _FLOOR) for n in names])
    sets = [list(s) for s in sets]
    m = np.asarray(measured, dtype=float)
    keep = m > _FLOOR
    if keep.sum() < 4:
        raise FP8ProbeError(
            f"damage model: {int(keep.sum())} measured combinations with a mismatch above zero; "
            "it needs at least 4 (measure more recipes)"
        )
    if context is not None and set(context) != set(names):
        raise FP8ProbeError("damage model: in-context costs for other groups than the prior's")
    ctx = Context.of(p, [float(context[n]) for n in names]) if context is not None else None
    x = _design(names, sets)[keep]
    m = m[keep]
    q = ctx.features(x) if ctx is not None else None
    order = np.random.default_rng(seed).permutation(len(m))
    parts = [order[i::folds] for i in range(min(folds, len(m)))]
    # the residuals' scale: the fit without per-group corrections (their log sd, at least 1 %)
    sigma = max(_log_sd(x, m, p, q), 0.01)
    cv = {}
    for tau in taus:
        errs = []
        for test in parts:
            train = np.setdiff1d(order, test)
            fit = _fit(x[train], m[train], p, tau, sigma, q[train] if q is not None else None)
            errs.append(_rel_errors(x[test], m[test], p, *fit, q=q[test] if q is not None else None))
        cv[float(tau)] = float(np.median(np.concatenate(errs)))
    tau = min(cv, key=lambda t: (cv[t], t))
    lk, rho, eps, gamma = _fit(x, m, p, tau, sigma, q)
    if ctx is not None:
        ctx.gamma = gamma
    return DamageModel(names, math.exp(lk) * p * np.exp(eps), rho, math.exp(lk), tau, int(len(m)), cv[tau], cv, ctx)


def _log_sd(x, m, p, q) -> float:
    """The sd of log(predicted / measured) of the fit without per-group corrections."""
    lk, rho, eps, gamma = _fit(x, m, p, 0.0, q=q)
    return float(
        np.sqrt(np.mean((np.log(np.maximum(link(_sums(x, p, lk, eps, gamma, q), rho), _FLOOR)) - np.log(m)) ** 2))
    )


def random_recipes(names: Sequence[str], sizes: Sequence[int], per_size: int, seed: int = 0) -> list[frozenset]:
    """`per_size` distinct random sets of each size (uniform over the groups): the combinations a damage model is
    fitted on, or judged on (another seed)."""
    rng = np.random.default_rng(seed)
    out, seen = [], set()
    for size in sizes:
        if not 0 < size <= len(names):
            raise FP8ProbeError(f"damage model: a recipe of {size} groups out of {len(names)}")
        tries = 0
        got = 0
        while got < per_size and tries < per_size * 50:
            tries += 1
            s = frozenset(names[i] for i in rng.choice(len(names), size=size, replace=False))
            if s not in seen:
                seen.add(s)
                out.append(s)
                got += 1
    return out


def prediction_errors(model: DamageModel, sets: Sequence[Iterable[str]], measured: Sequence[float]) -> dict:
    """|relative error| of the model on combinations (not fitted on): median and 90th percentile."""
    sets = [list(s) for s in sets]
    m = np.asarray(measured, dtype=float)
    pred = np.array([model.predict(s) for s in sets])
    err = np.abs(pred / m - 1)
    return {
        "n": len(m),
        "median": float(np.median(err)),
        "p90": float(np.quantile(err, 0.9)),
        "predicted": pred.tolist(),
    }


SPREAD = (0.5, 0.75, 1.0, 1.25, 1.5)  # random recipes' sizes, as fractions of the operating point's size


def fit_around(free: list, forced: list, measure, size: int, n: int, seed: int = 0) -> DamageModel:
    """A damage model for one selection: `n` random recipes of free groups (GroupScores), of sizes spread around
    `size` groups (SPREAD), each with the forced groups, measured by measure(groups) -> the excess mismatch, then
    fitted with the groups' scores as the prior costs (pricing.py's `damage` prices: n is its DAMAGE_RECIPES)."""
    by = {g.group: g for g in (*forced, *free)}
    names = [g.group for g in free]
    sizes = sorted({min(max(1, round(size * f)), len(names)) for f in SPREAD})
    sets = random_recipes(names, sizes, -(-n // len(sizes)), seed)[:n]
    sets = [frozenset(s | {g.group for g in forced}) for s in sets]
    measured = [measure([by[g] for g in s]) for s in sets]
    return fit_damage(sets, measured, {g: max(float(x.score), _FLOOR) for g, x in by.items()})
