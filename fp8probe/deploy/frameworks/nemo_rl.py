"""NeMo-RL: `policy.generation.vllm_cfg` (YAML), first/last blocks and substring keywords in BF16."""

from .base import IS_CLIP, Applied, Target, every_linear, header, ignore_keywords, register, resolves, yaml_text

NEMO_RL = Target(
    "nemo-rl",
    "NeMo-RL (vLLM generation)",
    "keywords",
    "FP8_BLOCK",
    "fp8",
    "calibrated",
    "yaml",
    "NVIDIA-NeMo/RL@00fa128513dc nemo_rl/models/generation/vllm/quantization/fp8.py (init_fp8)",
    "128x128 blocks; first/last blocks and substring keywords in BF16; calibrates K/V scales itself",
    kv_skip="its vllm_cfg, as read at the pinned commit, names kv_cache_dtype only, and no released NeMo-RL can "
    "check another vLLM key",
)


@register(NEMO_RL)
def render(e, model_path, units) -> dict[str, str]:
    vllm_cfg = {"precision": "fp8" if e.fp8 else "bfloat16", "kv_cache_dtype": e.kv or "auto"}
    if e.fp8:
        vllm_cfg.update(num_first_layers_in_bf16=e.first, num_last_layers_in_bf16=e.last)
    if e.keywords:
        vllm_cfg["quantization_ignored_layer_kws"] = ignore_keywords(e.keywords, units, set(e.kept_units))
    doc = {
        "policy": {"generation": {"vllm_cfg": vllm_cfg}},
        "loss_fn": {
            "use_importance_sampling_correction": True,
            "truncated_importance_sampling_type": "tis",
            "truncated_importance_sampling_ratio": IS_CLIP,
        },
    }
    return {"nemo-rl.yaml": header(e.target) + yaml_text(doc)}


@resolves(NEMO_RL, "nemo-rl.yaml")
def read(files, units, n_blocks) -> Applied:
    """init_fp8: precision fp8 puts every Linear in FP8 but the first/last blocks and the modules a keyword of
    quantization_ignored_layer_kws is a substring of."""
    import yaml

    cfg = (yaml.safe_load(files["nemo-rl.yaml"]) or {}).get("policy", {}).get("generation", {}).get("vllm_cfg", {})
    kv = cfg.get("kv_cache_dtype")
    kv = None if kv in (None, "auto") else kv
    if cfg.get("precision") != "fp8":
        return Applied(set(), kv)
    first, last = int(cfg.get("num_first_layers_in_bf16", 0)), int(cfg.get("num_last_layers_in_bf16", 0))
    kws = cfg.get("quantization_ignored_layer_kws") or []
    block = {u.name: u.block for u in units}
    return Applied(
        {n for n in every_linear(units) if first <= block[n] < n_blocks - last and not any(k in n for k in kws)}, kv
    )
