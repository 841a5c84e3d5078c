"""verl's asynchronous rollouts as the lags they give each sample (the one model the export's comments and `check
--verl-async` read): `--verl-async trigger=T,staleness=S[,partial]`
(the experimental fully-async policy), `--verl-async v1:...` (the v1 trainer's separate_async, below) or
`--verl-async v1-colocate:...` (its colocate_async: VerlV1Colocate, whose lags depend on the responses' lengths).

verl 0.9.1's fully-async rollouter (verl/experimental/fully_async_policy/fully_async_rollouter.py) syncs the trainer's
weights to the rollout engine every `async_training.trigger_parameter_sync_step` (T) trainer steps, and between two
syncs lets the rollouter produce at most `max_required_samples = required_samples x (staleness_threshold + 1) x T`
samples, counting the ones still queued or in flight at the sync (`reset_staleness`). The trainer takes
`required_samples` (R) per step, first in, first out. A sample's lag is how many trainer steps the trainer is past the
weights that generated it when it trains on it; two regimes bound it:

    rollout-bound   the trainer waits for samples (the queue is empty): step i after a sync trains on samples of
                    that sync's weights, lag i, uniform on 0 .. T-1
    trainer-bound   the rollouter keeps its allowance full: S x T x R samples are queued at every sync, so a version's
                    T x R samples are trained on from S x T steps after its sync on; with R large the lag is
                    floor(S x T + u), u uniform on [0, T): from floor(S x T) to floor(S x T + T - 1/R), at most
                    T (1 + S) - 1 rounded up (verl's bound: 0 .. T (1 + S))

S = 0 gives both regimes the same 0 .. T-1.
verl 0.9.1's own default trainer (`trainer.use_v1`) has its asynchronous modes too: `--verl-async
v1:sync=S,warmup=W[,max_off_policy=M][,decoupled]` (trainer.v1.trainer_mode=separate_async,
separate_async.parameter_sync_step, num_warmup_batches, sampler.max_off_policy_threshold). Its loop
(verl/trainer/ppo/v1/trainer_base.py, trainer_separate_async.py, replay_buffer.py): a step is S local updates, one
mini-batch (train_batch_size / S) each; at the step's start one train batch of prompts joins the queue (tagged with
the step), W batches were added before the first; the trainer samples the oldest finished prompts first; at the
step's end the weights go to the rollout (update_weights aborts the requests in flight, frees the KV cache, syncs,
and resumes them: a resumed response is re-prefilled by the new weights, so only its earlier tokens' log-probs are a
sync older, a plain lag's figure), and a prompt whose span of steps exceeds M is dropped. A lag here is in optimizer
updates (local updates), which a `stale` checkpoint's age must count too:

    trainer-bound   the rollout generates each batch as soon as it joins: the queue holds W batches (Q = floor(W x S)
                    mini-batches: verl 0.9.1 queues floor(W x train_batch_size) warmup prompts, its async modes
                    forcing gen_batch_size to 1; 0.9.0 takes whole batches only), so local update j of a step trains
                    on weights Q + j updates old: uniform on Q .. Q+S-1 (a fractional W x S rounded down)
    rollout-bound   the trainer waits for samples: each was finished with the last synced weights, lag j: 0 .. S-1

With `decoupled` (verl's default Decoupled PPO: the trainer recomputes the old log-probs with the weights of the
step's start, held for all S updates) the lag that meets the rollout's log-probs is to those weights: with Q = q S + r,
q S for S - r of the mini-batches and (q + 1) S for the other r (trainer-bound), or 0 (rollout-bound); without it
(bypass mode: the rollout's log-probs are the ratio's denominator) the lags above.

Resumed responses: at every sync both trainers abort the requests in flight and send each again as prompt + its tokens
so far, re-prefilled by the new weights (the fully-async policy with `partial` = `async_training.partial_rollout`,
without it they are dropped; the v1 trainer always): such a response's earlier tokens were sampled by weights one sync
(T steps, or S updates) older than its later ones. A fully-async lag is in trainer steps: with `require_batches`
mini-batches per step (or several PPO epochs) each step is that many optimizer updates, so a checkpoint's age must be
counted in the same steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from .errors import FP8ProbeError

REGIMES = ("trainer-bound", "rollout-bound")
HELP = (
    "verl's fully-async policy: trigger=T,staleness=S[,partial] (async_training.trigger_parameter_sync_step, "
    "staleness_threshold, partial_rollout), lags in trainer steps; or its v1 trainer's separate_async: "
    "v1:sync=S,warmup=W,max_off_policy=M,decoupled (parameter_sync_step, num_warmup_batches, "
    "max_off_policy_threshold, Decoupled PPO; the last two optional), lags in optimizer updates; or its "
    "colocate_async: v1-colocate:warmup=W,max_off_policy=M,batch=B (num_warmup_batches, max_off_policy_threshold, "
    "data.train_batch_size; the last two optional), lags per token in trainer steps, scheduled on the rollouts"
)


def _summary(lags: dict[int, float]) -> dict:
    """A lag distribution's mean, median, 90th percentile and maximum and the distribution itself."""
    mean = sum(k * w for k, w in lags.items())

    def quantile(q):
        total = 0.0
        for k in sorted(lags):
            total += lags[k]
            if total >= q - 1e-12:
                return k
        return max(lags)

    return {"mean": mean, "p50": quantile(0.5), "p90": quantile(0.9), "max": max(lags), "lags": lags}


