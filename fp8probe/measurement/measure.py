"""One perturbation of the student measured against the reference: the one measurement function.

A `Perturbation` says what the rollout engine does differently from the trainer: stale weights (another
checkpoint of the student), weight noise, units in FP8, an FP8 KV cache, or several of these at once,
applied in that order (the rollout engine quantizes the weights it holds); `measure_perturbation` applies it with the hooks (hooks.py), runs the candidate
pass from the first block it touches (reference.py reuses the prefix), and returns every metric of
metrics.py, plus the SQNR of the perturbed units' own outputs when asked (torchao's definition, a cheap
local second view). The sweep measures one perturbation per row; recipes, whole-model checks and the
comparison with vLLM measure theirs with the same function.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from torch import nn

from ..core.numerics import energy, sqnr_db_from_energy
from .weights import add_noise, swap_weights
from .attention import quantize_kv
from .quantize import quantize_units
from ..core.metrics import METRICS
from .mismatch import summarize
from .reference import Reference
from ..core.schemes import KVCacheScheme, Scheme
from ..model.structure import is_experts


@dataclass(frozen=True)
class Perturbation:
    """What differs from the reference: `units` in `scheme`, the KV cache of `kv_layers` in `kv`, Gaussian
    noise of `noise` x each tensor's std on `noise_units` (seeded), every weight from `stale` (name -> tensor
    of another checkpoint of the same model)."""

    units: tuple[str, ...] = ()
    scheme: Scheme = Scheme.from_name("FP8_DYNAMIC")
    kv_layers: tuple[int, ...] = ()
    kv: KVCacheScheme = KVCacheScheme()
    noise: float = 0.0
    noise_units: tuple[str, ...] = ()
    noise_seed: int = 0
    stale: dict | None = field(default=None, compare=False, repr=False)

    def start_block(self, student) -> int:
        """The first decoder block whose output changes: the candidate pass starts there (-1: embeddings)."""
        if self.stale is not None:
            return -1
        noised = self.noise_units if self.noise else ()
        blocks = [student.unit(n).block for n in (*self.units, *noised)] + list(self.kv_layers)
        return min(blocks) if blocks else student.model.config.num_hidden_layers - 1


class _Energy:
    """Signal and noise energies summed over every forward, for one SQNR over all of them."""

    def __init__(self):
        self.signal = 0.0
        self.noise = 0.0

    def add(self, ref, approx):
        ref = ref.float()
        self.signal += energy(ref)
        self.noise += energy(ref - approx.float())

    def add_kv(self, k, kq, v, vq):
        self.add(k, kq)
        self.add(v, vq)

    @property
    def db(self) -> float:
        return sqnr_db_from_energy(self.signal, self.noise)


@contextlib.contextmanager
def _observe_outputs(model: nn.Module, names, energy: _Energy):
    """Compare each named unit's output with what its original weights give on the same input."""
    handles = []
    try:
        for n in names:
            mod = model.get_submodule(n)
            if isinstance(mod, nn.Linear):
                w, b = mod.weight.data, mod.bias
                box = {}
                handles.append(mod.register_forward_pre_hook(lambda m, a, box=box: box.__setitem__("x", a[0]),
                                                             prepend=True))
                handles.append(mod.register_forward_hook(
                    lambda m, a, out, box=box, w=w, b=b: energy.add(nn.functional.linear(box.pop("x"), w, b), out)))
            elif is_experts(mod):
                handles.append(mod.register_forward_hook(
                    lambda m, a, out: energy.add(type(m).forward(m, *a), out)))
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def apply_perturbation(student, p: Perturbation, calibration=None, energy: _Energy | None = None,
                       many_forwards: bool = False):
    """The student as the rollout engine runs it, for the duration: stale weights, then noise, then FP8 units
    and KV cache (static scales from `calibration`). With `energy`, the perturbed units' (or, with no units,
    the K/V tensors') outputs are compared with their unperturbed values. `many_forwards` (generation)
    dequantizes FP8 weights once instead of before every forward."""
    model = student.model
    with contextlib.ExitStack() as stack:
        if p.stale is not None:
            stack.enter_context(swap_weights(model, p.stale))
        if p.noise:
            stack.enter_context(add_noise(model, p.noise_units, p.noise, p.noise_seed))
        if p.units:
            if energy is not None:
                stack.enter_context(_observe_outputs(model, p.units, energy))
            stack.enter_context(quantize_units(model, p.units, p.scheme, calibration=calibration,
                                               just_in_time=not many_forwards))
        if p.kv_layers:
            observe_kv = energy is not None and not p.units  # a KV row: the SQNR of K and V themselves
            stack.enter_context(quantize_kv(model, p.kv_layers, p.kv, calibration=calibration,
                                            observer=energy.add_kv if observe_kv else None))
        yield


