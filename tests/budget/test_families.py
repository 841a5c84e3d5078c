"""The dose–response families fitted by profiling (budget/families.py): known curves recovered, parameters on their
bounds not counted, duplicates dropped, the averaged curve's BMD, all by hand."""

import math

import numpy as np
import pytest

from fp8probe.budget.families import MODELS, benchmark_doses, fit, fit_all, weights

U = np.array([0.05, 0.1, 0.25, 0.5, 1.0])
W = np.full(5, 1e4)  # a standard error of 0.01 at every level


@pytest.mark.parametrize(
    "name, params",
    [("linear", (0.04,)), ("power", (0.08, 2.5)), ("exponential", (0.02, 3.0)), ("hill", (0.06, 0.4, 2.5))],
)
def test_each_family_recovers_its_own_curve(name, params):
    """Exact data from a family: its own fit has χ² ~ 0 and its parameters (the profiled grid's zooms reach an eighth
    of the grid's spacing: a few percent at most)."""
    fam = MODELS[name]
    y = fam.f(U, *params)[None, :]
    got = fit(fam, U, y, W)
    assert got.chi2[0] < 0.05
    assert got.params() == pytest.approx(params, rel=0.05)


def test_a_parameter_on_its_bound_is_not_counted_and_a_duplicate_is_dropped():
    """Exactly linear data: the power fit sits at its bound g = 1 (the linear curve: a duplicate, weight 0), the
    exponential at b = 0.001 (the same curve within 0.05 %: dropped), Hill fits with k and n off their bounds
    or not. The weights follow AIC = χ² + 2 x (parameters off their bounds) over the fits kept: linear (χ² 0, 1
    parameter) against Hill (its χ² and its own count), by hand."""
    y = (0.04 * U)[None, :]
    fits = fit_all(U, y, W)
    w = weights(fits)[0]
    by = {f.family.name: (f, w[i]) for i, f in enumerate(fits)}
    power, wp = by["power"]
    assert power.theta[0, 0] == pytest.approx(1.0) and power.k_eff[0] == 1 and wp == 0.0
    assert by["exponential"][1] == 0.0
    lin, wl = by["linear"]
    hill, wh = by["hill"]
    aic_l = lin.chi2[0] + 2 * 1
    aic_h = hill.chi2[0] + 2 * hill.k_eff[0]
    assert wh / wl == pytest.approx(math.exp(-(aic_h - aic_l) / 2), rel=1e-9)
    assert wl + wh == pytest.approx(1.0)


def test_a_flat_curve_has_no_parameter_off_its_bounds():
    """Losses of zero: every family's a is 0 (its bound), so no parameter counts; the curve is censored."""
    fits = fit_all(U, np.zeros((1, 5)), W)
    assert all(f.a[0] == 0 and f.k_eff[0] == 0 for f in fits)
    bmd, reached = benchmark_doses(fits, weights(fits), 0.02)
    assert bmd[0] == 1.0 and not reached[0]


def test_the_benchmark_dose_by_hand_and_many_draws_at_once():
    """0.04·u reaches 2 % at u = 0.5; 0.08·u² at sqrt(0.25) = 0.5; and a thousand noisy tables are fitted by the same
    array operations, their BMDs scattered about 0.5."""
    for y in (0.04 * U, 0.08 * U**2):
        fits = [fit(MODELS["linear"], U, y[None], W)] if y[0] == 0.04 * U[0] else [fit(MODELS["power"], U, y[None], W)]
        assert benchmark_doses(fits, np.ones((1, 1)), 0.02)[0][0] == pytest.approx(0.5, rel=1e-3)
    noisy = 0.04 * U + np.random.default_rng(0).normal(0, 0.002, (1000, 5))
    fits = fit_all(U, noisy, W)
    bmd, reached = benchmark_doses(fits, weights(fits), 0.02)
    assert bmd.shape == (1000,) and reached.all()
    assert np.median(bmd) == pytest.approx(0.5, rel=0.05)
