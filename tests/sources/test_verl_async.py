"""verl's fully-async keys as lags (core/verl_lags.py): by hand, and against a simulation of the rule verl 0.9.1's
rollouter runs (verl/experimental/fully_async_policy/fully_async_rollouter.py: at most required_samples x
(staleness_threshold + 1) x trigger_parameter_sync_step samples per weight version, the ones still queued at a sync
counted against the next version's allowance, the trainer taking required_samples per step first in first out); its
v1 trainer's separate_async keys the same way, at the end."""

from __future__ import annotations

import collections
import math

import pytest

from fp8probe.core import verl_lags
from fp8probe.core.errors import FP8ProbeError
from fp8probe.core.verl_lags import VerlAsync, VerlV1Async, VerlV1Colocate, parse_verl_async


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


# ----------------------------------------------------------------------------------------------------
# verl's v1 trainer, separate_async (verl/trainer/ppo/v1: trainer_base.py, trainer_separate_async.py, replay_buffer.py)


def _simulated_v1_lags(sync: int, warmup: float, decoupled: bool, steps: int = 200) -> dict[int, float]:
    """The lag (optimizer updates) of every mini-batch the trainer takes under the v1 loop, a rollout that is never
    the bottleneck: _add_async_warmup_batches adds floor(warmup x train / gen) x gen prompts before step 1
    (gen_batch_size = train_batch_size, verl's default), prepare_step adds one train batch at each step's start
    tagged with the step, each generated at once with the weights last synced (update_weights at the previous
    step's end), the replay buffer hands out the oldest prompts first, S mini-batches a step (one local update
    each); decoupled: the lag to the weights of the step's start (the recomputed old log-probs), else to the
    weights of the update itself."""
    train = sync  # prompts per train batch, in mini-batches
    queue: collections.deque = collections.deque()
    seen = collections.Counter()
    synced = 0  # updates the rollout's weights have seen
    # _add_async_warmup_batches: floor(W x train_batch_size / gen_batch_size) chunks of gen_batch_size prompts, and
    # _init_dataloader sets gen_batch_size to 1 in the async modes (trainer_base.py, verl 0.9.1)
    queue.extend([(1, synced)] * math.floor(warmup * train))
    for step in range(1, steps + 1):
        queue.extend([(step, synced)] * train)  # prepare_step: _add_batch_to_generate, generated at once
        for j in range(sync):
            tag, version = queue.popleft()  # oldest first (_select_prompt_uids)
            assert step - tag + 1 <= 8  # inside verl's default max_off_policy_threshold: nothing dropped
            done = (step - 1) * sync + (0 if decoupled else j)
            if step > steps // 4:
                seen[done - version] += 1
        synced = step * sync  # on_step_end: update_weights
    total = sum(seen.values())
    return {k: n / total for k, n in sorted(seen.items())}


@pytest.mark.parametrize("sync, warmup", [(4, 1), (4, 2), (2, 1.5), (1, 1), (3, 0)])
@pytest.mark.parametrize("decoupled", [False, True])
def test_v1_trainer_bound_lags_are_verls_loop(sync, warmup, decoupled):
    want = _simulated_v1_lags(sync, warmup, decoupled)
    got = VerlV1Async(sync, warmup, 8, decoupled).lags("trainer-bound")
    assert set(got) == set(want), (got, want)
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-9), (k, got, want)


def test_v1_lags_by_hand():
    """verl's shipped yaml (parameter_sync_step 4, one warmup batch): the trainer-bound batch was generated one step
    (4 updates) before its step began, so its 4 mini-batches meet weights 4, 5, 6 and 7 updates newer (bypass), or
    the step's start, 4 (decoupled); rollout-bound, 0-3 and 0."""
    a = VerlV1Async.parse("v1:sync=4,warmup=1")
    assert a == VerlV1Async(4, 1.0, 8, False) and a.trigger == 4 and a.partial  # every sync resumes
    assert a.lags("trainer-bound") == {4: 0.25, 5: 0.25, 6: 0.25, 7: 0.25}
    assert a.lags("rollout-bound") == {0: 0.25, 1: 0.25, 2: 0.25, 3: 0.25}
    d = parse_verl_async("v1:sync=4,warmup=1,max_off_policy=none,decoupled")
    assert d.lags("trainer-bound") == {4: 1.0} and d.lags("rollout-bound") == {0: 1.0} and d.max_off_policy is None
    s = a.summary("trainer-bound")
    assert (s["p50"], s["p90"], s["max"], s["mean"]) == (5, 7, 7, 5.5)
    assert parse_verl_async("trigger=4,staleness=0.1") == VerlAsync(4, 0.1)


