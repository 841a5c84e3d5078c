"""Rollout shortcuts as mismatch sources, all measured on one scale: the same rollouts, the same metrics.

    source        what the rollout engine does differently                    perturbation
    recipe        FP8 weights (+ FP8 KV cache) from a recipe.yaml              units in FP8 (+ KV layers)
    kv            an FP8 KV cache in every attention layer                     KV layers
    stale         weights of another checkpoint of the student (async RL)      every weight swapped
    noise σ       Gaussian weight noise, σ x each tensor's std, seeded          every unit, noised
    combination   several of the above at once, measured together, never summed

Noise is the ruler: a ladder of σ says how much mismatch is how much. A combination's row also carries the
sum of its parts' measured values, so that (non-)additivity is visible.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from ..core.errors import FP8ProbeError
from ..core.schemes import KV_CACHE_DTYPES, SCHEMES, KVCacheScheme, Scheme
from ..measurement.perturbation import Perturbation
from .config import STALE_UNKNOWN, RolloutConfig, noise_level, units_subset

if TYPE_CHECKING:  # the parser and the defaults stay light: the CLI reads them for --help
    from ..recipe.recipe import Recipe

log = logging.getLogger(__name__)

NOISE_RULER = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)  # the ladder's default noise levels: the ruler other sources sit on
CALIBRATION_LEVELS = ("0", "0.003", "0.01", "0.03", "0.1")  # calibrate's default ladder of training runs


@dataclass(frozen=True)
class SourceSpec:
    """A mismatch source as a user names it, before a student is at hand: `none`, `noise` σ, `fp8` (every unit, a
    scheme), `kv` (an FP8 KV cache, scale 1.0 as online engines use it) or `stale` K steps (a calibration's rollouts
    from the weights of K updates ago). What `calibrate --levels` takes, one parser for every command; what each
    kind means lives in LEVEL_KINDS."""

    kind: str
    value: float | None = None
    scheme: str | None = None

    @property
    def name(self) -> str:
        return LEVEL_KINDS[self.kind].label(self)

    @property
    def slug(self) -> str:
        return LEVEL_KINDS[self.kind].slug(self)

    def rollout(self, student, seed: int):
        """step -> the Perturbation of the rollout engine at that training step (a stale level's weights come from
        the trainer's Perturber, `stale_steps` updates back)."""
        return LEVEL_KINDS[self.kind].rollout(self, student, seed)

    @property
    def stale_steps(self) -> int:
        return LEVEL_KINDS[self.kind].stale_steps(self)

    @property
    def config(self) -> RolloutConfig:
        """The rollout configuration the level trains with (what `check` compares a configuration with)."""
        return LEVEL_KINDS[self.kind].config(self)


@dataclass(frozen=True)
class LevelKind:
    """A kind of calibration level: `parse(text, arg)` reads "KIND:ARG" into a SourceSpec (None: written as a
    number), `label` and `slug` name it in files and tables, `rollout(spec, student, seed)` is its engine and
    `stale_steps(spec)` how many updates old the weights it rolls out from are (the trainer's Perturber swaps them)."""

    name: str
    parse: Callable | None
    label: Callable
    rollout: Callable
    slug: Callable = lambda spec: spec.name.replace(":", "-")
    stale_steps: Callable = lambda spec: 0
    config: Callable = lambda spec: RolloutConfig()


def _parse_fp8(text: str, arg: str) -> SourceSpec:
    scheme = arg or "FP8_DYNAMIC"
    if scheme not in SCHEMES or scheme == "FP8":
        dynamic = ", ".join(s for s in SCHEMES if s != "FP8")
        raise FP8ProbeError(
            f"`levels` {text}: fp8 takes a dynamic scheme ({dynamic}); "
            "static activation scales need a calibration the rollout engine does not redo per step"
        )
    return SourceSpec("fp8", scheme=scheme)


def _parse_kv(text: str, arg: str) -> SourceSpec:
    dtype = arg or "fp8"
    if dtype not in KV_CACHE_DTYPES:
        raise FP8ProbeError(f"`levels` {text}: unknown KV-cache dtype; one of {', '.join(KV_CACHE_DTYPES)}")
    return SourceSpec("kv", scheme=dtype)


def _parse_stale(text: str, arg: str) -> SourceSpec:
    try:
        k = int(arg)
    except ValueError:
        k = 0
    if k < 1:
        raise FP8ProbeError(f"`levels` {text}: stale:K needs a whole number of steps K >= 1")
    return SourceSpec("stale", float(k))


def _unperturbed(spec, student, seed):
    return lambda step: Perturbation()


def _noise_rollout(spec, student, seed):
    units = student.unit_names
    return lambda step: Perturbation(noise=spec.value, noise_units=units, noise_seed=seed * 1_000_003 + step)


def _fp8_rollout(spec, student, seed):
    from ..model.structure import fp8_fits, scheme_blockers

    scheme = Scheme.from_name(spec.scheme)
    units = fp8_fits(student, scheme)
    if not units:
        blocked = scheme_blockers(student.quantizable, scheme)
        raise FP8ProbeError(
            f"`levels` {spec.name}: {spec.scheme} fits none of the student's units "
            f"({next(iter(blocked.values()))}); use fp8 (FP8_DYNAMIC)"
        )
    return lambda step: Perturbation(units=units, scheme=scheme)


def _kv_rollout(spec, student, seed):
    kv = replace(KVCacheScheme.from_name(spec.scheme), scale="unit")
    layers = student.layers
    return lambda step: Perturbation(kv_layers=layers, kv=kv)


LEVEL_KINDS: dict[str, LevelKind] = {
    k.name: k
    for k in (
        LevelKind("none", None, lambda spec: "0", _unperturbed),
        LevelKind(
            "noise",
            None,
            lambda spec: f"{spec.value:g}",
            _noise_rollout,
            slug=lambda spec: f"noise-{spec.name}",
            config=lambda spec: RolloutConfig(noise=spec.value),
        ),
        LevelKind(
            "fp8",
            _parse_fp8,
            lambda spec: f"fp8:{spec.scheme}",
            _fp8_rollout,
            config=lambda spec: RolloutConfig(fp8=spec.scheme),
        ),
        LevelKind(
            "kv",
            _parse_kv,
            lambda spec: f"kv:{spec.scheme}",
            _kv_rollout,
            config=lambda spec: RolloutConfig(kv=spec.scheme),
        ),
        LevelKind(
            "stale",
            _parse_stale,
            lambda spec: f"stale:{int(spec.value)}",
            _unperturbed,
            stale_steps=lambda spec: int(spec.value),
            config=lambda spec: RolloutConfig(stale=int(spec.value)),
        ),
    )
}


SOURCE_HELP = (
    "a number: weight noise σ (x each tensor's std; 0: no mismatch); fp8[:SCHEME] (every unit in FP8, "
    "default FP8_DYNAMIC); kv[:DTYPE] (FP8 KV cache, default fp8); stale:K (rollouts from the weights of "
    "K updates ago)"
)


def parse_source(text: str) -> SourceSpec:
    t = str(text).strip()
    v = noise_level(t, text)
    if v is not None:
        return SourceSpec("none") if v == 0 else SourceSpec("noise", v)
    kind, _, arg = t.partition(":")
    if kind not in LEVEL_KINDS or LEVEL_KINDS[kind].parse is None:
        raise FP8ProbeError(f"`levels` {text}: not a level; {SOURCE_HELP}")
    return LEVEL_KINDS[kind].parse(text, arg)


@dataclass(frozen=True)
class Source:
    name: str  # the row label
    kind: str  # recipe | kv | stale | noise | combination | engine (the engine alone: no shortcut)
    perturbation: Perturbation
    parts: tuple[str, ...] = ()  # a combination's sources
    value: float | None = None  # noise: σ
    config: RolloutConfig = RolloutConfig()  # what it is, as a budget's levels name it (config.py)


def noise(student, sigma: float, seed: int = 0) -> Source:
    if not sigma > 0:
        raise FP8ProbeError(f"`noise` {sigma}: a noise scale must be a positive number")
    units = student.unit_names
    return Source(
        f"noise {sigma:g}",
        "noise",
        Perturbation(noise=sigma, noise_units=units, noise_seed=seed),
        value=sigma,
        config=RolloutConfig(noise=sigma),
    )


def kv_cache(student, kv_dtype: str = "fp8", scale: str = "unit") -> Source:
    """An FP8 KV cache in every attention layer, its k/v scales `unit` (1.0: what vLLM and the RL frameworks'
    online quantization run on a checkpoint without scales, the calibration's kv level) or `calibrated` (amax / 448
    over the rollouts, what llm-compressor's kv_cache_scheme stores)."""
    kv = replace(KVCacheScheme.from_name(kv_dtype), scale=scale)
    layers = student.layers
    config = RolloutConfig(kv=kv_dtype, kv_scale=scale)
    name = f"kv {kv_dtype}" + ("" if scale == "unit" else f" ({scale} scales)")
    return Source(name, "kv", Perturbation(kv_layers=layers, kv=kv), config=config)


def recipe(student, rec: Recipe, name: str = "recipe") -> Source:
    """The recipe's FP8 units (and its FP8 KV cache, if it has one), after checking it fits this model."""
    rec.check_model(student.units, name)
    from ..model.structure import fp8_fits

    rec.check_vllm_loadable(student.units)
    units = tuple(u.name for u in rec.fp8_units(student.units))
    scheme = Scheme.from_name(rec.scheme)
    layers = rec.kv_layers(student.layers)
    kv = replace(KVCacheScheme(), scale=rec.kv_scale)
    config = RolloutConfig(
        fp8=scheme.name if units else None,
        fp8_units=units_subset(units, fp8_fits(student, scheme)),
        kv=(rec.kv_cache_dtype or "fp8") if layers else None,
        kv_scale=rec.kv_scale,
        kv_skip=tuple(rec.kv_skip_layers),
    )
    return Source(name, "recipe", Perturbation(units=units, scheme=scheme, kv_layers=layers, kv=kv), config=config)


def stale(student, checkpoint: str, allow_pickle: bool = False, lag: int | None = None) -> Source:
    """Another checkpoint of the same student as the rollout policy (`lag`: how many optimizer steps older it is,
    when known); refuses another architecture or vocabulary."""
    from ..model.student import load_student

    other = load_student(
        checkpoint,
        device=str(next(student.model.parameters()).device),
        dtype=next(student.model.parameters()).dtype,
        allow_pickle=allow_pickle,
    )
    if other.model_type != student.model_type:
        raise FP8ProbeError(
            f"`stale` {checkpoint} is a {other.model_type} model, the student a {student.model_type}: "
            "pass a checkpoint of the same student"
        )
    if other.tokenizer.get_vocab() != student.tokenizer.get_vocab():
        raise FP8ProbeError(
            f"`stale` {checkpoint} has another vocabulary than the student: pass a checkpoint of the same student"
        )
    state = {n: p.detach() for n, p in other.model.named_parameters()}
    shapes = {n: tuple(p.shape) for n, p in student.model.named_parameters()}
    if {n: tuple(t.shape) for n, t in state.items()} != shapes:
        raise FP8ProbeError(
            f"`stale` {checkpoint} has other weight names or shapes than the student: pass a "
            "checkpoint of the same student"
        )
    name = f"stale {checkpoint}" + (f" ({lag} steps)" if lag else "")
    config = RolloutConfig(stale=lag or STALE_UNKNOWN)
    return Source(name, "stale", Perturbation(stale=state), config=config)


def combine(sources: list[Source], name: str | None = None) -> Source:
    """Several sources at once: their FP8 units, KV layers, noise and stale weights together."""
    if len(sources) < 2:
        raise FP8ProbeError("a combination needs at least two sources")
    ps = [s.perturbation for s in sources]
    schemes = {p.scheme.name for p in ps if p.units}
    stales = [p.stale for p in ps if p.stale is not None]
    noises = [p for p in ps if p.noise]
    kvs = {(s.config.kv, s.config.kv_scale) for s in sources if s.config.kv is not None}
    if len(schemes) > 1 or len(stales) > 1 or len(noises) > 1 or len(kvs) > 1:
        raise FP8ProbeError(
            "a combination takes at most one FP8 scheme, one KV cache, one stale checkpoint and one noise level"
        )
    units = tuple(dict.fromkeys(u for p in ps for u in p.units))
    layers = tuple(sorted({i for p in ps for i in p.kv_layers}))
    kv = next((p.kv for p in ps if p.kv_layers), KVCacheScheme())
    base = noises[0] if noises else Perturbation()
    p = replace(
        base,
        units=units,
        scheme=Scheme.from_name(schemes.pop()) if schemes else base.scheme,
        kv_layers=layers,
        kv=kv,
        stale=stales[0] if stales else None,
    )
    return Source(
        name or " + ".join(s.name for s in sources),
        "combination",
        p,
        tuple(s.name for s in sources),
        config=merge([s.config for s in sources], units),
    )


def merge(configs: list[RolloutConfig], units: tuple[str, ...] = ()) -> RolloutConfig:
    """One configuration holding every part of `configs` (at most one of each kind: combine checks); `units`: the
    FP8 units of the whole, when two parts put units in FP8 (their union, written as a subset)."""
    fields = {}
    for c in configs:
        for k in c.kinds():
            if k == "fp8":
                fields.update(fp8=c.fp8, fp8_units=c.fp8_units)
            elif k == "kv":
                fields.update(kv=c.kv, kv_scale=c.kv_scale)
            else:
                fields[k] = getattr(c, k)
    if sum(1 for c in configs if c.fp8 is not None) > 1:
        fields["fp8_units"] = units_subset(units)
    return RolloutConfig(**fields)
