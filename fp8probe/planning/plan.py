"""The benefit beside the cost, as a library (`fp8probe plan`: apps/plan.py): each rollout configuration's measured
mismatch and verdict, its modelled rollout (deploy/throughput.py), and its steps and time to a target quality read
off a calibration's learning curves (budget/curves.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..budget.evidence import Verdict
from ..core.errors import FP8ProbeError
from ..core.metrics import excess
from ..core.schemes import KV_CACHE_DTYPES, SCHEMES
from ..core.settings import Settings, opt
from ..core.units import GiB
from ..core.verl_lags import HELP as VERL_ASYNC_HELP
from ..core.verl_lags import parse_verl_async
from ..deploy import throughput as tp_model

COLUMNS = [
    "configuration",
    "weights",
    "kv_cache_dtype",
    "async",
    "mismatch",
    "mismatch_lo",
    "mismatch_hi",
    "mismatch_source",
    "verdict",
    "weight_gib",
    "kv_tokens",
    "max_concurrency",
    "mean_running",
    "preemptions",
    "rollout_s",
    "rollout_tokens_per_s",
    "teacher_s",
    "train_s",
    "step_s",
    "steps_to_target",
    "steps_lo",
    "steps_hi",
    "steps_source",
    "time_to_target_s",
    "speedup",
    "speedup_lo",
    "speedup_hi",
]


@dataclass(frozen=True)
class PlanSettings(Settings):
    """The configurations (`recipe`, `fp8`, `kv_cache_dtype`, `async_steps` and their combinations, BF16 always), the
    rollout batch, the training step, and where cost and time to quality come from (`calibration`, `budget`)."""

    recipe: tuple[str, ...] = opt((), "recipe.yaml file(s) as weight configurations")
    fp8: tuple[str, ...] = opt(
        (),
        "whole-model FP8 scheme(s) as weight configurations (e.g. FP8_DYNAMIC)",
        choices=[s for s in SCHEMES if s != "FP8"],
    )
    kv_cache_dtype: tuple[str, ...] = opt(
        (), f"FP8 KV cache dtype(s): {', '.join(KV_CACHE_DTYPES)}", choices=KV_CACHE_DTYPES
    )
    async_steps: tuple[int, ...] = opt((), "asynchronous rollouts K steps behind the trainer", low=1, flag="--async")
    stale: tuple[str, ...] = opt(
        (),
        "a checkpoint K steps old for each --async K (its mismatch measured together "
        "with the weights and KV cache); default: the calibration's stale:K level",
    )
    calibration: str | None = opt(None, "a `fp8probe calibrate` directory: budget and learning curves")
    objective: str | None = opt(None, "the calibration's objective (one with several)")
    budget: str | None = opt(None, "a number (kl_q_p) or budget.json; default: the calibration's, else uncalibrated")
    other_student: bool = opt(
        False, "measure this student against a budget calibrated on another one (refused otherwise; plan.json says so)"
    )
    target: float | None = opt(
        None,
        "target held-out quality (lower is better); default: the mismatch-free runs' "
        "final quality within the calibration's tolerance",
        low=0.0,
    )
    steps: int = opt(
        100, "without a calibration: the training steps every admitted configuration is assumed to need", low=1
    )
    measure: bool = opt(True, "model throughput only: no student loaded, no mismatch measured", flag="--no-measure")
    rollout_batch: int = opt(512, "sequences generated per training step", low=1)
    prompt_len: int | None = opt(None, "prompt tokens per sequence (default: the rollouts', else 256)", low=1)
    response_len: int | None = opt(None, "response tokens per sequence (default: the rollouts' own lengths)", low=1)
    train_step_s: float | None = opt(
        None, "seconds per training step (default: modelled at `mfu`)", low=0.0, open_low=True
    )
    mfu: float = opt(0.35, "model FLOP utilisation of the modelled training step", low=0.0, open_low=True, high=1.0)
    teacher: str | None = opt(
        None,
        "on-policy distillation: the teacher that scores every rollout batch (a model, a bare config.json or "
        "shape:NAME); its scoring pass (a prefill of prompt + response with top-k log-probs) is a stage of each "
        "step, MODELLED",
    )
    teacher_tp: int = opt(1, "tensor-parallel ranks of one teacher replica", low=1)
    teacher_replicas: int = opt(1, "teacher replicas scoring the batch side by side", low=1)
    teacher_topk: int = opt(
        0, "top-k log-probs the teacher returns per position (recorded; 0: the sampled token's)", low=0
    )
    teacher_fp8: str | None = opt(
        None,
        "the teacher's weights in this whole-model FP8 scheme (default BF16)",
        choices=[s for s in SCHEMES if s != "FP8"],
    )
    bandwidth_efficiency: float = opt(
        tp_model.BANDWIDTH_EFFICIENCY, "achieved / peak memory bandwidth in decode", low=0.0, open_low=True, high=1.0
    )
    compute_efficiency: float = opt(
        tp_model.COMPUTE_EFFICIENCY, "achieved / peak tensor FLOP/s", low=0.0, open_low=True, high=1.0
    )
    step_overhead_s: float = opt(
        tp_model.STEP_OVERHEAD_S, "fixed seconds per decode step (scheduling, launches)", low=0.0
    )
    seq_overhead_s: float = opt(
        tp_model.SEQ_OVERHEAD_S, "seconds per running sequence and decode step (sampling)", low=0.0
    )
    bootstrap_seed: int = opt(0, "seed of the bootstrap over the calibration's seeds", low=0)
    verl_async: str | None = opt(
        None,
        VERL_ASYNC_HELP + ": one asynchronous row per configuration, its mismatch verl's trainer-bound mixture of "
        "lags (every lag measured with one `stale` checkpoint and `stale_steps`, else the calibration's stale:K "
        "levels)",
        metavar="KEYS",
    )
    stale_steps: int | None = opt(
        None, "with `verl_async` and `stale`: how many trainer steps older than MODEL the checkpoint is", low=1
    )
    configurations: tuple = field(default=(), repr=False)  # filled by __post_init__
    verl: object = field(default=None, init=False, repr=False)  # verl_async parsed (core/verl_lags.py)

    def __post_init__(self):
        super().__post_init__()
        verl = parse_verl_async(self.verl_async) if self.verl_async else None
        object.__setattr__(self, "verl", verl)
        if verl and not verl.overlaps:
            raise FP8ProbeError(
                f"`verl_async` {self.verl_async}: plan models an asynchronous step as rollout and training at once; "
                "in colocate_async they take turns on the same GPUs, a step plan does not model; "
                "`fp8probe check --verl-async` judges its lags"
            )
        if verl and self.async_steps:
            raise FP8ProbeError("give `async_steps` (one lag each) or `verl_async` (verl's mixture of lags), not both")
        if verl and self.stale and (len(self.stale) != 1 or self.stale_steps is None):
            raise FP8ProbeError(
                "`verl_async` measures every lag from one `stale` checkpoint: give one, with `stale_steps` (how "
                "many trainer steps older than MODEL it is); or none, for the calibration's stale:K levels"
            )
        if self.stale and not verl and len(self.stale) != len(self.async_steps):
            raise FP8ProbeError(
                "give one `stale` checkpoint per `async_steps` K (or none: the calibration's stale:K levels)"
            )
        weights = (
            [("bf16", None, None)]
            + [(f"recipe {Path(r).parent.name or r}", r, None) for r in self.recipe]
            + [(f"fp8 {s}", None, s) for s in self.fp8]
        )
        kvs = [None, *self.kv_cache_dtype]
        stale = [0, *self.async_steps]
        lags = tuple(verl.lags(verl.regimes[0]).items()) if verl else ()
        configs = []
        for w in weights:
            for kv in kvs:
                for k in stale:
                    parts = [w[0]] + ([f"kv {kv}"] if kv else []) + ([f"async {k}"] if k else [])
                    configs.append(Configuration(" + ".join(parts), w[0], w[1], w[2], kv, k))
                if verl:
                    name = " + ".join([w[0]] + ([f"kv {kv}"] if kv else []) + ["verl async"])
                    configs.append(Configuration(name, w[0], w[1], w[2], kv, max(k for k, _ in lags), lags))
        object.__setattr__(self, "configurations", tuple(configs))

    def device(self, gpu: str) -> tp_model.Device:
        return tp_model.Device.from_gpu(
            gpu,
            bandwidth_efficiency=self.bandwidth_efficiency,
            compute_efficiency=self.compute_efficiency,
            step_overhead_s=self.step_overhead_s,
            seq_overhead_s=self.seq_overhead_s,
        )


@dataclass(frozen=True)
class Configuration:
    name: str
    weights: str  # bf16 | recipe NAME | fp8 SCHEME
    recipe: str | None
    scheme: str | None
    kv_cache_dtype: str | None
    async_steps: int  # the lag (trainer steps); verl's mixture: its largest
    lags: tuple = ()  # verl's fully-async mixture: (lag, share of the samples) pairs, trainer-bound

    @property
    def base(self) -> tuple:
        """What the rollout engine computes with (the staleness apart): one measurement serves every K."""
        return (self.recipe, self.scheme, self.kv_cache_dtype)


# ---------------------------------------------------------------------------------------------------
# throughput and step time (no student needed)


def lengths(settings: PlanSettings, rollouts=None) -> tuple[list[int], list[int], str]:
    """Prompt and response tokens of the `rollout_batch` requests: the settings' fixed lengths, else the rollouts'
    own (cycled); and where they came from."""
    n = settings.rollout_batch
    if rollouts is not None:
        resp = rollouts.response_mask.sum(1).tolist()
        prompt = (rollouts.attention_mask.sum(1) - rollouts.response_mask.sum(1)).tolist()
    else:
        resp, prompt = [], []
    if settings.response_len is None and not resp:
        raise FP8ProbeError("no rollouts to take response lengths from: pass `response_len`")
    p_src = "given" if settings.prompt_len else "the rollouts'" if prompt else "default 256"
    r_src = "given" if settings.response_len else "the rollouts'"
    prompt = [settings.prompt_len] if settings.prompt_len else prompt or [256]
    resp = [settings.response_len] if settings.response_len else resp
    return (
        [int(prompt[i % len(prompt)]) for i in range(n)],
        [int(resp[i % len(resp)]) for i in range(n)],
        f"prompts {p_src}, responses {r_src}",
    )


def rollout_cost(cfg, meta, units, conf: Configuration, device, serving, prompts, responses) -> dict:
    """One configuration's KV pool and modelled rollout of the batch."""
    from ..deploy.capacity import kv_pool
    from ..model.structure import text_config
    from ..recipe.recipe import Recipe, read_recipe

    tcfg = text_config(cfg)
    rec = read_recipe(conf.recipe) if conf.recipe else Recipe.whole_model(units, conf.scheme) if conf.scheme else None
    if rec is not None:
        rec.check_model(units, conf.recipe or conf.name)
    kvd = conf.kv_cache_dtype or "auto"
    max_len = serving.max_model_len or max(p + r for p, r in zip(prompts, responses))
    pool = kv_pool(tcfg, meta, rec, kvd, serving, max_len, conf.name)
    sm = tp_model.step_model(cfg, rec, kvd, device, serving.tensor_parallel_size, serving.hybrid)
    try:
        r = tp_model.simulate(
            sm, prompts, responses, pool["num_blocks"], pool["groups"], pool["block_size"], serving.max_num_seqs
        )
    except ValueError as e:
        raise FP8ProbeError(f"{conf.name}: {e}") from e
    return {
        "weight_gib": pool["weight_bytes"] / GiB,
        "kv_tokens": pool["kv_tokens"],
        "max_concurrency": pool["max_concurrency"],
        "mean_running": r.mean_running,
        "preemptions": r.preemptions,
        "rollout_s": r.seconds,
        "rollout_tokens_per_s": r.tokens_per_s,
        "active_params": (sm.fp8_params + sm.bf16_params) * serving.tensor_parallel_size,
    }


