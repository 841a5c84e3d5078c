"""vLLM itself: it loads the exported compressed-tensors checkpoint (deploy/export.py writes it and its serving
arguments), so any recipe vLLM can load applies, with the checkpoint's calibrated k/v scales."""

from .base import Target, register

VLLM = Target(
    "vllm",
    "vLLM (compressed-tensors checkpoint)",
    "free",
    None,
    "fp8",
    "calibrated",
    "checkpoint",
    "vllm 0.32 (vllm/model_executor/layers/quantization/compressed_tensors)",
    "loads the exported checkpoint: any recipe vLLM can load, k/v scales from the checkpoint",
    True,  # vllm.yaml's kv-cache-dtype-skip-layers (vllm/config/cache.py: CacheConfig.kv_cache_dtype_skip_layers)
)


@register(VLLM)
def render(e, model_path, units) -> dict[str, str]:
    return {}  # the checkpoint, vllm.yaml and vllm_args.json are export's
