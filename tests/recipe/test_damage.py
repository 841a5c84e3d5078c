"""The damage model (benchmarks/damage.py: the peer table's `--costs damage` row, damage_model.py's predictors): a
known link and known per-group terms recovered from noisy combinations, and its predictions on combinations it was
not fitted on."""

import json
import math

import numpy as np
import pytest
from conftest import benchmark

from fp8probe.core.errors import FP8ProbeError

dm = benchmark("damage")


def _truth(n=30, seed=0):
    rng = np.random.default_rng(seed)
    prior = {f"g{i}": float(v) for i, v in enumerate(rng.lognormal(-6, 0.8, n))}  # single-group costs ~ 1e-3 .. 1e-2
    eps = np.zeros(n)
    eps[:3] = [1.0, -1.0, 0.8]  # three groups whose cost in combination is far from their prior
    u = {g: 1.7 * p * math.exp(e) for (g, p), e in zip(prior.items(), eps)}
    return prior, u


def _measure(sets, u, rho, noise, seed):
    rng = np.random.default_rng(seed)
    return [float(dm.link(sum(u[g] for g in s), rho)) * math.exp(noise * rng.standard_normal()) for s in sets]


@pytest.mark.parametrize("rho", [25.0, 0.0, -8.0])
def test_the_fit_recovers_a_known_link_and_terms(rho):
    prior, u = _truth()
    names = list(prior)
    sets = dm.random_recipes(names, [3, 8, 15, 22, 27], 24, seed=1)
    model = dm.fit_damage(sets, _measure(sets, u, rho, 0.02, 2), prior)
    # the link: its curvature (the whole model's sum is about 0.1: rho 25 halves the damage there)
    assert model.rho == pytest.approx(rho, abs=3.0)
    # the per-group terms, including the three the prior misjudges by e (x 2.7 or / 2.7)
    got = model.terms()
    for g in names[:3]:
        assert got[g] == pytest.approx(u[g], rel=0.25), g
    rel = np.array([got[g] / u[g] - 1 for g in names])
    assert np.median(np.abs(rel)) < 0.1
    # combinations it was not fitted on (other sizes too)
    held = dm.random_recipes(names, [5, 12, 20], 20, seed=3)
    err = dm.prediction_errors(model, held, _measure(held, u, rho, 0.0, 4))
    assert err["median"] < 0.03 and err["p90"] < 0.08


def test_the_plain_sum_is_what_a_saturating_truth_is_not():
    """Against the same data, the model without its link (the sum of the prior terms, rescaled) errs by far more:
    the link is what the fit needs."""
    prior, u = _truth()
    names = list(prior)
    sets = dm.random_recipes(names, [3, 8, 15, 22, 27], 24, seed=1)
    measured = _measure(sets, u, 25.0, 0.02, 2)
    model = dm.fit_damage(sets, measured, prior)
    held = dm.random_recipes(names, [5, 12, 20, 27], 15, seed=3)
    truth = _measure(held, u, 25.0, 0.0, 4)
    additive = np.array([sum(u[g] for g in s) for s in held])
    assert np.median(np.abs(additive / truth - 1)) > 0.3
    assert dm.prediction_errors(model, held, truth)["median"] < 0.03


def test_the_inverse_link_and_its_limits():
    for rho in (30.0, 0.0, -5.0):
        for d in (1e-4, 0.01, 0.03):
            assert float(dm.link(dm.damage_to_sum(d, rho), rho)) == pytest.approx(d, rel=1e-9)
    assert dm.damage_to_sum(0.05, 30.0) == math.inf  # saturates at 1/30 < 0.05: never reached
    assert float(dm.link(0.01, 1e-15)) == pytest.approx(0.01)


def test_too_few_combinations_are_refused():
    prior, _ = _truth(5)
    with pytest.raises(FP8ProbeError, match="at least 4"):
        dm.fit_damage([["g0"], ["g1"], ["g0", "g1"]], [1e-3, 2e-3, 3e-3], prior)
    with pytest.raises(FP8ProbeError, match="no prior cost"):
        dm.fit_damage([["g0"], ["g1"], ["gx"], ["g2"]], [1e-3] * 4, prior)