def teacher_seconds(settings: PlanSettings, device, prompts, responses) -> tuple[float, str]:
    """The teacher's scoring pass over the rollout batch (0 without a teacher), MODELLED as the throughput model's
    prefill (deploy/throughput.py: compute-bound, every prompt + response token once) of the teacher in BF16 (or
    `teacher_fp8`), `teacher_tp` ranks a replica, the batch split over `teacher_replicas`; and how it was had."""
    if settings.teacher is None:
        return 0.0, "no teacher"
    from ..model.structure import list_units, meta_model
    from ..model.student import load_config
    from ..recipe.recipe import Recipe

    cfg = load_config(settings.teacher)
    rec = Recipe.whole_model(list_units(meta_model(cfg)), settings.teacher_fp8) if settings.teacher_fp8 else None
    sm = tp_model.step_model(cfg, rec, "auto", device, settings.teacher_tp)
    tokens = sum(prompts) + sum(responses)
    s = float(sm.prefill_s(tokens / settings.teacher_replicas))
    weights = settings.teacher_fp8 or "BF16"
    return s, (
        f"modelled: {settings.teacher} ({weights}, TP {settings.teacher_tp} x {settings.teacher_replicas} replicas) "
        f"prefills {tokens:,} tokens, top-{settings.teacher_topk} log-probs"
    )


