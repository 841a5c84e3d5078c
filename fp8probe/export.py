"""Apply a recipe with llm-compressor and write a compressed-tensors checkpoint vLLM loads, plus its configs.

    fp8probe export MODEL --recipe recipe.yaml --out CKPT [--rollouts DIR] [--max-model-len L]

Before anything is written, the recipe is checked for what vLLM would refuse: a fused group (q/k/v,
gate/up) split across precisions, experts of one layer with different schemes, and layer shapes the
scheme cannot take (FP8_BLOCK: inputs in whole groups of 128, merged outputs in whole blocks). Then
llm-compressor's `oneshot` quantizes a BF16 copy of the model (calibrating on the saved rollouts when
the scheme has static input scales or the recipe has a kv_cache_scheme), and the checkpoint is saved
compressed. Beside it:

    CKPT/vllm.yaml         arguments for `vllm serve --config CKPT/vllm.yaml`
    CKPT/vllm_args.json    the same as keyword arguments for vllm.LLM(**args)
    CKPT/rollout_snippets.md  where the recipe and the KV-cache dtype go in verl, OpenRLHF and slime
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from .errors import FP8ProbeError, MissingExtra
from .recipe import RecipeSpec, read_recipe_yaml

log = logging.getLogger(__name__)


def check_vllm_loadable(model, spec: RecipeSpec) -> None:
    """Refuse, naming the units, what vLLM cannot load: split fused groups, mixed experts, bad shapes."""
    from .student import input_dim, list_units

    units = [u for u in list_units(model) if u.quantizable]
    fp8 = {u.name for u in spec.quantized_units(model)}
    groups: dict[str, list] = {}
    for u in units:
        groups.setdefault(u.group, []).append(u)
    for g, us in groups.items():
        states = {u.name in fp8 for u in us}
        if len(states) > 1:
            q = [u.name for u in us if u.name in fp8]
            b = [u.name for u in us if u.name not in fp8]
            raise FP8ProbeError(f"the recipe splits vLLM's fused {g.rsplit('.', 1)[-1]} of block {us[0].block}: "
                                f"FP8 {', '.join(q)} but BF16 {', '.join(b)}; keep the whole group in one precision")
    for u in units:
        if u.kind != "expert":
            continue
        mod = model.get_submodule(u.name)
        n = mod.gate_up_proj.shape[0]
        states = {spec.is_ignored(f"{u.name}.{e}.{p}") for e in range(n) for p in ("gate_proj", "up_proj", "down_proj")}
        if len(states) > 1:
            raise FP8ProbeError(f"the recipe gives the experts of {u.name} different precisions; vLLM runs all "
                                "experts of a layer with one scheme")
    spec.scheme.check_input_dims({u.name: input_dim(u) for u in units if u.name in fp8})
    if spec.scheme.weight.strategy == "block":
        bn, bk = spec.scheme.weight.block
        bad = []
        for g, us in groups.items():
            if us[0].name not in fp8:
                continue
            for i, u in enumerate(us):
                out_dim = u.shape[-2]
                if len(us) > 1 and i < len(us) - 1 and out_dim % bn:
                    bad.append(f"{u.name} (output dim {out_dim} inside the fused {g.rsplit('.', 1)[-1]})")
        if bad:
            raise FP8ProbeError(f"{spec.scheme.name} needs dims in whole blocks of {bk}: {', '.join(bad[:4])}"
                                f"{' ...' if len(bad) > 4 else ''}; keep these in BF16 or use FP8_DYNAMIC")


def needs_calibration(spec: RecipeSpec) -> bool:
    return spec.scheme.static_input or spec.kv_cache is not None


def vllm_args(ckpt: Path, spec: RecipeSpec, max_model_len: int | None) -> dict:
    args = {"model": str(ckpt.resolve()), "quantization": "compressed-tensors", "dtype": "bfloat16",
            "kv_cache_dtype": "fp8" if spec.kv_cache else "auto"}
    if max_model_len:
        args["max_model_len"] = int(max_model_len)
    return args


def _snippets(args: dict) -> str:
    kv, path, q = args["kv_cache_dtype"], args["model"], args["quantization"]
    return f"""# Using this recipe in RL / on-policy-distillation rollouts

The authoritative settings are vllm_args.json (vllm.LLM(**args)) and vllm.yaml (vllm serve --config):
quantization={q}, kv_cache_dtype={kv}, model {path}.

In RL the rollout engine receives the trainer's BF16 weights after every step, so frameworks quantize
synced weights on the fly rather than loading this checkpoint once. What carries over is the recipe:
the scheme, and the `ignore` list in recipe.yaml (the units that must stay BF16).

