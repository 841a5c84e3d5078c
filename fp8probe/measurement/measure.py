"""The one measurement door: `measure(bench, perturbation, engine=...)` -> Measured.

A Perturbation (perturbation.py) of the bench's student (bench.py) against its reference, the candidate computed as the
Engine (engines.py: the simulation, or a profile of vLLM's arithmetic) computes it; Measured holds every metric with the
per-token statistics that give it an interval and a paired change. Recipes, ladders, checks, plans, the level doses and
the comparison with vLLM measure through it; `measure_scheme` (a scheme by name) and `measured_as` (another engine's
figure, for a report) are its callers. A sweep's rows are the same measurement with their SQNR (sweeps/sweep.py
measure_row); an engine's model under a perturbation, for sampling, is Engine.candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS, excess
from ..core.metrics import metric as metric_info
from ..core.schemes import KVCacheScheme, Scheme
from ..core.stats import LEVEL, bootstrap_interval
from .bench import Bench
from .engines import Engine
from .engines import engine as get_engine
from .perturbation import Perturbation


@dataclass
class Measured:
    """A candidate's metrics and the per-token statistics behind them, so that any metric carries its interval."""

    metrics: dict[str, float]
    stats: dict | None  # mismatch.token_stats: per-token statistics (None where not kept: a sweep's unit rows)
    prompt: object  # torch.Tensor [M]: the prompt of each token's rollout (the unit the bootstrap resamples)
    sqnr_db: float | None = None  # a sweep row's: its perturbed outputs against their unperturbed values

    @property
    def num_prompts(self) -> int:
        return int(self.prompt.unique().numel())

    def interval(self, metric: str = "kl_q_p", level: float | None = None) -> tuple[float, float]:
        """The metric's bootstrap interval over the rollouts' prompts (mismatch.metric_interval)."""
        from .mismatch import metric_interval

        return metric_interval(self.stats, self.prompt, metric, level)

    def excess_interval(self, metric: str = "kl_q_p", level: float | None = None) -> list[float]:
        """interval() on the metric's excess scale (metrics.excess: what budgets bound), low end first."""
        return sorted(excess(metric, x) for x in self.interval(metric, level))

    def change_from(
        self, old: "Measured", metric: str = "kl_q_p", level: float | None = None, seed: int = 0
    ) -> tuple[float, float, float]:
        """How much `metric`'s excess (metrics.excess) changes from `old` to this, measured on the same tokens: (the
        change, its interval). The interval is a paired bootstrap over the prompts (core/stats.bootstrap_interval):
        each resample takes the same prompts' tokens under both, so what the two share (the rollouts' own
        difficulty) cancels and only the difference is resampled."""
        import numpy as np

        from .mismatch import metric_over

        if old.prompt.shape != self.prompt.shape or not bool((old.prompt == self.prompt).all()):
            raise ValueError("a paired change needs two measurements of the same tokens")
        _, r_new = metric_over(self.stats, metric)
        _, r_old = metric_over(old.stats, metric)
        sign = 1.0 if metric_info(metric).worse == "higher" else -1.0

        def change(i):
            return sign * (r_new(i) - r_old(i))

        lo, hi = bootstrap_interval(old.prompt.numpy(), change, level=level or LEVEL, seed=seed)
        return change(np.arange(len(old.prompt))), lo, hi