def train_seconds(settings: PlanSettings, device, active_params: float, tokens: int, gpus: int) -> tuple[float, str]:
    if settings.train_step_s is not None:
        return settings.train_step_s, "given"
    s = 6.0 * active_params * tokens / (settings.mfu * device.bf16_flops * gpus)
    return s, (
        f"modelled: 6 x {active_params / 1e9:.3g}B active parameters x {tokens:,} tokens at {settings.mfu:.0%} MFU"
    )


# ---------------------------------------------------------------------------------------------------
# measured cost (the student loaded) and time to quality (the calibration's curves)


def _perturbation(student, conf: Configuration, stale_ckpt: str | None, allow_pickle: bool):
    """The rollout engine's configuration as one Source (sources.py), or None for BF16 in step."""
    from ..recipe.recipe import Recipe, read_recipe
    from ..sources import sources as src

    parts = []
    if conf.recipe:
        parts.append(src.recipe(student, read_recipe(conf.recipe), name=conf.weights))
    elif conf.scheme:
        parts.append(src.recipe(student, Recipe.whole_model(student.units, conf.scheme), name=conf.weights))
    if conf.kv_cache_dtype:
        parts.append(src.kv_cache(student, conf.kv_cache_dtype))
    if stale_ckpt:
        parts.append(src.stale(student, stale_ckpt, allow_pickle, lag=conf.async_steps or None))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else src.combine(parts, conf.name)