class _LagModel:
    """What every `--verl-async` mode answers besides its lags (check and plan read these, never the mode's type):
    the regimes it gives lags for (the verdict on the first), whether rollout and training run at once on pools of
    their own (plan's asynchronous step), the share of finished groups it drops (None: not modelled), and the keys on
    given rollouts (`on`: the same keys, unless the lags depend on the responses' lengths)."""

    regimes = REGIMES
    overlaps = True
    dropped = None

    def on(self, rollouts):
        return self


@dataclass(frozen=True)
class VerlAsync(_LagModel):
    """verl's fully-async keys (module docstring) and the lags they give."""

    trigger: int
    staleness: float
    partial: bool = False

    @classmethod
    def parse(cls, text: str) -> VerlAsync:
        """`trigger=T,staleness=S[,partial]` (one clear line for anything else)."""
        fields, partial = {}, False
        for part in (p.strip() for p in text.split(",") if p.strip()):
            key, eq, value = part.partition("=")
            if part == "partial":
                partial = True
            elif eq and key in ("trigger", "staleness") and key not in fields:
                fields[key] = value
            else:
                raise FP8ProbeError(f"`verl_async` {text}: give trigger=T,staleness=S[,partial] (not {part!r})")
        try:
            trigger, staleness = int(fields["trigger"]), float(fields["staleness"])
        except (KeyError, ValueError) as e:
            raise FP8ProbeError(
                f"`verl_async` {text}: trigger=T (whole trainer steps >= 1) and staleness=S (>= 0) are both needed"
            ) from e
        if trigger < 1 or not (math.isfinite(staleness) and staleness >= 0):
            raise FP8ProbeError(f"`verl_async` {text}: trigger must be >= 1 and staleness >= 0, as verl asserts")
        return cls(trigger, staleness, partial)

    def lags(self, regime: str = "trainer-bound") -> dict[int, float]:
        """lag (trainer steps) -> the share of samples trained at that lag, in `regime` (module docstring)."""
        t = self.trigger
        if regime == "rollout-bound":
            return {k: 1 / t for k in range(t)}
        start = self.staleness * t
        out: dict[int, float] = {}
        lo, hi = math.floor(start), math.ceil(start + t) - 1
        for k in range(lo, hi + 1):  # the length of [k, k + 1) within [start, start + t), over t
            share = (min(k + 1, start + t) - max(k, start)) / t
            if share > 1e-12:
                out[k] = out.get(k, 0.0) + share
        return out

    def summary(self, regime: str = "trainer-bound") -> dict:
        return _summary(self.lags(regime))

    def key(self) -> str:
        """The `--verl-async` text of these keys (parse(key()) gives them back)."""
        return f"trigger={self.trigger},staleness={self.staleness:g}" + (",partial" if self.partial else "")

    def describe(self) -> str:
        keys = f"trigger_parameter_sync_step {self.trigger}, staleness_threshold {self.staleness:g}"
        return keys + (", partial_rollout" if self.partial else "") + "; lags in trainer steps"


class _WarmupWindow(_LagModel):
    """The v1 trainer's warm-up rule, the same in both its async modes (fields `warmup`, `max_off_policy`)."""

    @property
    def waits(self) -> int:
        """The most steps a prompt spans in the queue: ceil(warmup) + 1 (W x B prompts ahead of it)."""
        return math.ceil(self.warmup) + 1

    @property
    def drops_warmup(self) -> bool:
        """Whether verl would drop every batch the warmup window holds (a prompt's span over max_off_policy)."""
        return self.max_off_policy is not None and self.waits > self.max_off_policy

    def refuse_dropped(self, text: str):
        """These keys, or one line refusing a warm-up verl would drop whole (`text`: the keys as given)."""
        if self.drops_warmup:
            raise FP8ProbeError(
                f"`verl_async` {text}: a prompt waits ceil(warmup) + 1 = {self.waits} steps, over "
                f"max_off_policy {self.max_off_policy}: verl would drop every batch the warmup window holds; raise "
                "max_off_policy"
            )
        return self


