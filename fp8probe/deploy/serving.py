"""How vLLM is started, as data: GPU presets and the knobs of its KV-cache sizing (vLLM's own argument names).

capacity.py does the accounting with them; the CLI takes its choices from here. No torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.schemes import KV_DTYPES
from ..core.settings import Settings, opt
from ..core.units import GiB
from .gpus import GPU_NAMES, gpu

# total device memory as nvidia-smi reports it (MiB), from the one GPU table (gpus.py)
GPUS = {name: gpu(name).memory_mib for name in GPU_NAMES}

# vLLM's --kv-cache-dtype -> bytes per K or V element (None: the model's own dtype), and the inline scale bytes of the
# per-token-head dtypes: views of core/schemes.py's KV_DTYPES
KV_DTYPE_BYTES = {n: d.element_bytes for n, d in KV_DTYPES.items()}
KV_SCALE_BYTES = {n: d.scale_bytes for n, d in KV_DTYPES.items() if d.scale_bytes}
NON_TORCH_BYTES = GiB // 2


@dataclass(frozen=True)
class Serving(Settings):
    """How vLLM is started: the knobs of its KV-cache sizing (vLLM's own argument names), validated here."""

    gpu: str | None = opt("H100", f"GPU preset: {', '.join(GPUS)}", group="gpu")
    gpu_memory_gib: float | None = opt(
        None, "GPU memory in GiB (instead of --gpu)", low=0.0, open_low=True, group="gpu", flag="--gpu-memory"
    )
    gpu_memory_utilization: float = opt(0.9, "share of the GPU's memory vLLM may use", low=0.0, open_low=True, high=1.0)
    kv_cache_memory: int | None = opt(
        None, "KV-cache bytes per GPU, as vLLM's --kv-cache-memory (skips the memory estimate)", low=1
    )
    max_model_len: int | None = opt(None, "default: the config's max_position_embeddings", low=1)
    tensor_parallel_size: int = opt(1, "GPUs the model is split over", low=1)
    block_size: int = opt(16, "16 on GPUs, 128 on vLLM's CPU backend", low=1)
    reserve_gib: float | None = opt(None, "activation + non-torch memory to set aside (default: estimate)", low=0.0)
    max_num_batched_tokens: int = opt(8192, "vLLM's --max-num-batched-tokens", low=1)
    max_num_seqs: int = opt(256, "vLLM's --max-num-seqs", low=1)
    hybrid: bool = opt(
        True,
        "allocate sliding-window layers as full attention, as vLLM does with this flag",
        flag="--disable-hybrid-kv-cache-manager",
    )
    max_in_flight_tokens: int | None = None  # default: max_num_batched_tokens

    def __post_init__(self):
        super().__post_init__()
        if self.kv_cache_memory is None and self.gpu_memory_gib is None:
            gpu_bytes(self.gpu or "H100")  # an unknown preset fails here, before any work

    @property
    def reserve_bytes(self) -> int | None:
        """Activations + non-torch memory to set aside; None: capacity.reserve_estimate."""
        return None if self.reserve_gib is None else int(self.reserve_gib * GiB)

    @property
    def total_bytes(self) -> float:
        return self.gpu_memory_gib * GiB if self.gpu_memory_gib is not None else gpu_bytes(self.gpu or "H100")


def gpu_bytes(name: str) -> int:
    return gpu(name).memory_mib * (1 << 20)


@dataclass(frozen=True)
class CapacitySettings(Settings):
    """The candidate beside BF16 with an auto KV cache: a `recipe`'s FP8 units (else every unit in `scheme`) and the
    KV cache in `kv_cache_dtype`."""

    recipe: str | None = opt(None, "recipe.yaml written by `fp8probe recipe` (default: every unit in the scheme)")
    scheme: str = opt("FP8_DYNAMIC", "whole-model scheme when no recipe")
    kv_cache_dtype: str = opt(
        "fp8", "the candidate's KV-cache dtype (the baseline is always auto)", choices=KV_DTYPE_BYTES
    )