def measure_costs(
    bench, settings: PlanSettings, budget, curves, allow_pickle: bool = False, progress: bool = False
) -> dict[str, dict]:
    """Per configuration: its mismatch on `budget.metric` (the excess) with its interval, measured on the bench
    (measurement/bench.py) as `check` measures it, where it came from, and the check's verdict (admission.judge: each
    kind on its evidence). One measurement per distinct engine configuration; asynchronous rows measure with their
    `stale` checkpoint, or add the calibration's stale:K mismatch (its seeds' range)."""
    from tqdm.auto import tqdm

    from ..budget.admission import judge
    from ..measurement.measure import measure
    from ..measurement.perturbation import Perturbation
    from ..sources.config import STALE_UNKNOWN, RolloutConfig
    from ..sources.sources import merge, stale

    metric, student = budget.metric, bench.student
    stale_of = dict(zip(settings.async_steps, settings.stale))
    seen: dict = {}
    stale_source = None  # verl's mixture: the one `stale` checkpoint, loaded once for every row
    out = {}
    for conf in tqdm(settings.configurations, desc="plan: measuring", unit="config", disable=not progress):
        ckpt = None if conf.lags else stale_of.get(conf.async_steps)
        key = (conf.base, ckpt)
        if key not in seen:
            source = _perturbation(student, conf, ckpt, allow_pickle)
            if source is None:
                seen[key] = (
                    0.0,
                    [0.0, 0.0],
                    bench.reference().prompt.unique().numel(),
                    RolloutConfig(),
                    Perturbation(),
                )
            else:
                m = measure(bench, source.perturbation)
                seen[key] = (
                    excess(metric, m.metrics[metric]),
                    m.excess_interval(metric),
                    m.num_prompts,
                    source.config,
                    source.perturbation,
                )
        value, (lo, hi), prompts, config, base = seen[key]
        how = "measured" if conf.base != (None, None, None) or ckpt else "none (the reference)"
        if conf.lags and settings.stale:
            if stale_source is None:
                stale_source = stale(student, settings.stale[0], allow_pickle)
            value, (lo, hi), prompts, how = _measured_mixture(bench, settings, conf.lags, base, stale_source, metric)
        elif conf.lags:
            value, lo, hi = _add_stale_levels(value, lo, hi, conf.lags, curves)
            how = MIXED_LEVELS
        elif conf.async_steps and not ckpt:
            level = f"stale:{conf.async_steps}"
            value, lo, hi = _add_stale_levels(value, lo, hi, ((conf.async_steps, 1.0),), curves)
            how = (
                f"sum: measured + the calibration's {level} (its seeds' range)"
                if conf.base != (None, None, None)
                else f"the calibration's {level} (its seeds' range)"
            )
        if conf.lags:  # a mixture of lags: no one level's lag
            config = merge([config, RolloutConfig(stale=STALE_UNKNOWN)])
        elif conf.async_steps and config.stale is None:  # the calibration's own stale:K level, added
            config = merge([config, RolloutConfig(stale=conf.async_steps)])
        v = judge(value, (lo, hi), budget, int(prompts), config)
        out[conf.name] = {
            "mismatch": value,
            "mismatch_lo": lo,
            "mismatch_hi": hi,
            "mismatch_source": how,
            "verdict": v.verdict,
            "prompts_to_decide": v.prompts_to_decide,
        }
    return out


