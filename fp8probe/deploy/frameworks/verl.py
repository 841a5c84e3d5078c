"""verl, with a vLLM or an SGLang rollout (Hydra overrides of `python3 -m verl.trainer.main_ppo`)."""

import shlex

from .base import Target, header, hydra, ignore_keywords, register, verl_correction

VERL = Target("verl", "verl (vLLM rollout)", "all", "FP8_BLOCK", "fp8", "unit", "hydra",
              "verl==0.9.1 verl/workers/rollout/vllm_rollout/vllm_async_server.py (FP8_BLOCK_QUANT_KWARGS)",
              "re-quantizes every Linear of the synced BF16 weights in 128x128 blocks; keeps only MoE routers "
              "(mlp.gate) in BF16; KV scales 1.0")
VERL_SGLANG = Target("verl-sglang", "verl (SGLang rollout)", "free", "FP8_BLOCK", "fp8_e4m3", "unit", "hydra",
                     "verl==0.9.1 verl/utils/sglang/sglang_fp8_utils.py (get_sglang_fp8_ignored_layers)",
                     "128x128 blocks; honours an ignore list (SGLANG_FP8_IGNORED_LAYERS) at start-up and weight sync")
MAIN = "python3 -m verl.trainer.main_ppo"


@register(VERL)
def render_vllm(e, model_path, units) -> dict[str, str]:
    lines = ["actor_rollout_ref.rollout.name=vllm"]
    if e.fp8:
        lines.append("actor_rollout_ref.rollout.quantization=fp8")
    if e.kv:
        lines.append(f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype={e.kv}")
    lines += verl_correction()
    return {"verl.sh": header(e.target) + hydra(MAIN, lines)}


@register(VERL_SGLANG)
def render_sglang(e, model_path, units) -> dict[str, str]:
    lines = ["actor_rollout_ref.rollout.name=sglang"]
    if e.fp8:
        lines.append("actor_rollout_ref.rollout.quantization=fp8")
        ignored = ignore_keywords(e.kept_units, units)
        if ignored:  # a quoted Hydra string: commas would otherwise make a sweep
            lines.append(shlex.quote("+ray_kwargs.ray_init.runtime_env.env_vars.SGLANG_FP8_IGNORED_LAYERS="
                                     f'"{",".join(ignored)}"'))
    if e.kv:
        lines.append(f"+actor_rollout_ref.rollout.engine_kwargs.sglang.kv_cache_dtype={e.kv}")
    lines += verl_correction()
    return {"verl-sglang.sh": header(e.target) + hydra(MAIN, lines)}
