"""Predicted (fp8probe) vs realised (vLLM, CPU backend) mismatch of a mixed FP8 recipe on the embedded student.

Exports the recipe with llm-compressor, runs vLLM on the BF16 and the FP8 checkpoints from its own venv,
reads prompt logprobs of the saved rollouts, and prints, on the sampled response tokens, against the
transformers-fp32 reference:
  predicted            fp8probe's simulation (weights + dynamic per-token activations)
  predicted (W only)   the same with FP8 weights only
  realised FP8         vLLM with the exported checkpoint
  noise floor BF16     vLLM with the BF16 checkpoint (bf16 compute vs the fp32 reference)
and vLLM's own "KV cache size" lines next to fp8probe's capacity numbers.

usage: python benchmarks/vllm_mismatch.py [--recipe recipe.yaml] [--num-prompts 8] [--max-new-tokens 32]
(default recipe: FP8_DYNAMIC, blocks 0 and 29 and block 1's down_proj kept BF16)
"""

import argparse
import json
import tempfile
from pathlib import Path

import yaml

from fp8probe import load_student, make_rollouts
from fp8probe.deploy.capacity import capacity
from fp8probe.deploy.export import export
from fp8probe.deploy.vllm_check import compare_with_vllm
from fp8probe.model.embedded import embedded_student_dir
from fp8probe.model.settings import ModelSource
from fp8probe.recipe.recipe import read_recipe


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    student = load_student()
    with tempfile.TemporaryDirectory() as tmp:
        recipe = args.recipe
        if recipe is None:
            ignore = ["lm_head", "model.layers.1.mlp.down_proj"]
            ignore += [u.name for u in student.quantizable if u.block in (0, 29)]
            recipe = Path(tmp) / "recipe.yaml"
            recipe.write_text(
                yaml.safe_dump(
                    {
                        "default_stage": {
                            "default_modifiers": {
                                "QuantizationModifier": {
                                    "targets": ["Linear"],
                                    "scheme": "FP8_DYNAMIC",
                                    "ignore": ignore,
                                }
                            }
                        }
                    }
                )
            )
        spec = read_recipe(recipe)
        ckpt = export(ModelSource(), recipe, Path(tmp) / "ckpt", max_model_len=8192).out
        units = [u.name for u in spec.fp8_units(student.units)]
        rollouts = make_rollouts(student, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, seed=1)
        res = compare_with_vllm(student, rollouts, ckpt, embedded_student_dir(), units, spec.scheme)
    cap = capacity(None, kv_cache_dtype="auto", kv_cache_memory=1 << 30, block_size=128, max_model_len=8192)
    print(f"{len(units)} units in {spec.scheme}; {res['num_tokens']} sampled response tokens")
    print(f"{'':<22}{'k3':>12}{'|dlogp| mean':>14}{'|dlogp| max':>13}{'tok_mult_err':>14}")
    for name, key in (
        ("predicted", "predicted"),
        ("predicted (W only)", "predicted_weights_only"),
        ("realised FP8 (vLLM)", "realised_fp8"),
        ("noise floor BF16", "noise_floor_bf16"),
    ):
        m = res[key]
        print(
            f"{name:<22}{m['k3']:>12.3e}{m['abs_dlogp_mean']:>14.4f}{m['abs_dlogp_max']:>13.4f}"
            f"{m['token_mult_prob_error']:>14.5f}"
        )
    for side in ("bf16", "fp8"):
        v = res["vllm"][side]
        print(
            f"vLLM {side}: KV cache size {v['kv_cache_tokens']:,} tokens (fp8probe: "
            f"{cap['baseline']['kv_tokens']:,}), concurrency {v['max_concurrency']}x "
            f"(fp8probe: {cap['baseline']['max_concurrency']:.4f}x); answer: {v['answer']!r}"
        )
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