MIXED_LEVELS = (
    "sum: measured + the calibration's stale:K levels mixed by verl's trainer-bound lags (their seeds' range)"
)


def _add_stale_levels(value: float, lo: float, hi: float, lags, curves) -> tuple[float, float, float]:
    """A measured mismatch (and its interval) plus the calibration's stale:K levels, each weighted by its share of the
    samples (`lags`: (K, share) pairs; lag 0 adds nothing): each level at its place, its interval its seeds' range."""
    for k, w in lags:
        if k:
            runs, at = curves.stale_runs(f"stale:{k}"), curves.mismatch[f"stale:{k}"]
            value, lo, hi = value + w * at, lo + w * min(at, runs.min()), hi + w * max(at, runs.max())
    return value, lo, hi


def _measured_mixture(bench, settings: PlanSettings, lags, base, stale_source, metric):
    """A verl fully-async row measured: every trainer-bound lag (`lags`: (K, share) pairs) on the same tokens with the
    configuration's perturbation `base` on top (the `stale` checkpoint, `stale_steps` old:
    sources/verl_async.AsyncLags), mixed by the lags' shares (measurement.Mixture); (its mismatch, its interval,
    prompts, how it was had)."""
    from ..measurement.measure import Mixture, measure
    from ..sources.verl_async import async_lags

    at = async_lags(bench.student, stale_source, settings.stale_steps, settings.verl, base)
    mix = Mixture([(w, measure(bench, at.at(k))) for k, w in lags])
    how = f"measured: verl's trainer-bound lags, mixed ({at.path() or 'every lag a checkpoint'})"
    return excess(metric, mix.metrics[metric]), mix.excess_interval(metric), mix.num_prompts, how


def verl_async_record(settings: PlanSettings) -> dict | None:
    """plan.json's `verl_async`: the keys and each regime's lags (the rows are the trainer-bound mixture)."""
    if settings.verl is None:
        return None
    regimes = {}
    for regime in settings.verl.regimes:
        sm = settings.verl.summary(regime)
        regimes[regime] = {
            **{k: sm[k] for k in ("mean", "p50", "p90", "max")},
            "lags": {str(k): w for k, w in sm["lags"].items()},
        }
    return {"keys": settings.verl.describe(), "rows": settings.verl.regimes[0], "regimes": regimes}


def verl_async_lines(record: dict | None) -> list[str]:
    if not record:
        return []
    parts = [
        f"{regime} mean {r['mean']:.2f}, p50 {r['p50']}, p90 {r['p90']}, max {r['max']}"
        for regime, r in record["regimes"].items()
    ]
    return [f"verl async ({record['keys']}): {'; '.join(parts)} (rows: {record['rows']})"]


def _kinds(conf: Configuration) -> tuple[str, ...]:
    """The kinds of mismatch source a configuration holds (what a budget's evidence is read for)."""
    return tuple(
        k
        for k, on in (
            ("fp8", bool(conf.recipe or conf.scheme)),
            ("kv", bool(conf.kv_cache_dtype)),
            ("stale", bool(conf.async_steps)),
        )
        if on
    )


def _own_level(conf: Configuration, curves, settings: PlanSettings) -> str | None:
    """The calibration level a configuration is, where the calibration ran it (each kind on its own evidence): one
    step of asynchronous BF16 rollouts is stale:1, whole-model FP8 in a scheme is fp8:SCHEME, a BF16 model with an
    FP8 KV cache is kv:DTYPE; None for anything else (read off the noise ruler's curves at its measured mismatch)."""
    if conf.lags:
        own = None  # a mixture of lags is no calibration level
    elif conf.async_steps:
        own = f"stale:{conf.async_steps}" if conf.base == (None, None, None) and not settings.stale else None
    elif conf.recipe is None and conf.scheme and not conf.kv_cache_dtype:
        own = f"fp8:{conf.scheme}"
    elif conf.recipe is None and not conf.scheme and conf.kv_cache_dtype:
        own = f"kv:{conf.kv_cache_dtype}"
    else:
        own = None
    return own if own in curves.curves else None


