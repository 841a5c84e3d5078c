"""BF16 against FP8 GEMMs at decode shapes, measured on a GPU beside the throughput model's per-layer prediction.

    python benchmarks/gemm_roofline.py --device cuda [--gpu H200] [--sizes 1.7B 8B] [--batches 1 16 64 256]

For each Linear of a Qwen3 decoder block (vLLM's fused qkv_proj and gate_up_proj, o_proj, down_proj) and each
batch of B tokens: torch.mm in BF16, and the FP8_DYNAMIC path vLLM takes on Hopper (per-token activation scales
computed on the fly, clamp, cast, then torch._scaled_mm with per-channel weight scales), best of 20 CUDA-event
timings after warm-up. Beside each: the model's time for that layer (deploy/throughput.py's roofline, the GPU's
datasheet peaks, the default efficiencies, no overheads), and the measured and modelled FP8 speed-ups. Prints a
table; --json writes it. `--device cpu --sizes tiny` is a smoke test of the script (CPU timings say nothing
about a GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from fp8probe.deploy.throughput import BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY, Device

SHAPES = {  # hidden, intermediate, heads, kv heads, head_dim (Qwen/Qwen3-*/config.json)
    "1.7B": (2048, 6144, 16, 8, 128),
    "8B": (4096, 12288, 32, 8, 128),
    "tiny": (256, 512, 4, 2, 64),
}
FP8_MAX = 448.0


def layers(size: str) -> dict[str, tuple[int, int]]:
    """name -> (in_features, out_features) of the block's GEMMs as vLLM fuses them."""
    h, inter, heads, kv, d = SHAPES[size]
    return {
        "qkv_proj": (h, (heads + 2 * kv) * d),
        "o_proj": (heads * d, h),
        "gate_up_proj": (h, 2 * inter),
        "down_proj": (inter, h),
    }


def timed(fn, device: str, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    if device.startswith("cuda"):
        best = float("inf")
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        return best
    import time

    best = float("inf")
    for _ in range(max(3, reps // 4)):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def fp8_linear(x, w8, w_scale):
    """vLLM's FP8_DYNAMIC linear: per-token scales from the activations, clamp, cast, scaled GEMM."""
    s = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    x8 = (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return torch._scaled_mm(x8, w8, scale_a=s, scale_b=w_scale, out_dtype=torch.bfloat16)


def modelled(dev: Device, k: int, n: int, b: int, fp8: bool) -> float:
    bytes_ = k * n * (1 if fp8 else 2) + (4 * n if fp8 else 0) + 2 * b * (k + n)
    flops = 2 * b * k * n
    peak = dev.fp8_flops if fp8 and dev.fp8_flops else dev.bf16_flops
    return max(bytes_ / (dev.bytes_per_s * BANDWIDTH_EFFICIENCY), flops / (peak * COMPUTE_EFFICIENCY))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gpu", default="H200", help="the GPU of the table the model predicts for")
    ap.add_argument("--sizes", nargs="+", default=["1.7B", "8B"], choices=list(SHAPES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64, 256])
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("gemm_roofline: no CUDA device here; pass --device cpu --sizes tiny for a smoke test", file=sys.stderr)
        return 2
    dev = Device.from_gpu(a.gpu)
    rows = []
    print(
        f"{'size':<6}{'layer':<14}{'B':>5}{'bf16 us':>10}{'model':>9}{'fp8 us':>10}{'model':>9}"
        f"{'fp8 gain':>10}{'model':>8}"
    )
    for size in a.sizes:
        for name, (k, n) in layers(size).items():
            w = torch.randn(n, k, device=a.device, dtype=torch.bfloat16) * 0.02
            ws = (w.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)  # [N, 1]
            w8 = (w.float() / ws).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).t()  # [K, N], column-major
            for b in a.batches:
                x = torch.randn(b, k, device=a.device, dtype=torch.bfloat16)
                t16 = timed(lambda: x @ w.t(), a.device)
                t8 = timed(lambda: fp8_linear(x, w8, ws.t()), a.device)
                m16, m8 = modelled(dev, k, n, b, False), modelled(dev, k, n, b, True)
                rows.append(
                    {
                        "size": size,
                        "layer": name,
                        "batch": b,
                        "bf16_s": t16,
                        "fp8_s": t8,
                        "model_bf16_s": m16,
                        "model_fp8_s": m8,
                        "gain": t16 / t8,
                        "model_gain": m16 / m8,
                    }
                )
                print(
                    f"{size:<6}{name:<14}{b:>5}{t16 * 1e6:>10.1f}{m16 * 1e6:>9.1f}{t8 * 1e6:>10.1f}{m8 * 1e6:>9.1f}"
                    f"{t16 / t8:>9.2f}x{m16 / m8:>7.2f}x"
                )
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"gpu_model": a.gpu, "device": a.device, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
