"""verl's fully-async keys as lags (sources/verl_async.py): by hand, and against a simulation of the rule verl 0.9.1's
rollouter runs (verl/experimental/fully_async_policy/fully_async_rollouter.py: at most required_samples x
(staleness_threshold + 1) x trigger_parameter_sync_step samples per weight version, the ones still queued at a sync
counted against the next version's allowance, the trainer taking required_samples per step first in first out)."""

from __future__ import annotations

import collections

import pytest

from fp8probe.core.errors import FP8ProbeError
from fp8probe.sources.verl_async import VerlAsync


def _simulated_lags(trigger: int, staleness: float, required: int, steps: int = 400) -> dict[int, float]:
    """The lag of every sample the trainer takes, a rollouter that is never the bottleneck (it fills its allowance
    between trainer steps), after a burn-in of a quarter of the steps."""
    allowance = int(required * (staleness + 1) * trigger)  # set_max_required_samples
    queue: collections.deque = collections.deque()
    version, produced, seen = 0, 0, collections.Counter()
    for step in range(steps):
        while produced < allowance:  # the rollouter pauses once staleness_samples reaches max_required_samples
            queue.append(version)
            produced += 1
        for _ in range(required):
            v = queue.popleft()
            if step >= steps // 4:
                seen[step - v * trigger] += 1
        if (step + 1) % trigger == 0:  # a parameter sync: the next version's allowance counts what is still queued
            version += 1
            produced = len(queue)
    total = sum(seen.values())
    return {k: n / total for k, n in sorted(seen.items())}


@pytest.mark.parametrize("trigger, staleness", [(4, 0.1), (4, 0.5), (2, 1.5), (3, 0.0), (1, 2.0)])
def test_trainer_bound_lags_are_verls_rollouter_rule(trigger, staleness):
    want = _simulated_lags(trigger, staleness, required=40)
    got = VerlAsync(trigger, staleness).lags("trainer-bound")
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=0.01), (k, got, want)


def test_lags_and_their_summary_by_hand():
    """verl's shipped yaml (trigger 4, staleness 0.1): S x T = 0.4, so a version's samples are trained from 0.4 steps
    after its sync on: lag 0 for 0.6 of a step's worth, 1-3 whole, 4 for 0.4, over 4: 0.15, 0.25 x 3, 0.10; 90 % of the
    samples lag 3 or less."""
    a = VerlAsync.parse("trigger=4,staleness=0.1")
    lags = a.lags("trainer-bound")
    assert lags == pytest.approx({0: 0.15, 1: 0.25, 2: 0.25, 3: 0.25, 4: 0.10})
    s = a.summary("trainer-bound")
    assert (s["p50"], s["p90"], s["max"]) == (2, 3, 4) and s["mean"] == pytest.approx(0.25 * 6 + 0.4)
    assert a.lags("rollout-bound") == {0: 0.25, 1: 0.25, 2: 0.25, 3: 0.25}
    assert VerlAsync.parse("trigger=2, staleness=1.5, partial") == VerlAsync(2, 1.5, True)


@pytest.mark.parametrize(
    "text, says",
    [
        ("trigger=4", "both needed"),
        ("trigger=0,staleness=0.1", "trigger must be >= 1"),
        ("trigger=4,staleness=-1", "staleness >= 0"),
        ("trigger=4,staleness=0.1,fast", "not 'fast'"),
        ("trigger=x,staleness=0.1", "both needed"),
    ],
)
def test_bad_keys_are_one_line(text, says):
    with pytest.raises(FP8ProbeError, match=says):
        VerlAsync.parse(text)
