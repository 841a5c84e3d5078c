"""Dose–response families, fitted to many tables of level means at once (numpy, vectorised over bootstrap draws).

Every family is f(u) = a·φ(u; θ) on the scaled dose u = mismatch / highest fitted mismatch, with f(0) = 0, a ≥ 0
its linear coefficient and θ its nonlinear parameters (none for the linear family), the restrictions EPA's BMDS puts
on them (power and Hill exponents ≥ 1):

    linear        a·u
    power         a·u^g                      g in [1, 18]
    exponential   a·(exp(b·u) − 1) / b       b in [1e-3, 30]   (a: the slope at zero)
    hill          a·u^n / (k^n + u^n)        k in [1e-3, 10], n in [1, 18]

For a fixed θ the weighted least-squares a has a closed form (a = max(0, Σwyφ / Σwφ²)), so a family is fitted by
profiling θ: a log-spaced grid between its bounds (the global optimum on the grid: no local minimum traps a start),
then three zooms on a local grid around each draw's best point, half the spacing each time (an eighth of the grid's
step at the end: 4 % in Hill's k, 2 % in its n). All draws are fitted by the same array operations, so a thousand
bootstrap tables cost about what one did with scipy's least_squares, and a whole calibration loop can be simulated
(benchmarks/budget_coverage.py).

A fitted parameter on its bound is not counted in the Akaike weights (BMDS counts only parameters estimated off a
bound): a power fit at g = 1 is the linear fit, and a fit whose curve is the same as a simpler family's (within 0.1 %
of its height on [0, 1]) is dropped as a duplicate, so a curve that every family collapses to is not counted four
times with four different penalties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

ZOOMS = 3  # local refinements after the global grid, each halving the spacing
LOCAL = 5  # points per nonlinear parameter in a zoom's local grid
DUPLICATE = 1e-3  # two fits are one curve when they differ by less than this share of its height on [0, 1]
_CHECK_U = np.concatenate([np.linspace(0.0, 1.0, 33)[1:], np.geomspace(1e-3, 1.0, 16)])  # where curves are compared


def _power(u, g):
    return np.power(u, g)


def _exponential(u, b):
    return np.expm1(b * u) / b


def _hill(u, k, n):
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        r = np.power(np.divide(k, u), n)  # u = 0 gives r = inf and 0
    return np.where(u > 0, 1.0 / (1.0 + r), 0.0)


@dataclass(frozen=True)
class Family:
    """f(u) = a·basis(u, *θ): `bounds` the nonlinear parameters' (low, high), `points` their global grid sizes."""

    name: str
    basis: Callable
    bounds: tuple[tuple[float, float], ...]
    points: tuple[int, ...]
    formula: str

    @property
    def k(self) -> int:
        """Parameters: the linear coefficient and the nonlinear ones."""
        return 1 + len(self.bounds)

    def f(self, u, *params):
        """The curve at u for parameters (a, *θ) (scalars or arrays that broadcast against u)."""
        a, *theta = params
        return a * (self.basis(u, *theta) if theta else u)

    def grid(self) -> np.ndarray:
        """The global grid of θ [G, len(bounds)] (one empty row for the linear family)."""
        axes = [np.geomspace(lo, hi, n) for (lo, hi), n in zip(self.bounds, self.points)]
        if not axes:
            return np.zeros((1, 0))
        return np.stack([x.ravel() for x in np.meshgrid(*axes, indexing="ij")], axis=1)

    def steps(self) -> np.ndarray:
        """The global grid's spacing of each nonlinear parameter, on the log scale."""
        return np.array([math.log(hi / lo) / (n - 1) for (lo, hi), n in zip(self.bounds, self.points)])


MODELS: dict[str, Family] = {
    f.name: f
    for f in (
        Family("linear", lambda u: u, (), (), "b·d"),
        Family("power", _power, ((1.0, 18.0),), (48,), "b·d^g (g ≥ 1)"),
        Family("exponential", _exponential, ((1e-3, 30.0),), (48,), "c·(exp(b·d) − 1) / b"),
        Family("hill", _hill, ((1e-3, 10.0), (1.0, 18.0)), (28, 20), "v·d^n / (k^n + d^n) (n ≥ 1)"),
    )
}


@dataclass
class Fits:
    """One family fitted to B tables: the parameters (a [B], θ [B, p]), χ² [B] and the parameters off their bounds
    [B] (a = 0 leaves none: the curve is flat, whatever θ)."""

    family: Family
    a: np.ndarray
    theta: np.ndarray
    chi2: np.ndarray
    k_eff: np.ndarray

    def curve(self, u) -> np.ndarray:
        """The fitted curves at doses u [U] -> [B, U]."""
        u = np.asarray(u, dtype=float)[None, :]
        theta = [self.theta[:, j : j + 1] for j in range(self.theta.shape[1])]
        return self.family.f(u, self.a[:, None], *theta)

    def params(self, b: int = 0) -> tuple[float, ...]:
        return (float(self.a[b]), *(float(t) for t in self.theta[b]))


