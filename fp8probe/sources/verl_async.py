"""verl's fully-async policy as the staleness it gives each sample: `--verl-async trigger=T,staleness=S[,partial]`.

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

S = 0 gives both regimes the same 0 .. T-1. With `partial` (`async_training.partial_rollout`), a response in flight at
a sync is finished by the new weights: its prefix (and the prefix's KV cache) are one sync (T steps) older than its
suffix. A lag here is in trainer steps: with `require_batches` mini-batches per step (or several PPO epochs) each step
is that many optimizer updates, so a checkpoint's age must be counted in the same steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.errors import FP8ProbeError

REGIMES = ("trainer-bound", "rollout-bound")
HELP = (
    "verl's fully-async policy: trigger=T,staleness=S[,partial] (async_training.trigger_parameter_sync_step, "
    "staleness_threshold, partial_rollout): the lag of each sample in trainer steps"
)


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
        """The lag distribution's mean, median, 90th percentile and maximum (trainer steps) and the distribution."""
        lags = self.lags(regime)
        mean = sum(k * w for k, w in lags.items())

        def quantile(q):
            total = 0.0
            for k in sorted(lags):
                total += lags[k]
                if total >= q - 1e-12:
                    return k
            return max(lags)

        return {"mean": mean, "p50": quantile(0.5), "p90": quantile(0.9), "max": max(lags), "lags": lags}

    def describe(self) -> str:
        keys = f"trigger_parameter_sync_step {self.trigger}, staleness_threshold {self.staleness:g}"
        return keys + (", partial_rollout" if self.partial else "")


@dataclass(frozen=True)
class AsyncLags:
    """The rollout engine's states under verl's fully-async keys: the trainer's weights now (MODEL, lag 0) and a
    checkpoint `steps` trainer steps older (`stale`), every lag between and beyond them on the straight line through
    the two (modelled: only lags 0 and `steps` are the run's own weights), each with the other shortcuts given
    (`base`: an FP8 recipe, an FP8 KV cache) on top."""

    spec: VerlAsync
    steps: int
    now: dict  # parameter name -> the trainer's tensor (MODEL)
    then: dict  # parameter name -> the checkpoint's tensor, `steps` trainer steps older
    base: object  # measurement.perturbation.Perturbation: the other shortcuts, at every lag
    config: object = None  # sources.config.RolloutConfig of the other shortcuts (None: none)

    def at(self, lag: int):
        """The Perturbation of the engine at `lag` trainer steps behind the trainer (lag 0: the trainer's weights)."""
        from dataclasses import replace

        if lag == 0:
            return self.base
        t = lag / self.steps
        state = {n: (w.float() + t * (self.then[n].float() - w.float())).to(w.dtype) for n, w in self.now.items()}
        return replace(self.base, stale=state)

    def support(self) -> list[int]:
        """Every lag either regime trains at (the rollout-bound lags are the trainer-bound ones' first T at S = 0)."""
        return sorted({k for r in REGIMES for k in self.spec.lags(r)})

    def straddled(self) -> list[int]:
        """With `partial`: the lags of a straddling response's prefix (a sync, T steps, older than its suffix)."""
        return [k + self.spec.trigger for k in self.support()] if self.spec.partial else []

    def path(self) -> str:
        lags = sorted({*self.support(), *self.straddled()})
        modelled = [k for k in lags if k not in (0, self.steps)]
        beyond = [k for k in modelled if k > self.steps]
        words = f"lags {', '.join(map(str, modelled))} modelled on the straight line from MODEL (lag 0) through the "
        words += f"`stale` checkpoint (lag {self.steps})"
        return words + (f", {', '.join(map(str, beyond))} beyond it" if beyond else "") if modelled else ""


def async_lags(student, stale_source, steps: int, spec: VerlAsync, base, config=None) -> AsyncLags:
    """AsyncLags from the student (MODEL), its `stale` Source `steps` trainer steps older, and the other shortcuts'
    Perturbation `base` (their RolloutConfig `config`)."""
    if steps < 1:
        raise FP8ProbeError("`stale_steps` is the `stale` checkpoint's age in trainer steps: a whole number >= 1")
    now = {n: p.detach() for n, p in student.model.named_parameters()}
    return AsyncLags(spec, steps, now, stale_source.perturbation.stale, base, config)


def async_configuration(student, named: list, steps: int, spec: VerlAsync) -> tuple[str, AsyncLags]:
    """(the configuration's name, its AsyncLags) from the Sources a check names: the one `stale` checkpoint (`steps`
    trainer steps older than MODEL) and the other shortcuts, which every lag carries."""
    from .sources import combine

    stales = [s for s in named if s.kind == "stale"]
    others = [s for s in named if s.kind != "stale"]
    if len(stales) != 1:
        raise FP8ProbeError(
            "`verl_async` needs one `stale` checkpoint of the student, `stale_steps` trainer steps older"
        )
    if others:
        source = others[0] if len(others) == 1 else combine(others)
        base, config = source.perturbation, source.config
    else:
        from ..measurement.perturbation import Perturbation

        base, config = Perturbation(), None
    lags = async_lags(student, stales[0], steps, spec, base, config)
    name = " + ".join([*(s.name for s in others), f"verl async ({spec.describe()})"])
    return name, lags


def check_mixable(metric: str) -> None:
    """Refuse, in one line, a budget metric a mixture of lags has no figure on (a max or a percentile over tokens is
    not the share-weighted one)."""
    from ..measurement.mismatch import MEAN_METRICS

    if metric not in MEAN_METRICS:
        raise FP8ProbeError(
            f"`verl_async` judges the mixture of lags on a mean over tokens; the budget bounds {metric}: use a budget "
            f"on one of {', '.join(MEAN_METRICS)}"
        )
