"""Mismatch across training: one rollout configuration checked at a series of checkpoints of the student.

A recipe is chosen at one step of training; the student moves. verl PR #7519 saw tensorwise-FP8 rollout KL grow 3.1x
over 32 training steps while MXFP8's stayed flat. `fp8probe check --checkpoints C1 C2 ...` measures the configuration
at each checkpoint on rollouts re-sampled from that checkpoint (the same prompts and seed: what the student would
generate then), each figure with its 90 % interval over the prompts and its verdict against the budget; the trend
is the ratio of the last checkpoint's figure to the first's, with a bootstrap interval (the two sets of prompts
resampled independently: the rollouts differ), and the first checkpoint whose verdict is REJECT is where the
configuration leaves the budget.
"""

from __future__ import annotations

from ..core.metrics import excess
from ..core.stats import BOOTSTRAP, LEVEL, group_members
from .admission import judge
from .evidence import Verdict
from .fit import Budget


def measure_point(bench, config, budget: Budget, engine: str = "sim"):
    """(the row series.json holds for one checkpoint, measured on its bench, the Measured behind it)."""
    from ..measurement.measure import measure

    engine = budget.scale["engine"] if budget.scale else engine  # the verdict's figure on the budget's scale
    got = measure(bench, config.perturbation, engine=engine)
    measured = excess(budget.metric, got.metrics[budget.metric])
    interval = got.excess_interval(budget.metric)
    v = judge(measured, tuple(interval), budget, got.num_prompts, config.config)
    return {
        "measured": measured,
        "measured_interval": list(interval),
        "verdict": v.verdict,
        "num_prompts": got.num_prompts,
        "num_response_tokens": int(got.prompt.numel()),
    }, got


def ratio_interval(
    first, last, metric: str, n: int = BOOTSTRAP, level: float = LEVEL, seed: int = 0
) -> tuple[float, float, float]:
    """last / first on `metric` (two Measured on different rollouts) and its percentile bootstrap interval: each
    draw resamples the prompts of both, independently."""
    import numpy as np

    from ..measurement.mismatch import metric_over

    rng = np.random.default_rng(seed)
    draws = []
    fns = []
    for m in (first, last):
        _, r = metric_over(m.stats, metric)
        fns.append((r, group_members(m.prompt.numpy())))

    def value(r, members, pick):
        return excess(metric, float(r(np.concatenate([members[g] for g in pick]))))

    point = [value(r, ms, np.arange(len(ms))) for r, ms in fns]
    for _ in range(n):
        a, b = (value(r, ms, rng.integers(0, len(ms), len(ms))) for r, ms in fns)
        draws.append(b / a if a > 0 else np.inf)
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return (point[1] / point[0] if point[0] > 0 else float("inf")), float(lo), float(hi)


def summarize_series(rows: list[dict], first, last, metric: str) -> dict:
    """The trend (last / first, its interval) and the first checkpoint outside the budget (REJECT), or None."""
    ratio, lo, hi = ratio_interval(first, last, metric)
    out = next((r["checkpoint"] for r in rows if r["verdict"] == Verdict.REJECT), None)
    grows = "grows" if lo > 1 else "falls" if hi < 1 else "cannot be told from flat"
    return {
        "trend": {"ratio_last_first": ratio, "interval": [lo, hi], "reading": grows},
        "first_outside": out,
        "first_uncertain": next((r["checkpoint"] for r in rows if r["verdict"] == Verdict.UNCERTAIN), None),
    }