def _profile(phi, yw, w, syy):
    """The closed-form a and χ² of every candidate θ: phi [..., G, L] the bases, yw [B, L] = w·y, syy [B] = Σwy²."""
    if phi.ndim == 2:  # one grid for every draw
        num = yw @ phi.T  # [B, G]
        den = (phi * phi) @ w  # [G]
    else:  # a grid per draw [B, G, L]
        num = np.einsum("bl,bgl->bg", yw, phi)
        den = np.einsum("l,bgl->bg", w, phi * phi)
    den = np.maximum(den, 1e-300)
    a = np.maximum(num, 0.0) / den
    return a, syy[:, None] - a * (2 * num - a * den)


def fit(family: Family, u, y, w) -> Fits:
    """`family` fitted by weighted least squares to every row of `y` [B, L] (level means at scaled doses `u` [L],
    weights `w` [L] = 1 / se²)."""
    u, y, w = np.asarray(u, dtype=float), np.atleast_2d(np.asarray(y, dtype=float)), np.asarray(w, dtype=float)
    yw, syy = y * w, (y * y) @ w
    grid = family.grid()
    B, p = y.shape[0], grid.shape[1]
    if p == 0:
        a, chi2 = _profile(u[None, :], yw, w, syy)
        theta = np.zeros((B, 0))
        a, chi2 = a[:, 0], chi2[:, 0]
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            phi = family.basis(u[None, :], *[grid[:, j : j + 1] for j in range(p)])
        a, chi2 = _profile(np.nan_to_num(phi), yw, w, syy)
        best = np.argmin(chi2, axis=1)
        theta = grid[best]
        lo = np.log([b[0] for b in family.bounds])
        hi = np.log([b[1] for b in family.bounds])
        step = family.steps()
        offsets = np.stack([x.ravel() for x in np.meshgrid(*[np.linspace(-1, 1, LOCAL)] * p, indexing="ij")], 1)
        for _ in range(ZOOMS):
            local = np.clip(np.log(theta)[:, None, :] + offsets[None] * step, lo, hi)  # [B, G, p]
            cand = np.exp(local)
            with np.errstate(over="ignore", invalid="ignore"):
                phi = family.basis(u[None, None, :], *[cand[:, :, j : j + 1] for j in range(p)])
            ca, cchi = _profile(np.nan_to_num(phi), yw, w, syy)
            best = np.argmin(cchi, axis=1)
            theta = cand[np.arange(B), best]
            step = step / 2
        a, chi2 = ca[np.arange(B), best], cchi[np.arange(B), best]
    on_bound = np.zeros((B, p), dtype=bool)
    for j, (blo, bhi) in enumerate(family.bounds):
        on_bound[:, j] = (np.abs(np.log(theta[:, j] / blo)) < 1e-9) | (np.abs(np.log(theta[:, j] / bhi)) < 1e-9)
    k_eff = np.where(a > 0, 1 + (~on_bound).sum(axis=1), 0)
    return Fits(family, a, theta, np.maximum(chi2, 0.0), k_eff)


def fit_all(u, y, w) -> list[Fits]:
    """Every family of MODELS fitted to every row of `y`; those with more parameters than levels are left out."""
    return [fit(f, u, y, w) for f in MODELS.values() if f.k <= len(np.atleast_1d(u))]


def weights(fits: list[Fits]) -> np.ndarray:
    """Akaike weights [B, M]: AIC = χ² + 2·(parameters off their bounds), duplicates of a simpler fit dropped
    (weight 0: the same curve as a fit with fewer parameters off their bounds, or as an earlier family with as
    many)."""
    B = fits[0].a.shape[0]
    curves = [f.curve(_CHECK_U) for f in fits]
    keep = np.ones((B, len(fits)), dtype=bool)
    for m, fm in enumerate(fits):
        height = np.maximum(np.abs(curves[m]).max(axis=1), 1e-12)
        for n in range(m):
            fn = fits[n]
            same = np.abs(curves[m] - curves[n]).max(axis=1) <= DUPLICATE * height
            simpler_n = (fn.k_eff <= fm.k_eff) & keep[:, n]
            keep[:, m] &= ~(same & simpler_n)
            keep[:, n] &= ~(same & (fm.k_eff < fn.k_eff))
    aic = np.stack([f.chi2 + 2 * f.k_eff for f in fits], axis=1)
    aic = np.where(keep, aic, np.inf)
    best = aic.min(axis=1, keepdims=True)
    wts = np.where(keep, np.exp(-(aic - best) / 2), 0.0)
    return wts / wts.sum(axis=1, keepdims=True)


def averaged(fits: list[Fits], wts: np.ndarray, u) -> np.ndarray:
    """The model-averaged curves at doses u [U] -> [B, U]."""
    return sum(wts[:, m : m + 1] * f.curve(u) for m, f in enumerate(fits))


def benchmark_doses(fits: list[Fits], wts: np.ndarray, tolerance: float, iterations: int = 60):
    """Where each draw's averaged curve reaches `tolerance` on (0, 1] (bisection; the families are non-decreasing):
    (the scaled doses [B], whether each was reached within the tested doses [B]); 1 where it was not (censored at
    the highest tested dose)."""
    B = wts.shape[0]

    def g(u):  # u [B]
        return (
            sum(
                wts[:, m] * f.family.f(u, f.a, *[f.theta[:, j] for j in range(f.theta.shape[1])])
                for m, f in enumerate(fits)
            )
            - tolerance
        )

    reached = g(np.ones(B)) >= 0
    lo, hi = np.zeros(B), np.ones(B)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        up = g(mid) >= 0
        hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
    return np.where(reached, hi, 1.0), reached
