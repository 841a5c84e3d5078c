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
import shutil
from pathlib import Path

import yaml

from ._files import atomic_dir, atomic_write_json, atomic_write_text, check_writable
from .errors import FP8ProbeError, MissingExtra, one_line
from .recipe import Recipe, read_recipe
from .student import check_finite_weights, config_kwargs, list_units, load_config, meta_model, resolve_source

log = logging.getLogger(__name__)


def vllm_args(ckpt: Path, recipe: Recipe, max_model_len: int | None) -> dict:
    args = {"model": str(ckpt.resolve()), "quantization": "compressed-tensors", "dtype": "bfloat16",
            "kv_cache_dtype": "fp8" if recipe.kv_cache_scheme is not None else "auto"}
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

    spec = read_recipe(recipe)
    out = check_writable(out)
    if out.exists() and any(out.iterdir()):
        raise FP8ProbeError(f"{out} exists and is not empty; choose another --out")
    cfg = load_config(model, trust_remote_code, allow_pickle)
    units = list_units(meta_model(cfg))
    spec.check_model(units, str(recipe))
    spec.check_vllm_loadable(units)
    if spec.needs_calibration and rollouts is None:
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
    if spec.needs_calibration:
        from datasets import Dataset

        ids, am = rollouts.input_ids, rollouts.attention_mask
        rows = [{"input_ids": ids[i, : int(am[i].sum())].tolist(),
                 "attention_mask": [1] * int(am[i].sum())} for i in range(ids.shape[0])][:num_calibration_samples]
        oneshot_kwargs = {"dataset": Dataset.from_list(rows), "num_calibration_samples": len(rows),
                          "max_seq_length": int(am.sum(1).max())}
    with atomic_dir(out) as tmp:
        log.info("llm-compressor oneshot: %s, %d ignored names", spec.scheme, len(spec.ignore))
        try:
            oneshot(model=hf, recipe=str(recipe), **oneshot_kwargs)
        except (ValueError, TypeError, KeyError) as e:  # llm-compressor refusing the recipe or the model
            raise FP8ProbeError(f"llm-compressor refused the recipe: {one_line(e)}") from e
        hf.save_pretrained(str(tmp), save_compressed=True)
        tok.save_pretrained(str(tmp))
        shutil.copy(recipe, tmp / "recipe.yaml")
        final = out.resolve()
        args = vllm_args(final, spec, max_model_len)
        atomic_write_json(tmp / "vllm_args.json", args)
        serve = {k.replace("_", "-"): v for k, v in args.items() if k != "model"}
        atomic_write_text(tmp / "vllm.yaml", f"# vllm serve {final} --config {final / 'vllm.yaml'}\n"
                          + yaml.safe_dump(serve, sort_keys=False))
        atomic_write_text(tmp / "rollout_snippets.md", _snippets(args))
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
