"""Statistics shared by every layer: rank agreement (Spearman's rho, top-k overlap)."""

from __future__ import annotations

import math
from statistics import NormalDist


def spearman(a, b) -> float:
    """Spearman's rank correlation of two equal-length sequences (average ranks for ties)."""
    import pandas as pd

    sa, sb = pd.Series(list(a), dtype=float), pd.Series(list(b), dtype=float)
    return float(sa.rank().corr(sb.rank()))


def top_overlap(a: dict[str, float], b: dict[str, float], k: int = 10) -> int:
    """How many of the k highest-scoring keys of `a` are among the k highest of `b`."""
    ta = sorted(a, key=a.get, reverse=True)[:k]
    tb = set(sorted(b, key=b.get, reverse=True)[:k])
    return sum(1 for x in ta if x in tb)


BOOTSTRAP = 2000  # resamples behind every interval fp8probe reports
LEVEL = 0.9  # the intervals' coverage: 90 %


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""

    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (bisection on its CDF; no scipy needed)."""

    def cdf(t: float) -> float:
        tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
        return 1 - tail if t >= 0 else tail

    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def expansion(n: int, level: float = LEVEL) -> float:
    """How much wider than its percentiles a bootstrap interval over n groups is made: sqrt(n / (n - 1)) x
    t_{n-1} / z, after Hesterberg's expanded percentile interval (which moves the percentiles; this widens the
    half-widths about the point by the same factor). The plain percentile interval is too narrow for few groups (it
    forgets the n-1 and the t tails): on a tiny model, 4 prompts gave an interval that the estimate from 20 prompts
    fell outside of. 1.65 at n = 4, 1.10 at n = 16, 1.01 at n = 100."""

    if n < 2:
        return math.inf
    return math.sqrt(n / (n - 1)) * t_quantile((1 + level) / 2, n - 1) / NormalDist().inv_cdf((1 + level) / 2)


def group_members(groups) -> list:
    """The item indices of each group (a token's prompt), groups in sorted order: what a bootstrap over the groups
    draws from."""
    import numpy as np

    labels = np.asarray(groups)
    if not labels.size:
        return []
    _, inverse = np.unique(labels, return_inverse=True)
    return [np.flatnonzero(inverse == g) for g in range(int(inverse.max()) + 1)]


def bootstrap_interval(
    groups,
    statistic,
    n: int = BOOTSTRAP,
    level: float = LEVEL,
    seed: int = 0,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> tuple[float, float]:
    """A bootstrap interval of `statistic(index)` over groups resampled with replacement: the percentile interval,
    widened about the point estimate by `expansion` (few groups), and kept within `bounds`, the values the
    statistic can take (the widening would put a KL's low end below 0 on two prompts).

    `groups` labels each item (a token's prompt); a resample draws as many groups as there are, with replacement, and
    hands `statistic` the indices of their items (a group drawn twice counts twice). Tokens of one rollout are not
    independent (one prefix, one sampled path), nor are rollouts of one prompt; prompts are, so they are what is
    resampled. With one group there is nothing to resample: the interval is the point."""
    import numpy as np

    labels = np.asarray(groups)
    members = group_members(labels)
    point = float(statistic(np.arange(labels.size)))
    if len(members) < 2:
        return point, point
    rng = np.random.default_rng(seed)
    values = np.empty(n)
    for i in range(n):
        pick = rng.integers(0, len(members), len(members))
        values[i] = statistic(np.concatenate([members[g] for g in pick]))
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    f = expansion(len(members), level)
    low, high = bounds
    return float(max(point - f * (point - lo), low)), float(min(point + f * (hi - point), high))


POWER = 0.9  # prompts_to_decide: enough for the interval to clear the budget 9 times in 10 if the value stays put


def decide_factor(level: float = LEVEL, power: float = POWER) -> float:
    """How much more than the square-root law's count a decision needs: ((z_level + z_power) / z_level)^2 (3.17 at
    a 90 % interval and 90 % power). The square-root law alone (an interval that just touches the budget) would
    decide only half the time, since the estimate moves as much as its interval narrows."""
    z_level, z_power = NormalDist().inv_cdf((1 + level) / 2), NormalDist().inv_cdf(power)
    return ((z_level + z_power) / z_level) ** 2
