"""The student under a Perturbation (perturbation.py).

`apply_perturbation` puts the student in that state for the duration (the hooks of quantize.py, attention.py and
weights.py; restored exactly on exit); `perturbed_stats` runs the candidate pass against the reference from a given
block (reference.py reuses the prefix) and, when asked, the SQNR of the perturbed units' own outputs (torchao's
definition, a cheap local second view): the simulation's measurement as a sweep's row takes it (measure.py's
`measure` is the door every other measurement goes through).
"""

from __future__ import annotations

import contextlib

from torch import nn

from ..core.numerics import energy, sqnr_db_from_energy
from ..model.structure import is_experts
from .attention import quantize_kv
from .perturbation import Perturbation
from .quantize import quantize_units
from .reference import Reference
from .weights import add_noise, swap_weights


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
                handles.append(
                    mod.register_forward_pre_hook(lambda m, a, box=box: box.__setitem__("x", a[0]), prepend=True)
                )
                handles.append(
                    mod.register_forward_hook(
                        lambda m, a, out, box=box, w=w, b=b: energy.add(nn.functional.linear(box.pop("x"), w, b), out)
                    )
                )
            elif is_experts(mod):
                handles.append(mod.register_forward_hook(lambda m, a, out: energy.add(type(m).forward(m, *a), out)))
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def apply_perturbation(
    student, p: Perturbation, calibration=None, energy: _Energy | None = None, many_forwards: bool = False
):
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
            stack.enter_context(
                quantize_units(model, p.units, p.scheme, calibration=calibration, just_in_time=not many_forwards)
            )
        if p.kv_layers:
            observe_kv = energy is not None and not p.units  # a KV row: the SQNR of K and V themselves
            stack.enter_context(
                quantize_kv(
                    model, p.kv_layers, p.kv, calibration=calibration, observer=energy.add_kv if observe_kv else None
                )
            )
        yield


def perturbed_stats(
    reference: Reference, student, p: Perturbation, start_block: int | None = None, sqnr: bool = False
) -> tuple[dict, float | None]:
    """(the per-token statistics of `p` against the reference, mismatch.token_stats; the SQNR of the perturbed
    units' or, with no units, the K/V tensors' own outputs against their unperturbed values when `sqnr`, else None),
    the candidate pass starting at `start_block` (default: the first block `p` touches)."""
    energy = _Energy() if sqnr else None
    with apply_perturbation(student, p, reference.calibration, energy):
        start = p.start_block(student) if start_block is None else start_block
        stats = reference.candidate_stats(start)
    return stats, (energy.db if sqnr else None)
