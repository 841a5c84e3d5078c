"""verl's asynchronous rollouts as the lags they give each sample (the one model the export's comments and `check
--verl-async` read): `--verl-async trigger=T,staleness=S[,partial]`
(the experimental fully-async policy) or `--verl-async v1:...` (the v1 trainer's separate_async, below).

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

    trainer-bound   the rollout generates each batch as soon as it joins: the queue holds W batches (Q = S x floor(W)
                    mini-batches; verl adds a fractional warmup in whole gen_batch_size chunks, by default train
                    batches), so local update j of a step trains on weights Q + j updates old: uniform on Q .. Q+S-1
    rollout-bound   the trainer waits for samples: each was finished with the last synced weights, lag j: 0 .. S-1

With `decoupled` (verl's default Decoupled PPO: the trainer recomputes the old log-probs with the weights of the
step's start, held for all S updates) the lag that meets the rollout's log-probs is to those weights: Q (trainer-bound)
or 0 (rollout-bound); without it (bypass mode: the rollout's log-probs are the ratio's denominator) the lags above.

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

from .errors import FP8ProbeError

REGIMES = ("trainer-bound", "rollout-bound")
HELP = (
    "verl's fully-async policy: trigger=T,staleness=S[,partial] (async_training.trigger_parameter_sync_step, "
    "staleness_threshold, partial_rollout), lags in trainer steps; or its v1 trainer's separate_async: "
    "v1:sync=S,warmup=W,max_off_policy=M,decoupled (parameter_sync_step, num_warmup_batches, "
    "max_off_policy_threshold, Decoupled PPO; the last two optional), lags in optimizer updates"
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


@dataclass(frozen=True)
class VerlAsync:
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
        return keys + (", partial_rollout" if self.partial else "")


@dataclass(frozen=True)
class VerlV1Async:
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
        spec = cls(sync, warmup, limit, decoupled)
        if spec.drops_warmup:
            raise FP8ProbeError(
                f"`verl_async` {text}: a prompt waits floor(warmup) + 1 = {spec.waits} steps, over "
                f"max_off_policy {limit}: verl would drop every batch the warmup window holds; raise max_off_policy"
            )
        return spec

    @property
    def waits(self) -> int:
        """The steps a prompt spans in the queue: floor(warmup) + 1."""
        return math.floor(self.warmup) + 1

    @property
    def drops_warmup(self) -> bool:
        """Whether verl would drop every batch the warmup window holds (a prompt's span over max_off_policy)."""
        return self.max_off_policy is not None and self.waits > self.max_off_policy

    def lags(self, regime: str = "trainer-bound") -> dict[int, float]:
        """lag (optimizer updates) -> the share of samples trained at that lag, in `regime` (module docstring)."""
        s = self.sync
        queued = s * math.floor(self.warmup) if regime == "trainer-bound" else 0
        if self.decoupled:
            return {queued: 1.0}
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


# the forms `--verl-async` takes, by their prefix ("" : the experimental fully-async policy)
MODES = {"v1": VerlV1Async.parse, "": VerlAsync.parse}


def parse_verl_async(text: str):
    """`--verl-async TEXT` -> the mode its prefix names (MODES): VerlV1Async for `v1:...`, else VerlAsync."""
    prefix = text.split(":", 1)[0].strip() if ":" in text else ""
    if prefix not in MODES:
        raise FP8ProbeError(f"`verl_async` {text}: the modes are {', '.join(repr(m) for m in MODES if m)} or none")
    return MODES[prefix](text)
