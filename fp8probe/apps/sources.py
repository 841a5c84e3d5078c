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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS
from ..core.schemes import KV_CACHE_DTYPES, SCHEMES, KVCacheScheme, Scheme
from ..core.settings import Settings, opt
from ..measurement.engines import ENGINES

if TYPE_CHECKING:  # the parser and the defaults stay light: the CLI reads them for --help
    from ..measurement.perturbation import Perturbation
    from ..measurement.reference import Reference
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
            raise FP8ProbeError(f"`levels` {text}: fp8 takes a dynamic scheme ({', '.join(s for s in SCHEMES if s != 'FP8')}); "
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


def ladder(student, rollouts, sources: list[Source], reference: Reference | None = None, batch_size: int = 8,
           progress: bool = False, prefix_tokens: int | None = None, prefix_seed: int = 0, teacher=None,
           engine: str = "sim"):
    """One row per source with every metric (METRICS), measured on the same rollouts against one reference;
    a combination's row adds `sum_of_parts` (its parts' kl_q_p added up). With `prefix_tokens`, the prefix
    shift of each source (prefix.PREFIX_COLUMNS); with a `teacher`, its OPD-signal distortion
    (opd.OPD_COLUMNS); every figure as `engine` computes it (measure.candidate_model). Returns a DataFrame."""
    import pandas as pd
    from tqdm.auto import tqdm

    from ..measurement.measure import measure_candidate
    from ..measurement.opd import OPD_COLUMNS, OPDSignal
    from ..measurement.prefix import PREFIX_COLUMNS, PrefixShift, prompt_ids
    from ..measurement.reference import Reference

    if reference is None:
        reference = Reference(student, rollouts, batch_size)
    shift = PrefixShift(student, reference, prompt_ids(student, rollouts), prefix_tokens, seed=prefix_seed,
                        batch_size=batch_size, engine=engine) if prefix_tokens else None
    opd = OPDSignal(student, teacher, reference, engine) if teacher is not None else None
    rows, by_name = [], {}
    for s in tqdm(sources, desc="ladder", unit="source", disable=not progress):
        m = measure_candidate(reference, student, rollouts, s.perturbation, engine, batch_size)
        by_name[s.name] = m
        parts = [by_name[p]["kl_q_p"] for p in s.parts if p in by_name]
        row = {"source": s.name, "kind": s.kind, "sigma": s.value if s.value is not None else float("nan"),
               **{k: m[k] for k in METRICS},
               "sum_of_parts": sum(parts) if s.parts and len(parts) == len(s.parts) else float("nan")}
        if shift is not None:
            row.update(shift.measure(s.perturbation))
        if opd is not None:
            row.update(opd.measure(s.perturbation))
        rows.append(row)
    columns = LADDER_COLUMNS + (PREFIX_COLUMNS if shift else []) + (OPD_COLUMNS if opd else [])
    return pd.DataFrame(rows, columns=columns)


LADDER_COLUMNS = ["source", "kind", "sigma", *METRICS, "sum_of_parts"]


# ---------------------------------------------------------------------------------------------------
# the ladder and the check as commands: the shortcuts a user names, checked before any output


@dataclass(frozen=True)
class Shortcuts(Settings):
    """The rollout shortcuts a command measures: FP8 `recipe` files (their weights and KV cache), FP8 KV caches
    (`kv_cache_dtype`), other checkpoints of the student as the rollout policy (`stale`), a `teacher` sharing its
    tokenizer (the OPD-signal distortion), every figure as `engine` computes it (default: the simulation)."""

    recipe: tuple[str, ...] = opt((), "recipe.yaml file(s): FP8 weights (+ their FP8 KV cache)")
    kv_cache_dtype: tuple[str, ...] = opt((), f"FP8 KV cache(s): {', '.join(KV_CACHE_DTYPES)}")
    stale: tuple[str, ...] = opt((), "other checkpoint(s) of the student as the rollout policy")
    teacher: str | None = opt(None, "a teacher sharing the student's tokenizer: adds the OPD-signal distortion")
    engine: str = opt("sim", "sim: every shortcut in the reference-dtype model, as recipes and budgets are measured; "
                      "vllm-cuda / vllm-cpu: every figure as vLLM 0.32 computes it", choices=ENGINES)

    def check(self, model) -> None:
        """Everything readable and covered by the engine, before any output exists (`model`: the ModelSource)."""
        from dataclasses import replace as with_

        from ..recipe.recipe import read_recipe

        eng = ENGINES[self.engine]
        for path in self.recipe:
            rec = read_recipe(path)
            eng.check(rec.preset, KVCacheScheme() if rec.kv_cache_scheme else None)
        for kv in self.kv_cache_dtype:
            eng.check(Scheme.from_name("FP8_DYNAMIC"), KVCacheScheme.from_name(kv))
        for path in [*self.stale, *([self.teacher] if self.teacher else [])]:
            with_(model, model=path).check()

    def sources(self, student, allow_pickle: bool = False) -> list[Source]:
        from ..recipe.recipe import read_recipe

        out = [recipe(student, read_recipe(p), name=f"recipe {p}") for p in self.recipe]
        out += [kv_cache(student, d) for d in self.kv_cache_dtype]
        out += [stale(student, c, allow_pickle=allow_pickle) for c in self.stale]
        return out

    def load_teacher(self, model):
        from dataclasses import replace as with_

        if not self.teacher:
            return None
        log.info("loading the teacher %s", self.teacher)
        return with_(model, model=self.teacher).load()


@dataclass(frozen=True)
class LadderSettings(Settings):
    """The shortcuts, on a ruler of seeded weight noise (`noise` levels, `noise_seed`; default NOISE_RULER), all
    at once too when `combine`, with the prefix shift of each unless not `prefix_shift`."""

    shortcuts: Shortcuts = field(default_factory=Shortcuts)
    noise: tuple[float, ...] | None = opt(None, "relative weight-noise levels σ (x each tensor's std); default: "
                                          + " ".join(f"{x:g}" for x in NOISE_RULER), low=0.0, open_low=True)
    noise_seed: int = opt(0, "seed of the noise draws", low=0)
    combine: bool = opt(False, "also measure the recipe, KV and stale sources together")
    prefix_shift: bool = opt(True, "skip the prefix-shift columns (faster)", flag="--no-prefix-shift")


def run_ladder(model, rollouts, settings: LadderSettings, out, progress: bool = False):
    """Every source on one scale (ladder()), written as DIR/ladder.csv and DIR/ladder.json; returns the table."""
    import time

    from ..core.artifacts import arithmetic, stamped, versions
    from ..core.files import atomic_write_json, atomic_write_text, output_dir
    from ..measurement.perturbation import Perturbation
    from .inputs import check_inputs, load, rollouts_for

    sc = settings.shortcuts
    check_inputs(model, rollouts, out)
    sc.check(model)
    t0 = time.perf_counter()
    with output_dir(out) as d:
        student, _ = load(model)
        teacher = sc.load_teacher(model)
        r, _ = rollouts_for(student, rollouts, d, progress=progress)
        named = sc.sources(student, model.allow_pickle)
        steps = [noise(student, s, settings.noise_seed) for s in (settings.noise or NOISE_RULER)] + named
        if settings.combine:
            steps.append(combine(named))
        if sc.engine != "sim":  # what the engine's own arithmetic costs with no shortcut at all
            steps.insert(0, Source(f"{sc.engine} alone", "engine", Perturbation()))
        df = ladder(student, r, steps, batch_size=rollouts.batch_size, progress=progress,
                    prefix_tokens=rollouts.max_new_tokens if settings.prefix_shift else None,
                    prefix_seed=rollouts.seed, teacher=teacher, engine=sc.engine)
        atomic_write_text(d / "ladder.csv", df.to_csv(index=False, float_format="%.17g"))
        atomic_write_json(d / "ladder.json", stamped("ladder.json", {
            "command": "ladder", "model": student.name, "teacher": sc.teacher, "engine": sc.engine,
            "sources": [{"name": s.name, "kind": s.kind, "parts": list(s.parts)} for s in steps],
            "num_sequences": r.num_sequences, "num_response_tokens": r.num_response_tokens,
            "noise_seed": settings.noise_seed, "prefix_seed": rollouts.seed,
            "arithmetic": arithmetic(rollouts.batch_size),
            "seconds": round(time.perf_counter() - t0, 3), "versions": versions()}))
    return df


def describe(df, out, seconds: float) -> str:
    cols = [c for c in ("source", "kl_q_p", "k3", "top1_agree", "sum_of_parts", "diverged", "first_div_mean",
                        "kl_q_p_own", "mean_abs_reward_delta", "ratio_out_verl") if c in df.columns]
    return (df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}")
            + f"\nladder: {len(df)} sources in {seconds:.0f} s -> {out}/ladder.csv")