def measure_perturbation(reference: Reference, student, p: Perturbation, start_block: int | None = None,
                         sqnr: bool = False) -> dict[str, float]:
    """Every metric of `p` against the reference (METRICS keys), plus "sqnr_db" when `sqnr`: the perturbed
    units' (or, with no units, the K/V tensors') own outputs against their unperturbed values."""
    energy = _Energy() if sqnr else None
    with apply_perturbation(student, p, reference.calibration, energy):
        start = p.start_block(student) if start_block is None else start_block
        out = summarize(reference.candidate_stats(start))
    if sqnr:
        out["sqnr_db"] = energy.db
    return out


@contextlib.contextmanager
def candidate_model(student, p: Perturbation, calibration=None, engine: str = "sim", many_forwards: bool = False):
    """The rollout engine's model under `p`, for the duration. "sim": the student itself under the hooks
    (apply_perturbation). An engine profile (engines.py): stale weights and noise applied to the student, then
    the engine's bf16 copy of it with p's FP8 units and FP8 KV layers as vLLM computes them."""
    if engine == "sim":
        with apply_perturbation(student, p, calibration, many_forwards=many_forwards):
            yield student.model
        return
    from dataclasses import replace

    from .engines import engine_model

    with apply_perturbation(student, replace(p, units=(), kv_layers=())), \
            engine_model(student, p.units, p.scheme, engine, p.kv if p.kv_layers else None, calibration,
                         kv_layers=p.kv_layers) as m:
        yield m


def measure_candidate(reference: Reference, student, rollouts, p: Perturbation, engine: str = "sim",
                      batch_size: int = 8) -> dict[str, float]:
    """Every metric of `p` against the reference, through `engine`: the sim reuses the reference's prefix
    (measure_perturbation); a profile runs its whole copy of the model over the rollouts."""
    if engine == "sim":
        return measure_perturbation(reference, student, p)
    from .engines import response_logp
    from .mismatch import token_stats

    with candidate_model(student, p, reference.calibration, engine) as m:
        rows, _ = response_logp(m, rollouts, batch_size)
    return summarize(token_stats(reference.rows, rows))


def measure(student, rollouts, scheme="FP8_DYNAMIC", units=None, kv=None, reference: Reference | None = None,
            batch_size: int = 8, engine: str = "sim") -> dict[str, float]:
    """Mismatch metrics of `units` (names; all quantizable units when None) in `scheme`, plus an FP8 KV
    cache in every layer when `kv` is given ("fp8", "fp8_e5m2" or a KVCacheScheme), against the reference;
    computed as `engine` does ("sim", or an engines.py profile: "vllm-cuda", "vllm-cpu")."""
    scheme = Scheme.from_name(scheme)
    kv_scheme = KVCacheScheme.from_name(kv) if kv is not None else KVCacheScheme()
    if engine != "sim":
        from .engines import check_profiled

        check_profiled(engine, scheme.name, kv_scheme if kv is not None else None)
    if reference is None:
        reference = Reference(student, rollouts, batch_size, kv_strategy=kv_scheme.strategy)
    names = list(student.unit_names) if units is None else list(units)
    kv_layers = student.layers if kv is not None else ()
    p = Perturbation(tuple(names), scheme, kv_layers, kv_scheme)
    result = measure_candidate(reference, student, rollouts, p, engine, batch_size)
    return {k: result[k] for k in METRICS}
