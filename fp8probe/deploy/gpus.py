"""GPUs as data: memory, bandwidth and dense tensor-core peaks, each row with its source. No torch.

`capacity` reads the memory (what nvidia-smi reports, MiB); the throughput model (throughput.py) reads the HBM
bandwidth and the dense (not 2:4-sparse) BF16 / FP8 peaks from the vendors' datasheets. A GPU without FP8 tensor
cores (A100) runs FP8 checkpoints in vLLM as weight-only FP8 (Marlin): weights read as 1 byte, math in BF16 —
`fp8_tflops` None says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import FP8ProbeError


@dataclass(frozen=True)
class GPU:
    name: str
    memory_mib: int  # as nvidia-smi reports it
    bandwidth_gbs: float  # HBM / GDDR peak, GB/s (1e9 bytes)
    bf16_tflops: float  # dense BF16 tensor-core peak
    fp8_tflops: float | None  # dense FP8 tensor-core peak; None: no FP8 tensor cores (weight-only FP8 in vLLM)
    nvlink_gbs: float | None  # NVLink, both directions, GB/s; None: PCIe only
    source: str

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbs * 1e9

    def flops_per_s(self, fp8: bool) -> float:
        peak = self.fp8_tflops if fp8 and self.fp8_tflops else self.bf16_tflops
        return peak * 1e12


_TABLE = [
    GPU(
        "H100",
        81559,
        3350,
        989.4,
        1978.9,
        900,
        "NVIDIA H100 Tensor Core GPU datasheet, SXM5 80GB (dense = half the sparsity figures)",
    ),
    GPU("H200", 143771, 4800, 989.4, 1978.9, 900, "NVIDIA H200 Tensor Core GPU datasheet, SXM 141GB"),
    GPU("A100-80GB", 81920, 2039, 312.0, None, 600, "NVIDIA A100 Tensor Core GPU datasheet, SXM4 80GB"),
    GPU("A100-40GB", 40960, 1555, 312.0, None, 600, "NVIDIA A100 Tensor Core GPU datasheet, SXM4 40GB"),
    GPU("L40S", 46068, 864, 362.05, 733.0, None, "NVIDIA L40S datasheet (dense = half the sparsity figures)"),
    GPU(
        "B200",
        183359,
        8000,
        2250.0,
        4500.0,
        1800,
        "NVIDIA HGX B200 datasheet, per GPU (dense = half the sparsity figures)",
    ),
    GPU(
        "RTX4090",
        24564,
        1008,
        165.2,
        330.3,
        None,
        "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 (FP16/FP8 tensor with FP32 accumulate, dense)",
    ),
]
ALIASES = {"H100-80GB": "H100", "A100": "A100-80GB", "RTX-4090": "RTX4090"}
GPU_TABLE: dict[str, GPU] = {g.name: g for g in _TABLE}
GPU_NAMES = [*GPU_TABLE, *ALIASES]


def gpu(name: str) -> GPU:
    """A GPU by name, case and separators ignored ("h100", "A100_80GB"); an unknown name lists the table."""
    key = name.strip().upper().replace(" ", "-").replace("_", "-")
    upper = {k.upper(): k for k in GPU_NAMES}
    found = upper.get(key)
    if found is None:
        raise FP8ProbeError(
            f"unknown GPU {name!r}; presets: {', '.join(sorted(GPU_NAMES))}; or pass `gpu_memory_gib` (capacity only)"
        )
    return GPU_TABLE[ALIASES.get(found, found)]