@pytest.mark.parametrize(
    "text, says",
    [
        ("trigger=4", "both needed"),
        ("trigger=0,staleness=0.1", "trigger must be >= 1"),
        ("trigger=4,staleness=-1", "staleness >= 0"),
        ("trigger=4,staleness=0.1,fast", "not 'fast'"),
        ("trigger=x,staleness=0.1", "both needed"),
        ("v1:warmup=1", "sync .* is needed"),
        ("v1:sync=0", "sync >= 1"),
        ("v1:sync=4,warmup=8,max_off_policy=8", "verl would drop every batch"),
        ("v1:sync=4,fast", "not 'fast'"),
        ("v2:sync=4", "the modes are 'v1'"),
        ("v1-colocate:warmup=8,max_off_policy=8", "verl would drop every batch"),
        ("v1-colocate:warmup=1,sync=4", "not 'sync=4'"),
        ("v1-colocate:batch=0", "batch >= 1"),
        ("v1-colocate:warmup=x", "W a number"),
    ],
)
def test_bad_keys_are_one_line(text, says):
    with pytest.raises(FP8ProbeError, match=says):
        parse_verl_async(text)


def test_colocate_with_responses_alike_by_hand():
    """colocate_async with every response alike (verl's loop: W batches queued first, one more each step, the rollout
    generating until a batch is finished, the oldest finished taken): W = 1 queues two batches that finish together,
    one is taken at once (lag 0), the other waits a step (lag 1), and the next phase starts both fresh again: half and
    half. W = 2: thirds at lags 0, 1 and 2 (up to the simulated window's 224 steps); W = 0 is synchronous. Groups
    whose wait spans more than max_off_policy steps are dropped: W = 2 with max_off_policy 2 (built directly: parse
    refuses it) drops one group every second step, a third of the finished groups, each replaced by a new prompt."""
    one = parse_verl_async("v1-colocate:warmup=1")
    assert one == VerlV1Colocate(1.0, 8, 64) and one.trigger == 1 and not one.partial
    assert one.lags() == {0: 0.5, 1: 0.5} and one.regimes == ("scheduled",) and one.dropped == 0.0
    two = VerlV1Colocate(2.0, 8, 4).lags()
    assert sorted(two) == [0, 1, 2] and all(v == pytest.approx(1 / 3, abs=0.01) for v in two.values())
    assert VerlV1Colocate(0.0, 8, 4).lags() == {0: 1.0}
    # verl 0.9.1 queues floor(1.5 x 4) = 6 warm-up prompts (its async modes set gen_batch_size 1): the 10 queued
    # finish together, 4 are taken (lag 0), 4 the next step (lag 1), the last 2 wait for the step after, beside 2
    # fresh ones (lags 2 and 0), and the pattern repeats every two steps: a quarter at 0 and 2, half at 1
    assert VerlV1Colocate(1.5, 8, 4).lags() == pytest.approx({0: 0.25, 1: 0.5, 2: 0.25}, abs=0.01)
    tight = VerlV1Colocate(2.0, 2, 1)
    assert tight.lags() == pytest.approx({0: 0.5, 1: 0.5}, abs=0.01)
    assert tight.dropped == pytest.approx(119 / 359)  # drops at steps 3, 5, .., 239; 240 groups taken
    assert VerlV1Colocate.parse(one.key()) == one


def test_colocate_schedule_of_two_lengths_by_hand(monkeypatch):
    """A pool of two one-response groups, 4 and 8 tokens, drawn in the seeded shuffle (numpy's default_rng(0)
    permutations of two: [0, 1] three times, then [1, 0]; draws pop from the end: 8, 4, 8, 4, 8, 4), one group a
    batch, one warmup batch, five steps, none left out. By hand: step 1 runs the 8 (warmup) and the 4 for 4 ticks,
    takes the 4 (4 tokens at lag 0) and aborts the 8 halfway; step 2 finishes it (4 tokens at lag 1, 4 at lag 0)
    while the new 8 makes 4; step 3 finishes that 8 and the new 4 at the same tick, takes the 8 (4 at lag 1, 4 at
    lag 0); step 4 takes the waiting 4 without generating (4 at lag 1); step 5 runs a new 4 to the end (4 at lag 0).
    Lag 0: 16 tokens, lag 1: 12. Seen failing with the aborted requests' tokens left unstamped and with the sampler
    taking the newest finished group first."""
    monkeypatch.setattr(verl_lags, "SCHEDULED_STEPS", 5)
    monkeypatch.setattr(verl_lags, "SETTLING_STEPS", 0)
    spec = VerlV1Colocate(1.0, 8, 1, ((4,), (8,)))
    assert spec.schedule()["lags"] == {0: 16 / 28, 1: 12 / 28}


def test_colocate_on_the_rollouts_takes_each_prompts_response_lengths():
    """on(rollouts): one tuple per prompt group (its samples' response lengths), in the groups' order; the other modes
    are the same keys on any rollouts."""
    import torch

    from fp8probe.model.rollouts import Rollouts

    r = Rollouts.from_sequences([[1, 2], [1, 2], [3]], [[5, 6, 7], [5], [8, 9]], pad=0)
    assert VerlV1Colocate().on(r).lengths == ((3, 1), (2,))
    a = VerlV1Async(4)
    assert a.on(r) is a
    assert torch.equal(r.prompt_groups(), torch.tensor([0, 0, 1]))