@dataclass
class Mixture:
    """A rollout engine that runs several states of the student, each generating its share of the samples (verl's
    fully-async lags): each state measured on the same tokens (a Measured each), the mixture's figure the
    share-weighted sum. Only the metrics a mean over tokens makes are a mixture's (a max or a percentile of a
    mixture is not the weighted one); the interval resamples the prompts once for every state together."""

    parts: list  # [(share, Measured)], the shares summing to 1

    @property
    def prompt(self):
        return self.parts[0][1].prompt

    @property
    def num_prompts(self) -> int:
        return self.parts[0][1].num_prompts

    @property
    def metrics(self) -> dict[str, float]:
        from .mismatch import MEAN_METRICS

        first = self.parts[0][1].metrics
        return {k: sum(w * m.metrics[k] for w, m in self.parts) for k in first if k in MEAN_METRICS}

    def interval(self, metric: str = "kl_q_p", level: float | None = None) -> tuple[float, float]:
        from .mismatch import metric_over

        reducers = [(w, metric_over(m.stats, metric)[1]) for w, m in self.parts]
        info = metric_info(metric)
        return bootstrap_interval(
            self.prompt.numpy(),
            lambda i: sum(w * r(i) for w, r in reducers),
            level=level or LEVEL,
            bounds=(info.low, info.high),
        )

    def excess_interval(self, metric: str = "kl_q_p", level: float | None = None) -> list[float]:
        return sorted(excess(metric, x) for x in self.interval(metric, level))


def measure(bench: Bench, p: Perturbation, *, engine: "str | Engine" = "sim") -> Measured:
    """The one measurement: every metric of Perturbation `p` of the bench's student against its reference on its
    rollouts, the candidate computed as `engine` computes it (engines.py: "sim" reuses the reference's prefix; a
    profile of the rollout engine's arithmetic runs its own copy of the model over the rollouts, in the bench's
    batches), with the per-token statistics that give any metric its interval (Measured.interval) and a paired
    change (Measured.change_from). The reference is the bench's (made once): with the KV cache's amax per `p`'s
    strategy where `p` puts the KV cache in FP8."""
    from .mismatch import summarize

    reference = bench.reference(p.kv.strategy if p.kv_layers else None)
    stats = get_engine(engine).stats(reference, bench.student, bench.rollouts, p, bench.batch_size)
    return Measured(summarize(stats), stats, reference.prompt)


def measured_as(bench: Bench, p: Perturbation, engine: str, metric: str = "kl_q_p") -> dict:
    """`p` on `metric` as another engine computes it, the second figure beside a recipe's or a check's: {"engine",
    "measured" (the excess), "interval" (90 %, over the prompts)}, or with "not_covered" (why) when that engine does
    not cover the configuration."""

    experts = any(bench.student.unit(u).kind == "expert" for u in p.units)
    try:
        get_engine(engine).check(p.scheme, p.kv if p.kv_layers else None, experts)
    except FP8ProbeError as e:
        return {"engine": engine, "measured": None, "interval": None, "not_covered": str(e).split(": use `engine`")[0]}
    m = measure(bench, p, engine=engine)
    return {"engine": engine, "measured": excess(metric, m.metrics[metric]), "interval": m.excess_interval(metric)}


def measure_scheme(bench: Bench, scheme="FP8_DYNAMIC", units=None, kv=None, *, engine: "str | Engine" = "sim") -> dict:
    """`measure` of a scheme by name, its metrics alone: `units` (names; all quantizable units when None) in
    `scheme`, plus an FP8 KV cache in every layer when `kv` is given ("fp8", "fp8_e5m2" or a KVCacheScheme);
    computed as `engine` does ("sim", or a profile of the rollout engine: "vllm-cuda", "vllm-cpu")."""
    p = scheme_perturbation(bench.student, scheme, units, kv)
    eng = get_engine(engine)
    eng.check(p.scheme, p.kv if kv is not None else None)
    result = measure(bench, p, engine=eng).metrics
    return {k: result[k] for k in METRICS}


def scheme_perturbation(student, scheme="FP8_DYNAMIC", units=None, kv=None) -> Perturbation:
    """The Perturbation of `units` (names; all quantizable units when None) in `scheme` by name, with an FP8 KV
    cache in every layer when `kv` is given (a name or a KVCacheScheme)."""
    kv_scheme = KVCacheScheme.from_name(kv) if kv is not None else KVCacheScheme()
    names = list(student.unit_names) if units is None else list(units)
    return Perturbation(tuple(names), Scheme.from_name(scheme), student.layers if kv is not None else (), kv_scheme)