## verl (vLLM rollout)
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.quantization=True            # verl's on-the-fly FP8 rollout
    actor_rollout_ref.rollout.use_block_quant_rollout=True # only for the FP8_BLOCK scheme
    +actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype={kv}
  verl's FP8 rollout quantizes every Linear; keeping the recipe's ignore list in BF16 needs a patch
  where it quantizes synced weights.

## OpenRLHF (vLLM engines)
    --pretrain {path}
  and pass kv_cache_dtype="{kv}", quantization="{q}" to the vLLM engines it creates
  (openrlhf/trainer/ray/vllm_engine.py, create_vllm_engines).

## slime
    --hf-checkpoint {path}
  with the rollout engine's KV-cache dtype set to {kv}.
"""


def export(model: str | None, recipe: str | Path, out: str | Path, rollouts=None, max_model_len: int | None = None,
           num_calibration_samples: int = 64, trust_remote_code: bool = False, allow_pickle: bool = False) -> Path:
    """Quantize `model` with the recipe via llm-compressor and save a compressed checkpoint to `out`."""
    try:
        from llmcompressor import oneshot
    except ImportError as e:
        raise MissingExtra("fp8probe export (llm-compressor)", "export") from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ._files import atomic_write_json, atomic_write_text, check_writable
    from .capacity import meta_model
    from .student import check_finite_weights, config_kwargs, load_config, resolve_source

    spec = read_recipe_yaml(recipe)
    out = check_writable(out)
    if out.exists() and any(out.iterdir()):
        raise FP8ProbeError(f"{out} exists and is not empty; choose another --out")
    cfg = load_config(model, trust_remote_code, allow_pickle)
    meta = meta_model(cfg)
    spec.check_model(meta, str(recipe))
    check_vllm_loadable(meta, spec)
    if needs_calibration(spec) and rollouts is None:
        raise FP8ProbeError("this recipe needs calibration data (static input scales or a kv_cache_scheme): "
                            "pass --rollouts DIR (a sweep directory holds them)")
    if rollouts is not None:
        rollouts.check_fits(cfg, "the calibration rollouts")
    src, kwargs = resolve_source(model, allow_pickle)
    if "gguf_file" in kwargs:
        raise FP8ProbeError("llm-compressor refuses GGUF-quantized models; convert to safetensors first "
                            "(the embedded student is converted automatically)")
    log.info("loading %s in bfloat16 for llm-compressor", model or "the embedded student")
    tok = AutoTokenizer.from_pretrained(src, trust_remote_code=trust_remote_code, **config_kwargs(kwargs))
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, trust_remote_code=trust_remote_code, **kwargs)
    check_finite_weights(hf, str(model or src))
    oneshot_kwargs = {}
    if needs_calibration(spec):
        from datasets import Dataset

        ids, am = rollouts.input_ids, rollouts.attention_mask
        rows = [{"input_ids": ids[i, : int(am[i].sum())].tolist(),
                 "attention_mask": [1] * int(am[i].sum())} for i in range(ids.shape[0])][:num_calibration_samples]
        oneshot_kwargs = {"dataset": Dataset.from_list(rows), "num_calibration_samples": len(rows),
                          "max_seq_length": int(am.sum(1).max())}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        log.info("llm-compressor oneshot: %s, %d ignored names", spec.scheme.name, len(spec.ignore))
        try:
            oneshot(model=hf, recipe=str(recipe), **oneshot_kwargs)
        except (ValueError, TypeError, KeyError) as e:  # llm-compressor refusing the recipe or the model
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise FP8ProbeError(f"llm-compressor refused the recipe: {msg[:300]}") from e
        hf.save_pretrained(str(tmp), save_compressed=True)
        tok.save_pretrained(str(tmp))
        shutil.copy(recipe, tmp / "recipe.yaml")
        final = out.resolve()
        args = vllm_args(final, spec, max_model_len)
        atomic_write_json(tmp / "vllm_args.json", args)
        import yaml

        serve = {k.replace("_", "-"): v for k, v in args.items() if k != "model"}
        atomic_write_text(tmp / "vllm.yaml", f"# vllm serve {final} --config {final / 'vllm.yaml'}\n"
                          + yaml.safe_dump(serve, sort_keys=False))
        atomic_write_text(tmp / "rollout_snippets.md", _snippets(args))
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_checkpoint_fp8(ckpt: str | Path) -> dict:
    """name -> (fp8 weight, weight_scale) of every FP8 Linear in a compressed-tensors checkpoint."""
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(ckpt).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            keys = set(st.keys())
            for k in keys:
                if k.endswith(".weight_scale"):
                    base = k[: -len(".weight_scale")]
                    if f"{base}.weight" in keys:
                        out[base] = (st.get_tensor(f"{base}.weight"), st.get_tensor(k))
    return out