def quality_steps(conf: Configuration, cost: dict | None, curves, budget, target: float, settings: PlanSettings):
    """(steps to target, (lo, hi), ratio of BF16's steps, (lo, hi), how, the seed-mean curve or None)."""
    assumed = "assumed: BF16's steps"
    if curves is None:
        refused = cost is not None and cost["verdict"] == Verdict.REJECT
        if refused:
            return None, (None, None), None, (None, None), "refused: REJECT", None
        return float(settings.steps), (None, None), 1.0, (None, None), assumed + " (no calibration)", None
    from ..budget.curves import steps_to, steps_with_interval

    clean = curves.curve_at(0.0)
    if cost is None:
        s = steps_to(clean.mean(0), curves.steps, target)
        return s, (None, None), 1.0, (None, None), assumed + " (mismatch not measured)", clean.mean(0)
    if cost["verdict"] == Verdict.REJECT:
        return None, (None, None), None, (None, None), "refused: REJECT", None
    from ..budget.evidence import levels_of

    level = _own_level(conf, curves, settings)
    calibrated = {lv.kind for lv in levels_of(budget)} if budget.calibrated and budget.tolerance is not None else set()
    own = [k for k in _kinds(conf) if k in calibrated]
    if level is None and own:
        return (
            None,
            (None, None),
            None,
            (None, None),
            f"refused: {', '.join(own)} ran as calibration levels of their own (whose cost the noise ruler's "
            "curves need not predict), and no calibration level is this configuration",
            None,
        )
    if level is None and cost["mismatch"] > curves.mismatch[curves.ruler[-1]]:
        return None, (None, None), None, (None, None), "refused: beyond the calibrated levels (not extrapolated)", None
    c = curves.curve_at(cost["mismatch"], level)
    s, (lo, hi), ratio, (rlo, rhi) = steps_with_interval(curves, c, clean, target, seed=settings.bootstrap_seed)
    if hi is not None and hi > curves.steps[-1]:
        hi = None  # past the calibrated steps: no upper bound
    how = f"the calibration's {level} curves" if level else "calibration curves at the measured mismatch"
    if s is None:
        how = f"not reached in the calibrated {curves.steps[-1]} steps"
    return s, (lo, hi), ratio, (rlo, rhi), how, c.mean(0)


# ---------------------------------------------------------------------------------------------------
# the command


def _budget(settings: PlanSettings, curves):
    b = _read_budget(settings, curves)
    b.check_judgeable()
    return b


def _read_budget(settings: PlanSettings, curves):
    from ..budget.fit import default_budget, read_budget

    if settings.budget is not None:
        return read_budget(settings.budget)
    if settings.calibration:
        d = Path(settings.calibration)
        for name in (f"budget-{curves.objective}.json", "budget.json"):
            if (d / name).is_file():
                return read_budget(str(d / name))
    return default_budget()


@dataclass(frozen=True)
class PlanEvidence:
    """What `plan` reads its verdicts and steps off (`check_plan`): the calibration's curves (None: none), the budget,
    and, once a student was checked against the budget (`on`), the budget's note on it."""

    curves: object  # budget.curves.Curves or None
    budget: object  # budget.fit.Budget
    student_note: str | None = None
    checked: bool = False  # whether `student_note` is a checked student's

    def on(self, student, other_student: bool) -> PlanEvidence:
        """This evidence with `student` checked against the budget (budget.fit.check_student: another student's
        budget refused in one line), once: a checked one is returned as it is."""
        from dataclasses import replace

        from ..budget.fit import check_student

        if self.checked:
            return self
        return replace(self, student_note=check_student(self.budget, student, other_student), checked=True)