@dataclass(frozen=True)
class VerlV1Async(_WarmupWindow):
    """verl's v1 separate_async keys (module docstring) and the lags they give, in optimizer updates."""

    sync: int
    warmup: float = 1.0
    max_off_policy: int | None = 8
    decoupled: bool = False
    # update_weights aborts the requests in flight, frees the KV cache, syncs and resumes them, re-prefilled by the new
    # weights: a resumed response's earlier tokens are a sync older (measurement/straddle.py), as with partial_rollout
    partial = True

    @property
    def trigger(self) -> int:
        """Updates between two syncs: a resumed response's earlier tokens are this much older than its later ones."""
        return self.sync

    @classmethod
    def parse(cls, text: str) -> VerlV1Async:
        """`v1:sync=S,warmup=W[,max_off_policy=M|none][,decoupled]` (one clear line for anything else)."""
        usage = "give v1:sync=S,warmup=W[,max_off_policy=M][,decoupled]"
        fields, decoupled = {}, False
        for part in (p.strip() for p in text.split(":", 1)[1].split(",") if p.strip()):
            key, eq, value = part.partition("=")
            if part == "decoupled":
                decoupled = True
            elif eq and key in ("sync", "warmup", "max_off_policy") and key not in fields:
                fields[key] = value
            else:
                raise FP8ProbeError(f"`verl_async` {text}: {usage} (not {part!r})")
        try:
            sync, warmup = int(fields["sync"]), float(fields.get("warmup", 1))
            m = fields.get("max_off_policy", "8")
            limit = None if m in ("none", "null") else int(m)
        except (KeyError, ValueError) as e:
            raise FP8ProbeError(f"`verl_async` {text}: {usage}; sync (whole updates >= 1) is needed") from e
        if sync < 1 or not (math.isfinite(warmup) and warmup >= 0) or (limit is not None and limit < 1):
            raise FP8ProbeError(
                f"`verl_async` {text}: sync >= 1, warmup >= 0 and max_off_policy >= 1 (or none), as verl asserts"
            )
        return cls(sync, warmup, limit, decoupled).refuse_dropped(text)

    def lags(self, regime: str = "trainer-bound") -> dict[int, float]:
        """lag (optimizer updates) -> the share of samples trained at that lag, in `regime` (module docstring)."""
        s = self.sync
        queued = math.floor(self.warmup * s) if regime == "trainer-bound" else 0
        if self.decoupled:  # to the step's start: whole steps back, r of the S mini-batches one step further
            q, r = divmod(queued, s)
            return {q * s: (s - r) / s, **({(q + 1) * s: r / s} if r else {})}
        return {queued + j: 1 / s for j in range(s)}

    def summary(self, regime: str = "trainer-bound") -> dict:
        return _summary(self.lags(regime))

    def key(self) -> str:
        """The `--verl-async` text of these keys (parse(key()) gives them back)."""
        limit = "none" if self.max_off_policy is None else self.max_off_policy
        return f"v1:sync={self.sync},warmup={self.warmup:g},max_off_policy={limit}" + (
            ",decoupled" if self.decoupled else ""
        )

    def describe(self) -> str:
        limit = "none" if self.max_off_policy is None else str(self.max_off_policy)
        return (
            f"v1 separate_async: parameter_sync_step {self.sync}, num_warmup_batches {self.warmup:g}, "
            f"max_off_policy_threshold {limit}, {'decoupled' if self.decoupled else 'bypass'}; lags in updates"
        )


EQUAL_LENGTH = 256  # the response length of the schedule without the rollouts' lengths (every response alike)
SCHEDULED_STEPS = 240  # colocate_async: trainer steps simulated ...
SETTLING_STEPS = 16  # ... the first ones left out (the warmup's start, not the steady state)


