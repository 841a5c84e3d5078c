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
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..core.errors import FP8ProbeError
from ..core.schemes import KV_CACHE_DTYPES, SCHEMES, KVCacheScheme, Scheme

if TYPE_CHECKING:  # the parser and the defaults stay light: the CLI reads them for --help
    from ..measurement.perturbation import Perturbation
    from ..recipe.recipe import Recipe

log = logging.getLogger(__name__)

NOISE_RULER = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)  # the ladder's default noise levels: the ruler other sources sit on
CALIBRATION_LEVELS = ("0", "0.003", "0.01", "0.03", "0.1")  # calibrate's default ladder of training runs


@dataclass(frozen=True)
class SourceSpec:
    """A mismatch source as a user names it, before a student is at hand: `none`, `noise` σ, `fp8` (every unit, a
    scheme), `kv` (an FP8 KV cache, scale 1.0 as online engines use it) or `stale` K steps (a calibration's rollouts
    from the weights of K updates ago). What `calibrate --levels` takes, one parser for every command."""

    kind: str
    value: float | None = None
    scheme: str | None = None

    @property
    def name(self) -> str:
        if self.kind == "none":
            return "0"
        if self.kind == "noise":
            return f"{self.value:g}"
        if self.kind == "stale":
            return f"stale:{int(self.value)}"
        return f"{self.kind}:{self.scheme}"

    @property
    def slug(self) -> str:
        return "noise-" + self.name if self.kind == "noise" else self.name.replace(":", "-")


SOURCE_HELP = ("a number: weight noise σ (x each tensor's std; 0: no mismatch); fp8[:SCHEME] (every unit in FP8, "
              "default FP8_DYNAMIC); kv[:DTYPE] (FP8 KV cache, default fp8); stale:K (rollouts from the weights of "
              "K updates ago)")


def parse_source(text: str) -> SourceSpec:
    t = str(text).strip()
    try:
        v = float(t)
    except ValueError:
        v = None
    if v is not None:
        if not math.isfinite(v) or v < 0:
            raise FP8ProbeError(f"`levels` {text}: a noise level must be a finite number >= 0")
        return SourceSpec("none") if v == 0 else SourceSpec("noise", v)
    kind, _, arg = t.partition(":")
    if kind == "fp8":
        scheme = arg or "FP8_DYNAMIC"
        if scheme not in SCHEMES or scheme == "FP8":
            dynamic = ', '.join(s for s in SCHEMES if s != 'FP8')
            raise FP8ProbeError(f"`levels` {text}: fp8 takes a dynamic scheme ({dynamic}); "
                                "static activation scales need a calibration the rollout engine does not redo per step")
        return SourceSpec("fp8", scheme=scheme)
    if kind == "kv":
        dtype = arg or "fp8"
        if dtype not in KV_CACHE_DTYPES:
            raise FP8ProbeError(f"`levels` {text}: unknown KV-cache dtype; one of {', '.join(KV_CACHE_DTYPES)}")
        return SourceSpec("kv", scheme=dtype)
    if kind == "stale":
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if k < 1:
            raise FP8ProbeError(f"`levels` {text}: stale:K needs a whole number of steps K >= 1")
        return SourceSpec("stale", float(k))
    raise FP8ProbeError(f"`levels` {text}: not a level; {SOURCE_HELP}")




@dataclass(frozen=True)
class Source:
    name: str  # the row label
    kind: str  # recipe | kv | stale | noise | combination | engine (the engine alone: no shortcut)
    perturbation: Perturbation
    parts: tuple[str, ...] = ()  # a combination's sources
    value: float | None = None  # noise: σ


def noise(student, sigma: float, seed: int = 0) -> Source:
    from ..measurement.perturbation import Perturbation

    if not sigma > 0:
        raise FP8ProbeError(f"`noise` {sigma}: a noise scale must be a positive number")
    units = student.unit_names
    return Source(f"noise {sigma:g}", "noise", Perturbation(noise=sigma, noise_units=units, noise_seed=seed),
                  value=sigma)


def kv_cache(student, kv_dtype: str = "fp8") -> Source:
    from ..measurement.perturbation import Perturbation

    kv = KVCacheScheme.from_name(kv_dtype)
    layers = student.layers
    return Source(f"kv {kv_dtype}", "kv", Perturbation(kv_layers=layers, kv=kv))


def recipe(student, rec: Recipe, name: str = "recipe") -> Source:
    """The recipe's FP8 units (and its FP8 KV cache, if it has one), after checking it fits this model."""
    from ..measurement.perturbation import Perturbation

    rec.check_model(student.units, name)
    rec.check_vllm_loadable(student.units)
    units = tuple(u.name for u in rec.fp8_units(student.units))
    layers = student.layers if rec.kv_cache_scheme is not None else ()
    return Source(name, "recipe", Perturbation(units=units, scheme=Scheme.from_name(rec.scheme), kv_layers=layers))


def stale(student, checkpoint: str, allow_pickle: bool = False) -> Source:
    """Another checkpoint of the same student as the rollout policy; refuses another architecture or vocabulary."""
    from ..measurement.perturbation import Perturbation
    from ..model.student import load_student

    other = load_student(checkpoint, device=str(next(student.model.parameters()).device),
                         dtype=next(student.model.parameters()).dtype, allow_pickle=allow_pickle)
    if other.model_type != student.model_type:
        raise FP8ProbeError(f"`stale` {checkpoint} is a {other.model_type} model, the student a {student.model_type}: "
                            "pass a checkpoint of the same student")
    if other.tokenizer.get_vocab() != student.tokenizer.get_vocab():
        raise FP8ProbeError(f"`stale` {checkpoint} has another vocabulary than the student: pass a checkpoint of the "
                            "same student")
    state = {n: p.detach() for n, p in other.model.named_parameters()}
    shapes = {n: tuple(p.shape) for n, p in student.model.named_parameters()}
    if {n: tuple(t.shape) for n, t in state.items()} != shapes:
        raise FP8ProbeError(f"`stale` {checkpoint} has other weight names or shapes than the student: pass a "
                            "checkpoint of the same student")
    return Source(f"stale {checkpoint}", "stale", Perturbation(stale=state))


def combine(sources: list[Source], name: str | None = None) -> Source:
    """Several sources at once: their FP8 units, KV layers, noise and stale weights together."""
    from ..measurement.perturbation import Perturbation

    if len(sources) < 2:
        raise FP8ProbeError("a combination needs at least two sources")
    ps = [s.perturbation for s in sources]
    schemes = {p.scheme.name for p in ps if p.units}
    stales = [p.stale for p in ps if p.stale is not None]
    noises = [p for p in ps if p.noise]
    if len(schemes) > 1 or len(stales) > 1 or len(noises) > 1:
        raise FP8ProbeError("a combination takes at most one FP8 scheme, one stale checkpoint and one noise level")
    units = tuple(dict.fromkeys(u for p in ps for u in p.units))
    layers = tuple(sorted({i for p in ps for i in p.kv_layers}))
    kv = next((p.kv for p in ps if p.kv_layers), KVCacheScheme())
    base = noises[0] if noises else Perturbation()
    p = replace(base, units=units, scheme=Scheme.from_name(schemes.pop()) if schemes else base.scheme,
                kv_layers=layers, kv=kv, stale=stales[0] if stales else None)
    return Source(name or " + ".join(s.name for s in sources), "combination", p, tuple(s.name for s in sources))
