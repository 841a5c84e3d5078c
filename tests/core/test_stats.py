"""Intervals by hand: Student's t quantiles against printed tables, the small-sample expansion, and a bootstrap whose
resamples can be enumerated."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8probe.core.stats import bootstrap_interval, expansion, t_quantile


@pytest.mark.parametrize(
    "p, df, table",
    [
        (0.95, 1, 6.3138),
        (0.975, 1, 12.7062),
        (0.95, 3, 2.3534),
        (0.95, 10, 1.8125),
        (0.975, 30, 2.0423),
        (0.95, 1000, 1.6464),
    ],
)
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
    # the widened ends (0.5 -/+ 3.84) kept within the values a mean of values in [0, 1] can take
    assert bootstrap_interval([7, 7, 3, 3], lambda i: values[i].mean(), bounds=(0.0, 1.0)) == (0.0, 1.0)


def test_metric_intervals_stay_where_each_metric_lives():
    """Two prompts: the expansion would put the low end of a KL below 0 and the high end of top1_agree above 1; each
    metric's interval stops at the values it can take (core/metrics), k1 (a difference of log-probs) may go below."""
    import torch

    from fp8probe.core.metrics import metric
    from fp8probe.measurement.mismatch import RefRows, metric_interval, token_stats

    g = torch.Generator().manual_seed(0)
    ref = torch.log_softmax(torch.randn(8, 50, generator=g), -1)
    cand = ref.clone()
    cand[4:] = torch.log_softmax(ref[4:] + 3 * torch.randn(4, 50, generator=g), -1)  # prompt 1 only: KL, flips
    tokens = torch.multinomial(ref.exp(), 1, generator=g).squeeze(-1)
    stats = token_stats(RefRows.from_logp(ref, tokens), cand)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    for name, low, high in (
        ("kl_q_p", 0.0, math.inf),
        ("top1_agree", 0.0, 1.0),
        ("token_mult_prob_error", 1.0, math.inf),
    ):
        lo, hi = metric_interval(stats, groups, name)
        assert (metric(name).low, metric(name).high) == (low, high) and low <= lo <= hi <= high
    assert metric_interval(stats, groups, "kl_q_p")[0] == 0.0 and metric_interval(stats, groups, "top1_agree")[1] == 1
    assert metric_interval(stats, groups, "k1")[0] < 0


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
