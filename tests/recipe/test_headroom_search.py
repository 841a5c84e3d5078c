"""The peer table's headroom search (benchmarks/evolve.py) reaches the brute-force optimum on a small case with
interactions."""

import itertools

import numpy as np
import pytest
from conftest import benchmark

from fp8probe.core.errors import FP8ProbeError

_evolve = benchmark("evolve")
Strategy, evolve = _evolve.Strategy, _evolve.evolve


def _case(seed, n=12):
    """n groups with sizes and single costs, and pair interactions (some pairs cheap alone and expensive together,
    some cancelling): the best set under a size target is not the cheapest-per-byte prefix."""
    rng = np.random.default_rng(seed)
    size = rng.integers(1, 6, n).astype(float)
    cost = rng.lognormal(0, 0.6, n)
    pair = np.triu(rng.normal(0, 0.4, (n, n)), 1)
    pair[0, 1] = pair[2, 3] = 6.0  # two pairs that look cheap alone
    cost[:4] *= 0.2

    def value(s):
        return sum(size[i] for i in s)

    def fitness(s):
        idx = sorted(s)
        return float(sum(cost[i] for i in idx) + sum(pair[i, j] for i, j in itertools.combinations(idx, 2)))

    need = 0.6 * size.sum()
    return list(range(n)), value, fitness, need


def _brute(items, value, fitness, need):
    best = (np.inf, None)
    for r in range(len(items) + 1):
        for c in itertools.combinations(items, r):
            s = frozenset(c)
            if value(s) >= need:
                best = min(best, (fitness(s), sorted(s)), key=lambda t: t[0])
    return best


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_search_reaches_the_brute_force_optimum(seed):
    items, value, fitness, need = _case(seed)
    f_opt, _ = _brute(items, value, fitness, need)
    # start from the cheapest-per-byte prefix by single costs (the selection's answer), which the pairs mislead
    per_byte = sorted(items, key=lambda i: fitness({i}) / value({i}))
    start = set()
    for i in per_byte:
        if value(start) >= need:
            break
        start.add(i)
    assert fitness(frozenset(start)) > f_opt + 1e-9  # the case is not trivial
    got = evolve(items, value, need, fitness, frozenset(start), evaluations=600, strategy=Strategy(seed=seed))
    assert got.fitness == pytest.approx(f_opt, abs=1e-9)
    assert value(got.best) >= need and got.evaluations <= 600
    # the parent's fitness never rises
    fs = [f for _, f in got.history]
    assert all(b <= a for a, b in zip(fs, fs[1:]))


def test_a_start_that_misses_the_target_is_refused():
    items, value, fitness, need = _case(0)
    with pytest.raises(FP8ProbeError, match="memory target"):
        evolve(items, value, need, fitness, frozenset([0]), evaluations=10)
