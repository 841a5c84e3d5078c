"""OpenRLHF: BF16 rollouts only; fp8probe writes its importance-sampling correction flags."""

from .base import IS_CLIP, Applied, Target, cli, header, register, resolves

OPENRLHF = Target(
    "openrlhf",
    "OpenRLHF (vLLM engines)",
    "none",
    None,
    None,
    "unit",
    "cli",
    "openrlhf==0.11.2 openrlhf/trainer/ray/vllm_engine.py (create_vllm_engines: dtype='bfloat16')",
    "BF16 only: no quantization or kv_cache_dtype reaches its vLLM engines",
)


@register(OPENRLHF)
def render(e, model_path, units) -> dict[str, str]:
    flags = [
        "--actor.model_name_or_path",
        model_path,
        "--algo.advantage.is_correction_level",
        "token",
        "--algo.advantage.is_correction_mode",
        "clip",
        "--algo.advantage.is_correction_threshold",
        str(IS_CLIP),
    ]
    return {"openrlhf.sh": header(e.target) + cli("python3 -m openrlhf.cli.train_ppo_ray", flags)}


@resolves(OPENRLHF, "openrlhf.sh")
def read(files, units, n_blocks) -> Applied:
    """BF16 rollouts whatever the flags say: no quantization reaches its vLLM engines."""
    return Applied(set(), None)
