"""verl, with a vLLM or an SGLang rollout (Hydra overrides of `python3 -m verl.trainer.main_ppo`)."""

import re
import shlex

from .base import (
    Applied,
    Target,
    every_linear,
    header,
    hydra,
    ignore_keywords,
    overrides,
    register,
    resolves,
    verl_correction,
)

VERL = Target(
    "verl",
    "verl (vLLM rollout)",
    "all",
    "FP8_BLOCK",
    "fp8",
    "unit",
    "hydra",
    "verl==0.9.1 verl/workers/rollout/vllm_rollout/vllm_async_server.py (FP8_BLOCK_QUANT_KWARGS)",
    "re-quantizes every Linear of the synced BF16 weights in 128x128 blocks; keeps only MoE routers "
    "(mlp.gate) in BF16; KV scales 1.0",
)
VERL_SGLANG = Target(
    "verl-sglang",
    "verl (SGLang rollout)",
    "free",
    "FP8_BLOCK",
    "fp8_e4m3",
    "unit",
    "hydra",
    "verl==0.9.1 verl/utils/sglang/sglang_fp8_utils.py (get_sglang_fp8_ignored_layers)",
    "128x128 blocks; honours an ignore list (SGLANG_FP8_IGNORED_LAYERS) at start-up and weight sync",
)
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
            lines.append(
                shlex.quote(
                    f'+ray_kwargs.ray_init.runtime_env.env_vars.SGLANG_FP8_IGNORED_LAYERS="{",".join(ignored)}"'
                )
            )
    if e.kv:
        lines.append(f"+actor_rollout_ref.rollout.engine_kwargs.sglang.kv_cache_dtype={e.kv}")
    lines += verl_correction()
    return {"verl-sglang.sh": header(e.target) + hydra(MAIN, lines)}


@resolves(VERL, "verl.sh")
def read_vllm(files, units, n_blocks) -> Applied:
    """verl's vLLM rollout: quantization=fp8 re-quantizes every Linear; kv_cache_dtype through engine_kwargs."""
    o = overrides(files["verl.sh"])
    return Applied(
        every_linear(units) if o.get("actor_rollout_ref.rollout.quantization") == "fp8" else set(),
        o.get("actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype"),
    )


def _matches_ignored(name: str, entry: str) -> bool:
    """verl 0.9.1's _matches_ignored_layer (verl/utils/sglang/sglang_fp8_utils.py) on a module name: "re:" from the
    start, else a dot-bounded, case-insensitive part of the name."""
    entry = entry.strip()
    if not entry:
        return False
    if entry.startswith("re:"):
        return any(re.match(entry[3:], c) for c in (name + ".weight", name))
    entry = entry.lower().strip(".")
    return any(
        c == entry or c.startswith(entry + ".") or c.endswith("." + entry) or f".{entry}." in f".{c}."
        for c in (name.lower() + ".weight", name.lower())
    )


@resolves(VERL_SGLANG, "verl-sglang.sh")
def read_sglang(files, units, n_blocks) -> Applied:
    """verl's SGLang rollout: every Linear in FP8 but those SGLANG_FP8_IGNORED_LAYERS names (comma-separated)."""
    o = overrides(files["verl-sglang.sh"])
    if o.get("actor_rollout_ref.rollout.quantization") != "fp8":
        return Applied(set(), o.get("actor_rollout_ref.rollout.engine_kwargs.sglang.kv_cache_dtype"))
    env = next((v for k, v in o.items() if k.endswith("SGLANG_FP8_IGNORED_LAYERS")), "")
    ignored = [x for x in env.strip('"').split(",") if x]
    return Applied(
        {n for n in every_linear(units) if not any(_matches_ignored(n, x) for x in ignored)},
        o.get("actor_rollout_ref.rollout.engine_kwargs.sglang.kv_cache_dtype"),
    )
