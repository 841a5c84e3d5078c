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

from dataclasses import dataclass, replace

from ..core.errors import FP8ProbeError
from ..measurement.perturbation import Perturbation
from ..measurement.measure import measure_candidate
from ..core.metrics import METRICS
from ..measurement.opd import OPD_COLUMNS, OPDSignal
from ..measurement.prefix import PREFIX_COLUMNS, PrefixShift, prompt_ids
from ..recipe.recipe import Recipe
from ..measurement.reference import Reference
from ..core.schemes import KVCacheScheme, Scheme
from ..model.student import load_student

DEFAULT_SIGMAS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)


@dataclass(frozen=True)
class Source:
    name: str  # the row label
    kind: str  # recipe | kv | stale | noise | combination | engine (the engine alone: no shortcut)
    perturbation: Perturbation
    parts: tuple[str, ...] = ()  # a combination's sources
    value: float | None = None  # noise: σ


def noise(student, sigma: float, seed: int = 0) -> Source:
    if not sigma > 0:
        raise FP8ProbeError(f"--noise {sigma}: a noise scale must be a positive number")
    units = student.unit_names
    return Source(f"noise {sigma:g}", "noise", Perturbation(noise=sigma, noise_units=units, noise_seed=seed),
                  value=sigma)


def kv_cache(student, kv_dtype: str = "fp8") -> Source:
    kv = KVCacheScheme.from_name(kv_dtype)
    layers = student.layers
    return Source(f"kv {kv_dtype}", "kv", Perturbation(kv_layers=layers, kv=kv))


def recipe(student, rec: Recipe, name: str = "recipe") -> Source:
    """The recipe's FP8 units (and its FP8 KV cache, if it has one), after checking it fits this model."""
    rec.check_model(student.units, name)
    rec.check_vllm_loadable(student.units)
    units = tuple(u.name for u in rec.fp8_units(student.units))
    layers = student.layers if rec.kv_cache_scheme is not None else ()
    return Source(name, "recipe", Perturbation(units=units, scheme=Scheme.from_name(rec.scheme), kv_layers=layers))


def stale(student, checkpoint: str, allow_pickle: bool = False) -> Source:
    """Another checkpoint of the same student as the rollout policy; refuses another architecture or vocabulary."""
    other = load_student(checkpoint, device=str(next(student.model.parameters()).device),
                         dtype=next(student.model.parameters()).dtype, allow_pickle=allow_pickle)
    if other.model_type != student.model_type:
        raise FP8ProbeError(f"--stale {checkpoint} is a {other.model_type} model, the student a {student.model_type}: "
                            "pass a checkpoint of the same student")
    if other.tokenizer.get_vocab() != student.tokenizer.get_vocab():
        raise FP8ProbeError(f"--stale {checkpoint} has another vocabulary than the student: pass a checkpoint of the "
                            "same student")
    state = {n: p.detach() for n, p in other.model.named_parameters()}
    shapes = {n: tuple(p.shape) for n, p in student.model.named_parameters()}
    if {n: tuple(t.shape) for n, t in state.items()} != shapes:
        raise FP8ProbeError(f"--stale {checkpoint} has other weight names or shapes than the student: pass a "
                            "checkpoint of the same student")
    return Source(f"stale {checkpoint}", "stale", Perturbation(stale=state))


def combine(sources: list[Source], name: str | None = None) -> Source:
    """Several sources at once: their FP8 units, KV layers, noise and stale weights together."""
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
