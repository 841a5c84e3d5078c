"""`check --verl-async`: the rollout engine's states at every lag verl's asynchronous keys give (the lag model:
core/verl_lags.py), each measured on the straight line from MODEL through a `stale` checkpoint."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import FP8ProbeError
from ..core.verl_lags import VerlAsync


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
        return sorted({k for r in self.spec.regimes for k in self.spec.lags(r)})

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
