"""The rollout engine's arithmetic, step by step: profiles of what vLLM 0.32.0 computes for an FP8 W8A8 recipe.

fp8probe's sweep simulates FP8 units inside an fp32 model (the trainer's reference dtype). A rollout engine
runs the whole model in its own dtype (bf16) and quantizes activations its own way. A profile follows the
engine's steps, read from vLLM 0.32.0's source (the README's table names the files):

    model          every op in the engine dtype (bf16): embeddings, norms, rotary, attention, SiLU, residuals
    activation     per-token amax of the bf16 input, in fp32; scale = max(amax / 448, 1 / (448 * 512));
                   codes = e4m3(clamp(x.float() * scale.reciprocal(), ±448))   (QuantFP8.forward_native)
    weights        the checkpoint's codes and per-channel scales (bf16-stored, as llm-compressor writes them;
                   hooks._checkpoint_codes, equal to the exported checkpoint bit for bit)
    GEMM           codes x codes in fp32 (torch._scaled_mm with unit scales on the CPU fallback, CUTLASS's fp32
                   accumulator on CUDA), then * x_scale * w_scale in fp32, + bias, cast to bf16

    vllm-cpu       ChannelWiseTorchFP8ScaledMMLinearKernel (no AMX: this machine's path)
    vllm-cuda      CUTLASS / FlashInfer scaled-mm: the same arithmetic, epilogue in fp32, bf16 out

Where a profile is not exact: the fp32 summation order of the GEMM (MKL here, oneDNN / CUTLASS there), and
every non-FP8 op, which is transformers' bf16 implementation, not vLLM's kernels (their difference is the
BF16 noise floor, measured by benchmarks/vllm_mismatch.py). Covered: FP8_DYNAMIC Linears. Not covered: static
or block schemes, experts, and the FP8 KV cache (vLLM-CPU's needs AVX-512; on CUDA it also quantizes the
query, which no profile here does yet).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch

from .errors import FP8ProbeError

FP8_MAX = 448.0
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # vLLM's _FP8_MIN_SCALING_FACTOR


@dataclass(frozen=True)
class EngineProfile:
    name: str
    dtype: torch.dtype
    kernel: str


ENGINES = {
    "vllm-cuda": EngineProfile("vllm-cuda", torch.bfloat16, "CUTLASS/FlashInfer scaled-mm, fp32 epilogue, bf16 out"),
    "vllm-cpu": EngineProfile("vllm-cpu", torch.bfloat16,
                              "torch._scaled_mm (unit scales, fp32 out), * x_scale * w_scale in fp32, bf16 out"),
}


def engine(name: str) -> EngineProfile:
    if name not in ENGINES:
        raise FP8ProbeError(f"unknown engine profile {name!r}; supported: {', '.join(ENGINES)}")
    return ENGINES[name]


def quantize_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's dynamic per-token activation quantization: (e4m3 codes, fp32 scale [..., 1])."""
    amax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    codes = (x.to(torch.float32) * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def _fp8_linear(w_codes: torch.Tensor, w_scale: torch.Tensor, bias, out_dtype):
    wt = w_codes.to(torch.float32).t().contiguous()  # [in, out], exact
    ws = w_scale.to(torch.float32).reshape(1, -1)  # per output channel
    b = bias.to(torch.float32) if bias is not None else None

    def forward(x):
        shape = x.shape
        codes, xs = quantize_activation(x.reshape(-1, shape[-1]))
        out = (codes.to(torch.float32) @ wt) * xs * ws
        if b is not None:
            out = out + b
        return out.to(out_dtype).reshape(*shape[:-1], wt.shape[1])

    return forward


@contextlib.contextmanager
def engine_model(student, units, scheme="FP8_DYNAMIC", profile: EngineProfile | str = "vllm-cpu"):
    """A copy of the student as the engine runs it: the engine dtype everywhere, `units` as vLLM's FP8 Linears
    (codes and scales from the student's own weights, as the exported checkpoint holds them)."""
    from .hooks import _checkpoint_codes
    from .schemes import Scheme

    profile = engine(profile) if isinstance(profile, str) else profile
    scheme = Scheme.from_name(scheme)
    if scheme.name != "FP8_DYNAMIC":
        raise FP8ProbeError(f"engine profiles cover FP8_DYNAMIC recipes; {scheme.name} is not profiled yet")
    codes = _checkpoint_codes(student.model, list(units), scheme)
    model = copy.deepcopy(student.model).to(profile.dtype)
    for name, (c, s) in codes.items():
        mod = model.get_submodule(name)
        if not isinstance(mod, torch.nn.Linear):
            raise FP8ProbeError(f"{name}: engine profiles cover Linear units, not experts")
        mod.forward = _fp8_linear(c, s, mod.bias, profile.dtype)
    try:
        yield model
    finally:
        del model


def response_logp(model, rollouts, batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-probabilities [M, V] at the positions that predict the response tokens, and those tokens [M]."""
    from .mismatch import log_softmax32
    from .reference import response_rows

    rows, toks = response_rows(model, rollouts, batch_size)
    return log_softmax32(rows, getattr(model.config, "final_logit_softcapping", None)), toks


def check_profiled(scheme, kv=None) -> None:
    """One line for what no profile covers yet (before any output exists)."""
    from .schemes import Scheme

    if Scheme.from_name(scheme).name != "FP8_DYNAMIC":
        raise FP8ProbeError(f"--engine profiles cover FP8_DYNAMIC; {scheme} is not profiled yet: use --engine sim")
    if kv:
        raise FP8ProbeError("--engine profiles do not cover the FP8 KV cache yet: use --engine sim for "
                            "--kv-cache-dtype")


def measure_engine(student, rollouts, units, scheme="FP8_DYNAMIC", profile: EngineProfile | str = "vllm-cpu",
                   reference=None, batch_size: int = 8) -> dict[str, float]:
    """Every metric of `units` in FP8 as the engine runs them (the whole model in its dtype) against the fp32
    reference (the trainer): the same scale as measure.measure, through the engine profile."""
    from .metrics import METRICS
    from .mismatch import summarize, token_stats
    from .reference import Reference

    check_profiled(scheme)
    if reference is None:
        reference = Reference(student, rollouts, batch_size, calibrate=False)
    with engine_model(student, units, scheme, profile) as m:
        rows, toks = response_logp(m, rollouts, batch_size)
    if not torch.equal(toks, reference.rows.tokens):
        raise FP8ProbeError("the engine pass and the reference disagree on the response tokens; this is a bug")
    out = summarize(token_stats(reference.rows, rows))
    return {k: out[k] for k in METRICS}
