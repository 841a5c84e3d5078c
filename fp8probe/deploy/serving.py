"""How vLLM is started, as data: GPU presets and the knobs of its KV-cache sizing (vLLM's own argument names).

capacity.py does the accounting with them; the CLI takes its choices from here. No torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import FP8ProbeError

GiB = 1 << 30

# total device memory as nvidia-smi reports it (MiB)
GPUS = {
    "H100": 81559, "H100-80GB": 81559,
    "H200": 143771,
    "A100-40GB": 40960,
    "A100-80GB": 81920, "A100": 81920,
    "L40S": 46068,
    "B200": 183359,
    "RTX4090": 24564, "RTX-4090": 24564,
}

VLLM_VERSION = "0.32.0"  # the vLLM whose KV-cache accounting capacity.py mirrors
# vLLM's --kv-cache-dtype -> bytes per K or V element (None: the model's own dtype); vllm/utils/torch_utils.py
KV_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
                  "fp8_per_token_head": 1, "int8_per_token_head": 1, "int4_per_token_head": 0.5}
# per-token-head dtypes also store one fp32 scale per token, KV head and side (K, V) inline with the data
# (TritonAttentionBackend.customize_spec in vllm/v1/attention/backends/triton_attn.py)
KV_SCALE_BYTES = {"fp8_per_token_head": 4, "int8_per_token_head": 4, "int4_per_token_head": 4}
NON_TORCH_BYTES = GiB // 2


@dataclass(frozen=True)
class Serving:
    """How vLLM is started: the knobs of its KV-cache sizing (vLLM's own argument names), validated here."""

    gpu: str | None = "H100"  # a GPUS preset, unless gpu_memory_gib or kv_cache_memory is given
    gpu_memory_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None  # bytes per GPU, as --kv-cache-memory (skips the memory estimate)
    max_model_len: int | None = None  # default: the config's max_position_embeddings
    tensor_parallel_size: int = 1
    block_size: int = 16  # 16 on GPUs, 128 on vLLM's CPU backend
    reserve_bytes: int | None = None  # activations + non-torch memory; default: reserve_estimate
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    hybrid: bool = True  # False: --disable-hybrid-kv-cache-manager
    max_in_flight_tokens: int | None = None  # default: max_num_batched_tokens

    def __post_init__(self):
        if self.tensor_parallel_size < 1:
            raise FP8ProbeError("--tensor-parallel-size must be at least 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise FP8ProbeError("--gpu-memory-utilization must be in (0, 1]")
        for name in ("kv_cache_memory", "max_model_len", "block_size", "max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise FP8ProbeError(f"--{name.replace('_', '-')} must be at least 1, got {v}")
        if self.gpu_memory_gib is not None and not self.gpu_memory_gib > 0:
            raise FP8ProbeError(f"--gpu-memory must be a positive number of GiB, got {self.gpu_memory_gib}")
        if self.kv_cache_memory is None and self.gpu_memory_gib is None:
            gpu_bytes(self.gpu or "H100")  # an unknown preset fails here, before any work

    @property
    def total_bytes(self) -> float:
        return self.gpu_memory_gib * GiB if self.gpu_memory_gib is not None else gpu_bytes(self.gpu or "H100")


def gpu_bytes(name: str) -> int:
    key = name.strip().upper().replace(" ", "-").replace("_", "-")
    key = {k.upper(): k for k in GPUS}.get(key)
    if key is None:
        raise FP8ProbeError(f"unknown GPU {name!r}; presets: {', '.join(sorted(set(GPUS)))}; or pass --gpu-memory GiB")
    return GPUS[key] * (1 << 20)
