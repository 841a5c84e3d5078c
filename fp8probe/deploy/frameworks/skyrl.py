"""SkyRL: vLLM's online FP8 (quantization=fp8) through its inference engines' engine_init_kwargs (Hydra)."""

from .base import IS_CLIP, Applied, Target, every_linear, header, hydra, overrides, register, resolves

SKYRL = Target(
    "skyrl",
    "SkyRL (vLLM engines)",
    "all",
    "FP8_TENSOR_DYNAMIC",
    "fp8",
    "unit",
    "hydra",
    "skyrl==0.3.0 skyrl/train/config/config.py (InferenceEngineConfig.engine_init_kwargs)",
    "vLLM online FP8 (quantization=fp8): every Linear, per-tensor scales; KV scales 1.0",
    kv_skip="not written yet: what its engine_init_kwargs do with a list is unchecked",
)


@register(SKYRL)
def render(e, model_path, units) -> dict[str, str]:
    lines = []
    if e.fp8:
        lines.append("generator.inference_engine.engine_init_kwargs.quantization=fp8")
    if e.kv:
        lines.append(f"generator.inference_engine.engine_init_kwargs.kv_cache_dtype={e.kv}")
    lines += [
        "trainer.algorithm.off_policy_correction.tis_ratio_type=token",
        f"trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high={IS_CLIP}",
    ]
    return {"skyrl.sh": header(e.target) + hydra("python3 -m skyrl.train.entrypoints.main_base", lines)}


@resolves(SKYRL, "skyrl.sh")
def read(files, units, n_blocks) -> Applied:
    """engine_init_kwargs.quantization=fp8: vLLM's online FP8 on every Linear; kv_cache_dtype beside it."""
    o = overrides(files["skyrl.sh"])
    key = "generator.inference_engine.engine_init_kwargs."
    return Applied(
        every_linear(units) if o.get(key + "quantization") == "fp8" else set(), o.get(key + "kv_cache_dtype")
    )
