"""Run NVIDIA ModelOpt's auto_quantize on a student; runs inside ModelOpt's own venv (see vs_modelopt.py).

    python modelopt_worker.py MODEL_DIR TOKENS.pt METHOD EFFECTIVE_BITS OUT.json [NUM_PATH_NODES] [CHECKPOINT]

TOKENS.pt holds the rollouts (input_ids, attention_mask, response_mask) as fp8probe sampled them. Candidates:
FP8_DEFAULT_CFG (per-tensor FP8 weights and inputs, max-calibrated) or no quantization, lm_head disabled, at
EFFECTIVE_BITS. METHOD: gradient, kl_div, or aumann_shapley (the saturation-aware mode of Model-Optimizer PR
#2183, in a venv built from that source; label-free like kl_div; its default method_options, or NUM_PATH_NODES).

Every mode scores exactly the rows fp8probe's judge scores: the positions that predict a response token (no
prompt, no padding). `forward_step` hands ModelOpt those rows' logits only ([rows, vocab]: kl_div's and
aumann_shapley's KL is a sum over whatever rows forward_step returns, unmasked), and the gradient method's loss is
the cross-entropy of the sampled response tokens on the same rows. Writes the modules it put in FP8, its time, the
ModelOpt version, every group's scores and costs per format, and (aumann_shapley) its damage model's report.
"""

import json
import os
import sys
import time

import torch


def judge_rows(logits, batch):
    """The logits of the positions that predict a response token, as fp8probe's judge scores them: position t
    predicts token t + 1, so the rows are the positions t whose next token is in the response."""
    mask = batch["response_mask"][:, 1:].bool()
    return logits[:, :-1][mask]


def forward_step(m, batch):
    return judge_rows(m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch)


def loss_func(rows, batch):
    """The gradient method's loss: the cross-entropy of the sampled response tokens, on the judge's rows."""
    return torch.nn.functional.cross_entropy(
        rows.float(), batch["input_ids"][:, 1:][batch["response_mask"][:, 1:].bool()]
    )


def main():
    import modelopt
    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    model_dir, tokens, method, bits, out = sys.argv[1:6]
    nodes = int(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6] != "-" else None
    checkpoint = sys.argv[7] if len(sys.argv) > 7 else None
    restored = _has_scores(checkpoint)
    torch.manual_seed(0)
    data = torch.load(tokens)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    n, bs = data["input_ids"].shape[0], 8
    batches = [
        {k: data[k][i : i + bs] for k in ("input_ids", "attention_mask", "response_mask")} for i in range(0, n, bs)
    ]

    kw = {"loss_func": loss_func} if method == "gradient" else {}
    if nodes is not None:  # the saturation-aware mode's path nodes (its default: 2)
        kw["method_options"] = {"num_path_nodes": nodes}
    if checkpoint is not None:
        kw["checkpoint"] = checkpoint
    t = time.perf_counter()
    model, state = mtq.auto_quantize(
        model,
        constraints={"effective_bits": float(bits)},
        quantization_formats=[mtq.FP8_DEFAULT_CFG],
        data_loader=batches,
        forward_step=forward_step,
        disabled_layers=["*lm_head*"],
        num_calib_steps=len(batches),
        num_score_steps=len(batches),
        method=method,
        **kw,
    )
    seconds = time.perf_counter() - t
    fp8 = sorted(
        name
        for name, mod in model.named_modules()
        if hasattr(mod, "weight_quantizer") and getattr(mod.weight_quantizer, "is_enabled", False)
    )
    res = {
        "method": method,
        "num_path_nodes": nodes,
        "modelopt_version": modelopt.__version__,
        "effective_bits": float(bits),
        "fp8_modules": fp8,
        "seconds": seconds,
        "restored": restored,
        "scores": _scores(state),
    }
    damage = state.get("damage_model") if isinstance(state, dict) else None
    if damage:  # the saturation-aware mode's own prediction for its recipe
        res["damage_model"] = {k: damage[k] for k in ("valid", "completeness", "approximation_flags") if k in damage}
        res["predicted_damage"] = state.get("best", {}).get("predicted_damage", damage.get("predicted_damage"))
    with open(out, "w") as f:
        json.dump(res, f, default=str)


def _has_scores(checkpoint: str | None) -> bool:
    """Whether ModelOpt's checkpoint holds a finished scoring (it also saves one after calibration alone)."""
    if checkpoint is None or not os.path.exists(checkpoint):
        return False
    return bool(torch.load(checkpoint, weights_only=False).get("candidate_stats"))


def _number(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def _scores(state) -> dict:
    """Every searched group's score and cost per candidate format, as the search saw them."""
    stats = state.get("candidate_stats", {}) if isinstance(state, dict) else {}
    return {
        name: {
            k: [str(f) if k == "formats" else _number(f) for f in st[k]]
            for k in ("formats", "scores", "costs")
            if k in st
        }
        for name, st in stats.items()
    }


if __name__ == "__main__":
    main()
