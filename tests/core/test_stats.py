"""Intervals by hand: Student's t quantiles against printed tables, the small-sample expansion, and a bootstrap whose
resamples can be enumerated."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8probe.core.stats import bootstrap_interval, expansion, t_quantile


@pytest.mark.parametrize("p, df, table", [(0.95, 1, 6.3138), (0.975, 1, 12.7062), (0.95, 3, 2.3534),
                                          (0.95, 10, 1.8125), (0.975, 30, 2.0423), (0.95, 1000, 1.6464)])
def test_t_quantiles_match_the_tables(p, df, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=1e-4)
    assert t_quantile(1 - p, df) == pytest.approx(-table, abs=1e-4)


def test_expansion_by_hand():
    # sqrt(4 / 3) x t(0.95, 3) / z(0.95) = 1.1547 x 2.3534 / 1.6449
    assert expansion(4) == pytest.approx(math.sqrt(4 / 3) * 2.353363 / 1.644854, rel=1e-5)
    assert expansion(16) == pytest.approx(1.10073, rel=1e-4) and 1 < expansion(1000) < 1.002
    assert expansion(1) == math.inf


def test_bootstrap_of_two_groups_is_their_enumerated_resamples():
    """Two prompts, one of value 0 and one of 1 (two tokens each): a resample is {0,0}, {0,1} or {1,1} with
    probabilities 1/4, 1/2, 1/4, so the 5 % and 95 % quantiles are 0 and 1, then widened about the point 0.5 by
    expansion(2) = sqrt(2) x t(0.95, 1) / z(0.95)."""
    values = np.array([0.0, 0.0, 1.0, 1.0])
    lo, hi = bootstrap_interval([7, 7, 3, 3], lambda i: values[i].mean())
    f = math.sqrt(2) * 6.313752 / 1.644854
    assert lo == pytest.approx(0.5 - 0.5 * f, rel=1e-5) and hi == pytest.approx(0.5 + 0.5 * f, rel=1e-5)
    assert bootstrap_interval([1, 1, 1, 1], lambda i: values[i].mean()) == (0.5, 0.5)  # one group: the point


def test_bootstrap_width_is_the_normal_theory_width():
    """For the mean of n equal-sized groups the interval's width is about 2 x z(0.95) x SE x expansion(n), with the
    bootstrap's SE = sd(group means) x sqrt((n - 1) / n) / sqrt(n): it narrows as 1 / sqrt(n)."""
    rng = np.random.default_rng(1)
    for n in (25, 400):
        values = rng.exponential(size=n * 3)
        lo, hi = bootstrap_interval(np.repeat(np.arange(n), 3), lambda i: values[i].mean())
        means = values.reshape(n, 3).mean(1)
        se = means.std(ddof=0) / math.sqrt(n)
        assert lo < values.mean() < hi
        assert hi - lo == pytest.approx(2 * 1.644854 * se * expansion(n), rel=0.1)