def check_plan(settings: PlanSettings, serving, model) -> PlanEvidence:
    """Everything readable before any output: the GPU is in the table, the recipes and the calibration read, the
    async levels covered; returns the curves (or None) and the budget."""
    from ..budget.curves import read_curves
    from ..deploy.gpus import gpu
    from ..recipe.recipe import read_recipe

    if serving.gpu_memory_gib is not None or serving.kv_cache_memory is not None:
        raise FP8ProbeError(
            "plan models a GPU of the table (its bandwidth and peaks): pass `gpu`, not "
            "`gpu_memory_gib` or `kv_cache_memory`"
        )
    gpu(serving.gpu or "H100")
    for r in settings.recipe:
        read_recipe(r)
    curves = read_curves(settings.calibration, settings.objective) if settings.calibration else None
    budget = _budget(settings, curves)
    if curves is not None and budget.metric != curves.metric:
        raise FP8ProbeError(f"the budget bounds {budget.metric}, the calibration measured {curves.metric}")
    measured = settings.measure and has_weights(model)
    if measured and settings.verl and not settings.stale:
        if curves is None:
            raise FP8ProbeError(
                "`verl_async` needs the mismatch of stale weights: one `stale` checkpoint with `stale_steps`, or a "
                "`calibration` with a stale:K level for every lag"
            )
        for k in settings.verl.lags(settings.verl.regimes[0]):
            if k:
                curves.stale_runs(f"stale:{k}")
    if measured and settings.async_steps and not settings.stale:
        if curves is None:
            raise FP8ProbeError(
                "`async_steps` needs the mismatch of stale weights: a `stale` checkpoint per K, or a "
                "`calibration` with stale:K levels"
            )
        for k in settings.async_steps:
            curves.stale_runs(f"stale:{k}")
    for path in settings.stale:
        from dataclasses import replace

        replace(model, model=path).check()
    return PlanEvidence(curves, budget)


def has_weights(model) -> bool:
    from ..model.shapes import is_shape

    m = model.model
    return not (is_shape(m) or (m is not None and str(m).endswith(".json")))


def time_to_target(
    rows: list[dict], settings: PlanSettings, curves, budget, target, train_s: float, teacher_s: float = 0.0
) -> None:
    """Step time, steps and time to target, speed-up against synchronous BF16 (the first row), in place. A step is
    its stages' sum (rollout, the teacher's scoring pass, training), or with asynchronous rollouts their maximum (each
    stage on a pool of its own, as verl's fully-async policy runs them)."""
    base = None
    for row, conf in zip(rows, settings.configurations):
        row["train_s"] = train_s
        row["teacher_s"] = teacher_s
        stages = (row["rollout_s"], teacher_s, train_s)
        row["step_s"] = max(stages) if conf.async_steps else sum(stages)
        cost = row if row["verdict"] is not None else None
        s, (lo, hi), ratio, (rlo, rhi), how, curve = quality_steps(conf, cost, curves, budget, target, settings)
        row.update(
            {
                "steps_to_target": s,
                "steps_lo": lo,
                "steps_hi": hi,
                "steps_source": how,
                "time_to_target_s": s * row["step_s"] if s is not None else None,
                "curve": None if curve is None else [float(x) for x in curve],
            }
        )
        if base is None:
            base = row
        per_step = base["step_s"] / row["step_s"]
        row["speedup"] = ratio * per_step if ratio is not None and s is not None else None
        row["speedup_lo"] = rlo * per_step if rlo is not None and s is not None else None
        row["speedup_hi"] = rhi * per_step if rhi is not None and s is not None else None


@dataclass(frozen=True)
class _Costs:
    """What `plan` measured on the bench (`measure_costs`): each configuration's cost by name, the bench it was
    measured on (its rollouts' lengths model the step, its batch size the arithmetic), the budget's note on the
    student."""

    rows: dict[str, dict]
    bench: object  # measurement.bench.Bench
    student_note: str | None


def plan(
    bench, settings: PlanSettings, serving, model, *, evidence: PlanEvidence | None = None, progress: bool = False
):
    """The verb: each configuration of `settings` on `model` (a ModelSource: its config, its label, whether a stale
    checkpoint may be unpickled), served as `serving` says, with its cost measured on `bench` (measurement/bench.py:
    the student's own rollouts, as `check` measures; None: not measured, e.g. a config-only model), its modelled
    rollout and step, and its steps and time to the target read off the calibration's curves (none: BF16's steps
    assumed) -> PlanRecord (plan.json). `evidence`: what `check_plan` returns, which refuses what cannot be planned
    before any output exists (None: read here), with the bench's student checked against its budget where not yet."""
    evidence = evidence or check_plan(settings, serving, model)
    curves, budget, costs = evidence.curves, evidence.budget, None
    if bench is not None:
        note = evidence.on(bench.student, settings.other_student).student_note  # another student's budget: refused
        rows = measure_costs(bench, settings, budget, curves, model.allow_pickle, progress)
        costs = _Costs(rows, bench, note)
    cfg = model.config() if bench is not None else model.check()
    return _record(cfg, settings, serving, model.label, curves, budget, costs)


