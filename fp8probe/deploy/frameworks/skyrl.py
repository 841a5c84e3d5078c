"""SkyRL: vLLM's online FP8 (quantization=fp8) through its inference engines' engine_init_kwargs (OmegaConf command-line
overrides, which SkyRL reads with OmegaConf.from_cli: no Hydra `+`)."""

import json
import shlex

from .base import IS_CLIP, Applied, Target, every_linear, header, hydra, overrides, register, resolves, skipped_layers

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
    kv_skip=True,
)

# SkyRL 0.3.0 sets every engine_init_kwargs key on vLLM's parsed arguments before AsyncEngineArgs.from_cli_args
# (skyrl/backends/skyrl_train/inference_servers/utils.py: build_vllm_cli_args): vLLM's own names, its own types
KEY = "generator.inference_engine.engine_init_kwargs."


@register(SKYRL)
def render(e, model_path, units) -> dict[str, str]:
    lines = []
    if e.fp8:
        lines.append(f"{KEY}quantization=fp8")
    if e.kv:
        lines.append(f"{KEY}kv_cache_dtype={e.kv}")
    if e.kv and e.kv_skip:  # strings: SkyRL sets engine_init_kwargs on vLLM's parsed arguments, whose list is of str
        listed = ",".join(json.dumps(str(i)) for i in e.kv_skip)  # ["0","3"]: YAML strings
        lines.append(shlex.quote(f"{KEY}kv_cache_dtype_skip_layers=[{listed}]"))
    lines += [
        "trainer.algorithm.off_policy_correction.tis_ratio_type=token",
        f"trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high={IS_CLIP}",
    ]
    return {"skyrl.sh": header(e.target) + hydra("python3 -m skyrl.train.entrypoints.main_base", lines)}


@resolves(SKYRL, "skyrl.sh")
def read(files, units, n_blocks) -> Applied:
    """engine_init_kwargs.quantization=fp8: vLLM's online FP8 on every Linear; kv_cache_dtype and its per-layer map
    beside it."""
    o = overrides(files["skyrl.sh"])
    return Applied(
        every_linear(units) if o.get(KEY + "quantization") == "fp8" else set(),
        o.get(KEY + "kv_cache_dtype"),
        skipped_layers(o.get(KEY + "kv_cache_dtype_skip_layers")),
    )