def _pairwise_truth(n=30, seed=0):
    """A mismatch with known pairwise interactions, each group its own: D(R) = Σ a_i − Σ_{i<j in R} a_i a_j (β_i + β_j)
    / Σ a, with β_i from −1 (compounds) to 2 (saturates); its single and leave-one-out-of-everything costs exactly."""
    rng = np.random.default_rng(seed)
    a, beta = rng.lognormal(-6, 0.8, n), rng.uniform(-1.0, 2.0, n)
    w = np.outer(a, a) * (beta[:, None] + beta[None, :]) / a.sum()
    np.fill_diagonal(w, 0)
    names = [f"g{i}" for i in range(n)]
    idx = {g: i for i, g in enumerate(names)}

    def damage(s):
        r = [idx[g] for g in s]
        return float(a[r].sum() - w[np.ix_(r, r)].sum() / 2)

    whole = damage(names)
    return names, damage, {g: damage([g]) for g in names}, {g: whole - damage(set(names) - {g}) for g in names}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_in_context_costs_predict_per_group_interactions_the_link_cannot(seed):
    """Groups that saturate or compound each by their own amount: one link bends them all alike and misses recipes
    by 4-7 % (median); with each group's cost left out of the whole model in FP8 the model follows them (the
    in-context term), within 2.5 %, and survives recipe.json's round trip."""
    names, damage, single, loo = _pairwise_truth(seed=seed)
    sets = dm.random_recipes(names, [3, 8, 15, 22, 27], 24, seed=1)
    measured = [damage(s) for s in sets]
    held = dm.random_recipes(names, [5, 12, 20, 26], 20, seed=3)
    truth = [damage(s) for s in held]
    plain = dm.prediction_errors(dm.fit_damage(sets, measured, single), held, truth)["median"]
    model = dm.fit_damage(sets, measured, single, context=loo)
    got = dm.prediction_errors(model, held, truth)["median"]
    assert got < 0.025 and got < plain / 2.5, (got, plain)
    again = dm.DamageModel.from_json(json.loads(json.dumps(model.to_json())))
    assert [again.predict(s) for s in held] == pytest.approx([model.predict(s) for s in held], rel=1e-12)


def test_the_prior_may_be_in_other_units():
    """The prior costs are only proportional to the mismatch (a sweep's fast estimate, path attributions in other
    units): k rescales them, in the link's plain sum and in the in-context term alike. With the single and in-context
    costs given 1,000x too large, k is fitted 1/1,000 and the held-out recipes are predicted as well as with the
    costs in the measured units (within 2.5 %). Seen failing with the in-context term left unscaled by k in
    dm.DamageModel.predict (65 %)."""
    names, damage, single, loo = _pairwise_truth(seed=0)
    sets = dm.random_recipes(names, [3, 8, 15, 22, 27], 24, seed=1)
    measured = [damage(s) for s in sets]
    held = dm.random_recipes(names, [5, 12, 20, 26], 20, seed=3)
    truth = [damage(s) for s in held]
    same = dm.fit_damage(sets, measured, single, context=loo)
    other = dm.fit_damage(
        sets, measured, {g: 1000 * v for g, v in single.items()}, context={g: 1000 * v for g, v in loo.items()}
    )
    assert other.k == pytest.approx(same.k / 1000, rel=0.05)
    got = dm.prediction_errors(other, held, truth)["median"]
    assert got < 0.025, got
    assert [other.predict(s) for s in held] == pytest.approx([same.predict(s) for s in held], rel=0.02)


def test_in_context_costs_must_cover_the_prior():
    prior, _ = _truth(5)
    with pytest.raises(FP8ProbeError, match="in-context costs"):
        dm.fit_damage([["g0"], ["g1"], ["g2"], ["g0", "g1"]], [1e-3, 2e-3, 1e-3, 3e-3], prior, context={"g0": 1e-3})
