"""NeMo-RL: `policy.generation.vllm_cfg` (YAML), first/last blocks and substring keywords in BF16."""

from .base import IS_CLIP, Target, header, ignore_keywords, register, yaml_text

NEMO_RL = Target("nemo-rl", "NeMo-RL (vLLM generation)", "keywords", "FP8_BLOCK", "fp8", "calibrated", "yaml",
                 "NVIDIA-NeMo/RL@00fa128513dc nemo_rl/models/generation/vllm/quantization/fp8.py (init_fp8)",
                 "128x128 blocks; first/last blocks and substring keywords in BF16; calibrates K/V scales itself")


@register(NEMO_RL)
def render(e, model_path, units) -> dict[str, str]:
    vllm_cfg = {"precision": "fp8" if e.fp8 else "bfloat16", "kv_cache_dtype": e.kv or "auto"}
    if e.fp8:
        vllm_cfg.update(num_first_layers_in_bf16=e.first, num_last_layers_in_bf16=e.last)
    if e.keywords:
        vllm_cfg["quantization_ignored_layer_kws"] = ignore_keywords(e.keywords, units, set(e.kept_units))
    doc = {"policy": {"generation": {"vllm_cfg": vllm_cfg}},
           "loss_fn": {"use_importance_sampling_correction": True, "truncated_importance_sampling_type": "tis",
                       "truncated_importance_sampling_ratio": IS_CLIP}}
    return {"nemo-rl.yaml": header(e.target) + yaml_text(doc)}
