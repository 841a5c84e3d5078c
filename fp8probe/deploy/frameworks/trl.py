"""TRL: `trl vllm-serve` takes an FP8 KV cache only; GRPOConfig carries the importance-sampling correction."""

from .base import IS_CLIP, Applied, Target, cli, flags, header, register, resolves, yaml_text

TRL = Target(
    "trl",
    "TRL (trl vllm-serve)",
    "none",
    None,
    "fp8",
    "unit",
    "cli",
    "trl==1.16.0 trl/scripts/vllm_serve.py (kv_cache_dtype), trl/trainer/grpo_config.py",
    "FP8 KV cache only (vllm-serve has no quantization option; weights synced in BF16)",
    kv_skip="trl vllm-serve reads no per-layer KV option: it would hand one to `vllm serve` unread",
)


@register(TRL)
def render(e, model_path, units) -> dict[str, str]:
    flags = ["--model", model_path] + (["--kv_cache_dtype", e.kv] if e.kv else [])
    grpo = {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_max": IS_CLIP,
    }
    head = header(e.target)
    return {
        "trl.sh": head + cli("trl vllm-serve", flags),
        "trl_grpo_config.yaml": head + "# GRPOConfig fields (TRL's DistillationConfig has no IS-correction "
        "field)\n" + yaml_text(grpo),
    }


@resolves(TRL, "trl.sh")
def read(files, units, n_blocks) -> Applied:
    """trl vllm-serve: BF16 weights; --kv_cache_dtype."""
    return Applied(set(), flags(files["trl.sh"]).get("--kv_cache_dtype"))
