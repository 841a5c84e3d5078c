"""The damage model (recipe/damage.py): a known link and known per-group terms recovered from noisy combinations, and
its predictions on combinations it was not fitted on."""

import math

import numpy as np
import pytest

from fp8probe.core.errors import FP8ProbeError
from fp8probe.recipe.damage import damage_to_sum, fit_damage, link, prediction_errors, random_recipes


def _truth(n=30, seed=0):
    rng = np.random.default_rng(seed)
    prior = {f"g{i}": float(v) for i, v in enumerate(rng.lognormal(-6, 0.8, n))}  # single-group costs ~ 1e-3 .. 1e-2
    eps = np.zeros(n)
    eps[:3] = [1.0, -1.0, 0.8]  # three groups whose cost in combination is far from their prior
    u = {g: 1.7 * p * math.exp(e) for (g, p), e in zip(prior.items(), eps)}
    return prior, u


def _measure(sets, u, rho, noise, seed):
    rng = np.random.default_rng(seed)
    return [float(link(sum(u[g] for g in s), rho)) * math.exp(noise * rng.standard_normal()) for s in sets]


@pytest.mark.parametrize("rho", [25.0, 0.0, -8.0])
def test_the_fit_recovers_a_known_link_and_terms(rho):
    prior, u = _truth()
    names = list(prior)
    sets = random_recipes(names, [3, 8, 15, 22, 27], 24, seed=1)
    model = fit_damage(sets, _measure(sets, u, rho, 0.02, 2), prior)
    # the link: its curvature (the whole model's sum is about 0.1: rho 25 halves the damage there)
    assert model.rho == pytest.approx(rho, abs=3.0)
    # the per-group terms, including the three the prior misjudges by e (x 2.7 or / 2.7)
    got = model.terms()
    for g in names[:3]:
        assert got[g] == pytest.approx(u[g], rel=0.25), g
    rel = np.array([got[g] / u[g] - 1 for g in names])
    assert np.median(np.abs(rel)) < 0.1
    # combinations it was not fitted on (other sizes too)
    held = random_recipes(names, [5, 12, 20], 20, seed=3)
    err = prediction_errors(model, held, _measure(held, u, rho, 0.0, 4))
    assert err["median"] < 0.03 and err["p90"] < 0.08


def test_the_plain_sum_is_what_a_saturating_truth_is_not():
    """Against the same data, the model without its link (the sum of the prior terms, rescaled) errs by far more:
    the link is what the fit needs."""
    prior, u = _truth()
    names = list(prior)
    sets = random_recipes(names, [3, 8, 15, 22, 27], 24, seed=1)
    measured = _measure(sets, u, 25.0, 0.02, 2)
    model = fit_damage(sets, measured, prior)
    held = random_recipes(names, [5, 12, 20, 27], 15, seed=3)
    truth = _measure(held, u, 25.0, 0.0, 4)
    additive = np.array([sum(u[g] for g in s) for s in held])
    assert np.median(np.abs(additive / truth - 1)) > 0.3
    assert prediction_errors(model, held, truth)["median"] < 0.03


def test_the_inverse_link_and_its_limits():
    for rho in (30.0, 0.0, -5.0):
        for d in (1e-4, 0.01, 0.03):
            assert float(link(damage_to_sum(d, rho), rho)) == pytest.approx(d, rel=1e-9)
    assert damage_to_sum(0.05, 30.0) == math.inf  # saturates at 1/30 < 0.05: never reached
    assert float(link(0.01, 1e-15)) == pytest.approx(0.01)


def test_too_few_combinations_are_refused():
    prior, _ = _truth(5)
    with pytest.raises(FP8ProbeError, match="at least 4"):
        fit_damage([["g0"], ["g1"], ["g0", "g1"]], [1e-3, 2e-3, 3e-3], prior)
    with pytest.raises(FP8ProbeError, match="no prior cost"):
        fit_damage([["g0"], ["g1"], ["gx"], ["g2"]], [1e-3] * 4, prior)