@dataclass(frozen=True)
class VerlV1Colocate(_WarmupWindow):
    """verl's v1 colocate_async keys (`--verl-async v1-colocate:warmup=W[,max_off_policy=M][,batch=B]`:
    trainer.v1.trainer_mode=colocate_async, colocate_async.num_warmup_batches, sampler.max_off_policy_threshold,
    data.train_batch_size in prompts) and the lags they give each response token, in trainer steps.

    verl 0.9.1's loop (verl/trainer/ppo/v1/trainer_colocate_async.py on trainer_base.py and replay_buffer.py): the
    rollout and the trainer share the GPUs and take turns. floor(W x B) prompts are queued before the first step (W
    train batches of B prompt groups; 0.9.1 sets gen_batch_size to 1), each step queues B more, then the rollout
    generates (with the weights of the step's start) until B prompt groups are finished, and the sampler takes the B
    oldest finished (by the step they were queued in; a finished group that spans more than M steps is dropped and a
    new prompt queued in its place); every request still in flight is aborted, the rollout sleeps, the trainer makes
    its one update, the weights are synced, and the aborted requests resume (re-prefilled by the new weights). So a
    token's lag is the steps between the phase that sampled it and the step that trains it: 0 for what the last
    phase sampled, more for a long response's earlier tokens and for a group that finished but was not taken. The
    lags depend on the responses' lengths: the schedule is simulated (MODELLED: every request in flight decodes one
    token per engine step, no queueing) over SCHEDULED_STEPS steps from the rollouts' own groups (`lengths`: per
    prompt, its responses' lengths; drawn in a seeded shuffle, epoch by epoch), the first SETTLING_STEPS left out;
    without lengths every response has EQUAL_LENGTH tokens (then W = 1 gives half the groups lag 0 and half lag 1).
    Each step is one update and one sync, so the Decoupled-PPO and bypass losses meet the same lags, and a resumed
    response's earlier tokens are at their own lags here (no separate straddle figure)."""

    warmup: float = 1.0
    max_off_policy: int | None = 8
    batch: int = 64
    lengths: tuple[tuple[int, ...], ...] | None = None  # per prompt group: its responses' lengths (None: equal)
    partial = False  # resumed responses are in the lags themselves
    trigger = 1  # a sync every step
    regimes = ("scheduled",)  # one schedule: the rollout and the trainer take turns, neither waits on the other
    overlaps = False  # ... on the same GPUs

    @classmethod
    def parse(cls, text: str) -> VerlV1Colocate:
        """`v1-colocate:warmup=W[,max_off_policy=M|none][,batch=B]` (one clear line for anything else)."""
        usage = "give v1-colocate:warmup=W[,max_off_policy=M][,batch=B]"
        fields = {}
        for part in (p.strip() for p in text.split(":", 1)[1].split(",") if p.strip()):
            key, eq, value = part.partition("=")
            if not eq or key not in ("warmup", "max_off_policy", "batch") or key in fields:
                raise FP8ProbeError(f"`verl_async` {text}: {usage} (not {part!r})")
            fields[key] = value
        try:
            warmup, batch = float(fields.get("warmup", 1)), int(fields.get("batch", 64))
            m = fields.get("max_off_policy", "8")
            limit = None if m in ("none", "null") else int(m)
        except ValueError as e:
            raise FP8ProbeError(f"`verl_async` {text}: {usage} (W a number, M and B whole numbers)") from e
        if not (math.isfinite(warmup) and warmup >= 0) or batch < 1 or (limit is not None and limit < 1):
            raise FP8ProbeError(f"`verl_async` {text}: warmup >= 0, batch >= 1 and max_off_policy >= 1 (or none)")
        return cls(warmup, limit, batch).refuse_dropped(text)

    def on(self, rollouts) -> VerlV1Colocate:
        """These keys on the rollouts' own response lengths (per prompt group)."""
        from dataclasses import replace

        groups = rollouts.prompt_groups().tolist()
        lengths = rollouts.response_mask.sum(1).tolist()
        by_group: dict[int, list[int]] = {}
        for g, n in zip(groups, lengths):
            by_group.setdefault(g, []).append(max(int(n), 1))
        return replace(self, lengths=tuple(tuple(v) for _, v in sorted(by_group.items())))

    @cached_property
    def scheduled(self) -> dict:
        """schedule(), made once."""
        return self.schedule()

    def schedule(self) -> dict:
        """The simulated schedule (class docstring): `lags` (lag -> share of the trained tokens), `dropped` (the share
        of finished groups dropped as too stale) and what it assumed."""
        import heapq
        import itertools

        import numpy as np

        pool = list(self.lengths) if self.lengths else [(EQUAL_LENGTH,)]
        rng, order = np.random.default_rng(0), []

        def draw() -> tuple[int, ...]:
            if not order:
                order.extend(rng.permutation(len(pool)).tolist())
            return pool[order.pop()]

        serial = itertools.count()
        # a group: [queued step, serial, lengths, tokens made so far per response, [(phase, tokens)] per response]
        running: dict[int, list] = {}  # serial -> a group queued or in flight
        finished: list[list] = []  # finished, not yet taken
        tokens: dict[int, int] = {}
        taken_groups = dropped = 0

        def queue(step: int, n: int) -> list[list]:
            made = []
            for _ in range(n):
                ls = draw()
                g = [step, next(serial), ls, [0] * len(ls), [[] for _ in ls]]
                running[g[1]] = g
                made.append(g)
            return made

        queue(1, math.floor(self.warmup * self.batch))  # verl 0.9.1: floor(W x B) prompts (gen_batch_size 1)
        for step in range(1, SCHEDULED_STEPS + 1):
            queue(step, self.batch)

            def stale(g) -> bool:
                return self.max_off_policy is not None and step - g[0] + 1 > self.max_off_policy

            for g in [g for g in finished if stale(g)]:  # evicted before sampling, a new prompt in each place
                finished.remove(g)
                dropped += 1
                queue(step, 1)
            # the phase: every request in flight decodes one token per engine step until B groups are finished
            started = dict.fromkeys(running, 0)
            heap = [(max(n - m for n, m in zip(g[2], g[3])), k) for k, g in running.items()]
            heapq.heapify(heap)
            now = 0
            while heap and len(finished) < self.batch:  # a group done at the last tick: popped next phase, at 0
                now, k = heapq.heappop(heap)
                g = running.pop(k)
                self._advance(g, step, now - started[k])
                if stale(g):
                    dropped += 1
                    (fresh,) = queue(step, 1)
                    started[fresh[1]] = now
                    heapq.heappush(heap, (now + max(fresh[2]), fresh[1]))
                else:
                    finished.append(g)
            for k, g in running.items():  # aborted at the phase's end, resumed next step
                self._advance(g, step, now - started[k])
            finished.sort(key=lambda g: (g[0], g[1]))
            taken, finished[:] = finished[: self.batch], finished[self.batch :]
            taken_groups += len(taken)
            if step > SETTLING_STEPS:
                for g in taken:
                    for segments in g[4]:
                        for phase, n in segments:
                            tokens[step - phase] = tokens.get(step - phase, 0) + n
        total = sum(tokens.values())
        return {
            "lags": {k: tokens[k] / total for k in sorted(tokens)},
            "dropped": dropped / max(taken_groups + dropped, 1),
            "lengths": "the rollouts' own" if self.lengths else "every response alike",
        }

    @staticmethod
    def _advance(g: list, phase: int, ticks: int) -> None:
        """Group `g`'s responses decode `ticks` more tokens each (those unfinished), stamped with `phase`."""
        for i, (n, m) in enumerate(zip(g[2], g[3])):
            made = min(ticks, n - m)
            if made > 0:
                g[3][i] += made
                g[4][i].append((phase, made))

    def lags(self, regime: str = "trainer-bound") -> dict[int, float]:
        """lag (trainer steps) -> the share of trained tokens at that lag; one schedule, either regime (the rollout
        and the trainer take turns)."""
        return self.scheduled["lags"]

    @property
    def dropped(self) -> float:
        """The share of finished groups verl drops as spanning more than max_off_policy steps."""
        return self.scheduled["dropped"]

    def summary(self, regime: str = "trainer-bound") -> dict:
        return _summary(self.lags(regime))

    def key(self) -> str:
        limit = "none" if self.max_off_policy is None else self.max_off_policy
        return f"v1-colocate:warmup={self.warmup:g},max_off_policy={limit},batch={self.batch}"

    def describe(self) -> str:
        limit = "none" if self.max_off_policy is None else str(self.max_off_policy)
        lengths = f"{len(self.lengths)} prompt groups' response lengths" if self.lengths else "responses alike"
        return (
            f"v1 colocate_async: num_warmup_batches {self.warmup:g}, max_off_policy_threshold {limit}, "
            f"train_batch_size {self.batch}; lags per token in trainer steps, the schedule MODELLED on {lengths}"
        )


# the forms `--verl-async` takes, by their prefix ("" : the experimental fully-async policy)
MODES = {"v1": VerlV1Async.parse, "v1-colocate": VerlV1Colocate.parse, "": VerlAsync.parse}


def parse_verl_async(text: str):
    """`--verl-async TEXT` -> the mode its prefix names (MODES): VerlV1Async for `v1:...`, else VerlAsync."""
    prefix = text.split(":", 1)[0].strip() if ":" in text else ""
    if prefix not in MODES:
        raise FP8ProbeError(f"`verl_async` {text}: the modes are {', '.join(repr(m) for m in MODES if m)} or none")
    return MODES[prefix](text)
