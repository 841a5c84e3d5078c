"""Loaded by every Python process of the vLLM-CPU worker (it is on their PYTHONPATH only when asked for).

On CPUs whose oneDNN has no FP8 matmul kernel (seen on an AMX / AVX10.1 Xeon: oneDNN 3.12 runs `ref:any`,
214 ms for an 8x576 by 576x1536 GEMM), vLLM-CPU's FP8 Linears take minutes per generated token. With
FP8PROBE_EMULATE_SCALED_MM=1, torch._scaled_mm on the CPU is replaced by the same arithmetic in plain fp32:
every e4m3 x e4m3 product is exact in fp32 (4-bit significands), the products are summed in fp32 as oneDNN
does, then scaled. Only the summation order can differ, as it does between two machines' GEMMs; everything
else (vLLM's loader, its activation quantization, its bf16 model) is vLLM's own. vllm_check.run_vllm sets
this when `scaled_mm_seconds()` says the kernel is the slow one, and reports it.
"""

import os
import sys


def emulated_scaled_mm(native):
    """torch._scaled_mm for CPU tensors as an fp32 GEMM of the exact FP8 values; `native` for anything else."""
    import torch

    def scaled_mm(a, b, scale_a=None, scale_b=None, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
        if a.device.type != "cpu" or scale_result is not None:
            return native(
                a,
                b,
                scale_a=scale_a,
                scale_b=scale_b,
                bias=bias,
                scale_result=scale_result,
                out_dtype=out_dtype,
                use_fast_accum=use_fast_accum,
            )
        f32 = torch.float32
        out = a.to(f32) @ b.to(f32)  # exact products, fp32 sums
        if scale_a is not None:
            out = out * scale_a.to(f32)  # [1] per tensor or [M, 1] per row: broadcasts
        if scale_b is not None:
            out = out * scale_b.to(f32)  # [1] or [1, N]
        if bias is not None:
            out = out + bias.to(f32)
        return out.to(out_dtype or a.dtype)

    return scaled_mm


if os.environ.get("FP8PROBE_EMULATE_SCALED_MM") == "1":
    import torch

    torch._scaled_mm = emulated_scaled_mm(torch._scaled_mm)
    print(f"fp8probe: torch._scaled_mm emulated in fp32 (exact FP8 products) in process {os.getpid()}", file=sys.stderr)