def _record(cfg, settings: PlanSettings, serving, label: str, curves, budget, costs: _Costs | None):
    """plan.json's record from the measured costs (None: not measured) and the models of the rollout and the step."""
    import time

    from ..core.artifacts import arithmetic, versions
    from ..core.records import PlanRecord
    from ..deploy.gpus import gpu
    from ..model.structure import list_units, meta_model

    t0 = time.perf_counter()
    meta = meta_model(cfg)
    units = list_units(meta)
    card = gpu(serving.gpu or "H100")
    device = settings.device(serving.gpu or "H100")
    prompts, responses, len_src = lengths(settings, costs.bench.rollouts if costs else None)
    unmeasured = dict.fromkeys(("mismatch", "mismatch_lo", "mismatch_hi", "verdict"), None)
    rows = []
    for conf in settings.configurations:
        row = {
            "configuration": conf.name,
            "weights": conf.weights,
            "kv_cache_dtype": conf.kv_cache_dtype or "auto",
            "async": conf.async_steps,
        }
        row.update((costs.rows.get(conf.name) if costs else None) or {**unmeasured, "mismatch_source": "not measured"})
        row.update(rollout_cost(cfg, meta, units, conf, device, serving, prompts, responses))
        rows.append(row)
    tokens = sum(prompts) + sum(responses)
    train_s, train_how = train_seconds(settings, device, rows[0]["active_params"], tokens, serving.tensor_parallel_size)
    target = settings.target if settings.target is not None else curves.default_target() if curves else None
    teacher_s, teacher_how = teacher_seconds(settings, device, prompts, responses)
    time_to_target(rows, settings, curves, budget, target, train_s, teacher_s)
    return PlanRecord(
        command="plan",
        model=label,
        gpu=card.name,
        tensor_parallel_size=serving.tensor_parallel_size,
        modelled="rollout throughput and step times are modelled (deploy/throughput.py), not measured",
        device={k: getattr(device, k) for k in DEVICE_FIELDS},
        gpu_source=card.source,
        rollout_batch=settings.rollout_batch,
        lengths=len_src,
        mean_prompt_len=sum(prompts) / len(prompts),
        mean_response_len=sum(responses) / len(responses),
        train_step_s=train_s,
        teacher=None if settings.teacher is None else _teacher(settings, teacher_s, teacher_how),
        train_step=train_how,
        budget={
            "metric": budget.metric,
            "value": budget.value,
            "interval": budget.interval,
            "calibrated": budget.calibrated,
            "source": budget.source,
            "student": budget.student,
            "student_note": costs.student_note if costs else None,
        },
        calibration=None if curves is None else _calibration(settings, curves, target),
        assumed_steps=None if curves else settings.steps,
        arithmetic=arithmetic(costs.bench.batch_size) if costs else None,
        verl_async=verl_async_record(settings),
        rows=rows,
        seconds=round(time.perf_counter() - t0, 3),
        versions=versions(),
    )


DEVICE_FIELDS = (
    "bytes_per_s",
    "bf16_flops",
    "fp8_flops",
    "bandwidth_efficiency",
    "compute_efficiency",
    "step_overhead_s",
    "seq_overhead_s",
)


def _teacher(settings: PlanSettings, scoring_s: float, how: str) -> dict:
    return {
        "model": settings.teacher,
        "weights": settings.teacher_fp8 or "bf16",
        "tensor_parallel_size": settings.teacher_tp,
        "replicas": settings.teacher_replicas,
        "topk": settings.teacher_topk,
        "scoring_s": scoring_s,
        "how": how,
    }


def _calibration(settings: PlanSettings, curves, target: float) -> dict:
    return {
        "source": curves.source,
        "objective": curves.objective,
        "steps": list(curves.steps),
        "seeds": list(curves.seeds),
        "target": target,
        "target_rule": "given"
        if settings.target is not None
        else f"the mismatch-free runs' final quality x (1 + tolerance {curves.tolerance:g})",
    }
