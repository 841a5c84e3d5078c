"""Predicted vs realised mismatch, per recipe, with the engine profile: fp8probe against vLLM itself.

    python benchmarks/engine_fidelity.py [--engine vllm-cpu|vllm-cuda] [--num-prompts 40] [--max-new-tokens 64]
                                         [--bootstrap 1000] [--json FILE]

On the embedded student's own rollouts (all 40 built-in prompts, up to 64 tokens: >= 2,000 sampled response
tokens), for the three shipped recipes (recipes/smollm2-135m/kl_q_p-*) and the all-FP8 model (FP8_DYNAMIC,
lm_head BF16) — and with --engine vllm-cuda on a GPU also the all-FP8 model in the static FP8 scheme, the FP8 KV
cache with scale 1.0 on the BF16 model, and all-FP8 with a calibrated FP8 KV cache (static scales calibrated on the
same rollouts: fp8probe's for the simulations, llm-compressor's static_minmax in the checkpoint) — every figure
against the fp32 reference (the trainer), with a 90 % bootstrap interval over sequences:

    sim fp32          fp8probe's sweep simulation: FP8 units inside an fp32 model
    profile           engines.py (vllm-cpu or vllm-cuda): the whole model in bf16, vLLM's FP8 arithmetic
    vLLM              realised: the recipe exported with llm-compressor, loaded by vLLM 0.32 (its CPU backend
                      from the vLLM venv, or this Python's CUDA build), prompt logprobs of the same tokens
    floor             the same with no FP8 unit: transformers-bf16 (profile) and vLLM-bf16 (realised)

Columns: k3 and mean |Δ log p| on the sampled tokens, the full-vocabulary KL(q‖p) where the whole
distribution is known (the simulations), and for every side its lower bound from the top-20 tokens of q
(vLLM's prompt logprobs give 20; mismatch.kl_lower_bound_topk: the rest of the vocabulary pooled, which never
raises a KL), so that vLLM and the profile are compared on the same bound. Then the agreement that matters: the
mean per-token |log q_profile − log q_vLLM|
for each recipe next to the same distance between the two bf16 models with no FP8 at all (two bf16
implementations of one model: the floor below which no profile of transformers' bf16 ops can go).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
TOPK = 20  # vLLM's default max_logprobs


def _boot(values: np.ndarray, seq: np.ndarray, fn, n: int, rng) -> tuple[float, float, float]:
    """fn over tokens, and its 90 % interval resampling whole sequences."""
    groups = [np.flatnonzero(seq == s) for s in np.unique(seq)]
    est = fn(values)
    draws = []
    for _ in range(n):
        pick = rng.integers(0, len(groups), len(groups))
        draws.append(fn(values[np.concatenate([groups[i] for i in pick])]))
    lo, hi = np.quantile(draws, [0.05, 0.95])
    return float(est), float(lo), float(hi)


def _k3(d):  # d = log p - log q per token
    return float(np.mean(np.expm1(-d) + d))


def _absmean(d):
    return float(np.mean(np.abs(d)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--engine",
        default="vllm-cpu",
        choices=["vllm-cpu", "vllm-cuda"],
        help="vllm-cpu: vLLM-CPU from its venv (this machine); vllm-cuda: this Python's vLLM on the GPU, "
        "with the FP8 KV cache configs (benchmarks/gpu_check.sh runs it)",
    )
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--json", help="also write every number here")
    args = ap.parse_args()

    from fp8probe import load_student, make_rollouts
    from fp8probe.core.schemes import KV_CACHE_SCHEMES, KVCacheScheme
    from fp8probe.deploy.export import export
    from fp8probe.deploy.vllm_check import VLLMServe, run_vllm
    from fp8probe.measurement.attention import quantize_kv
    from fp8probe.measurement.engines import engine
    from fp8probe.measurement.mismatch import kl_lower_bound_topk, response_positions, token_stats
    from fp8probe.measurement.quantize import quantize_units
    from fp8probe.measurement.reference import Reference
    from fp8probe.measurement.vllm_profile import engine_model, response_logp
    from fp8probe.model.embedded import embedded_student_dir
    from fp8probe.model.settings import ModelSource
    from fp8probe.recipe.recipe import Recipe, read_recipe

    cuda = args.engine == "vllm-cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("engine_fidelity --engine vllm-cuda: no CUDA GPU here")
    t0 = time.perf_counter()
    student = load_student(device="cuda" if cuda else "cpu", dtype="float32")
    rollouts = make_rollouts(student, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, seed=1)
    ref = Reference(student, rollouts)  # with the static input and K/V scales of the rollouts
    tok = ref.rows.tokens
    logp_ref = ref.rows.logp.gather(-1, tok[:, None]).squeeze(-1).double().cpu().numpy()
    seq = response_positions(rollouts.response_mask)[0].numpy()  # each token's sequence
    seqs = [
        rollouts.input_ids[i, : int(rollouts.attention_mask[i].sum())].tolist() for i in range(rollouts.num_sequences)
    ]
    rng = np.random.default_rng(0)
    print(
        f"{args.engine}: {rollouts.num_sequences} rollouts, {len(tok)} sampled response tokens, {args.bootstrap} "
        "bootstrap resamples over sequences (90 % intervals)"
    )

    def vllm_logp(model_dir, engine_kwargs) -> tuple[np.ndarray, float]:
        kw = {"max_logprobs": TOPK, **engine_kwargs, **({"gpu_memory_utilization": 0.3} if cuda else {})}
        res = run_vllm(model_dir, VLLMServe(8192, engine_kwargs=kw, cuda=cuda), score=seqs, prompt_topk=TOPK)
        out, ids, lps = [], [], []
        for i, lp in enumerate(res["prompt_logprobs"]):
            resp = rollouts.response_mask[i]
            for t in range(1, len(lp)):
                if resp[t]:
                    out.append(lp[t])
                    top = sorted(res["prompt_topk"][i][t].items(), key=lambda kv: -kv[1])[:TOPK]
                    ids.append([int(k) for k, _ in top])
                    lps.append([v for _, v in top])
        bound = kl_lower_bound_topk(torch.tensor(ids), torch.tensor(lps, dtype=torch.float64), ref.rows.logp.cpu())
        return np.asarray(out, dtype=np.float64), float(bound.mean())

    def kl_full(cand_logp: torch.Tensor) -> float:
        return float(token_stats(ref.rows, cand_logp)["kl_q_p"].double().mean())

    def kl_bound(cand_logp: torch.Tensor) -> float:
        top_lp, top_ids = cand_logp.topk(TOPK, dim=-1)
        return float(kl_lower_bound_topk(top_ids.cpu(), top_lp.cpu(), ref.rows.logp.cpu()).mean())

    def sampled(rows):
        return rows.gather(-1, tok[:, None]).squeeze(-1).double().cpu().numpy()

    calibrated, unit = KVCacheScheme(), KVCacheScheme(scale="unit")
    configs = {}
    with tempfile.TemporaryDirectory() as tmp:

        def recipe_file(name, scheme, kv=None):
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(Recipe(model=student.name, scheme=scheme, ignore=["lm_head"], kv_cache_dtype=kv).to_yaml())
            return path

        # name -> (recipe or None for the BF16 student, FP8 KV cache of the simulations, vLLM's engine kwargs)
        plan = {"floor (bf16)": (None, None, {})}
        shipped = sorted((ROOT / "recipes" / "smollm2-135m").glob("kl_q_p-*/recipe.yaml"))
        plan.update({p.parent.name: (p, None, {}) for p in shipped})
        plan["all-fp8"] = (recipe_file("all-fp8", "FP8_DYNAMIC"), None, {})
        if cuda:  # vLLM-CPU here cannot load per-tensor weights nor run the FP8 KV cache (engines.py WHY_NOT)
            plan["all-fp8-static"] = (recipe_file("all-fp8-static", "FP8"), None, {})
            plan["kv (scale 1.0)"] = (None, unit, {"kv_cache_dtype": "fp8"})
            plan["all-fp8 + kv"] = (
                recipe_file("all-fp8-kv", "FP8_DYNAMIC", "fp8"),
                calibrated,
                {"kv_cache_dtype": "fp8"},
            )
        assert KV_CACHE_SCHEMES["fp8"]["observer"] == "static_minmax"  # checkpoint k/v scales = the rollouts' amax
        for name, (path, kv, engine_kwargs) in plan.items():
            spec = read_recipe(path) if path is not None else Recipe(scheme="FP8_DYNAMIC", ignore=[])
            units = [u.name for u in spec.fp8_units(student.units)] if path is not None else []
            c = {"units": len(units)}
            if path is not None or kv is not None:
                with contextlib.ExitStack() as st:
                    st.enter_context(quantize_units(student.model, units, spec.preset, calibration=ref.calibration))
                    if kv is not None:
                        st.enter_context(quantize_kv(student.model, None, kv, calibration=ref.calibration))
                    sim_rows, _ = response_logp(student.model, rollouts)
                c.update(sim=sampled(sim_rows), kl_sim=kl_full(sim_rows), bound_sim=kl_bound(sim_rows))
            with engine_model(
                student, units, spec.preset, engine(args.engine), kv=kv, calibration=ref.calibration
            ) as m:
                lp_rows, _ = response_logp(m, rollouts)
            c.update(profile=sampled(lp_rows), kl_profile=kl_full(lp_rows), bound_profile=kl_bound(lp_rows))
            ckpt = (
                export(
                    ModelSource(), path, Path(tmp) / f"ckpt-{len(configs)}", rollouts=rollouts, max_model_len=8192
                ).out
                if path is not None
                else embedded_student_dir()
            )
            c["vllm"], c["bound_vllm"] = vllm_logp(ckpt, engine_kwargs)
            configs[name] = c
            print(f"  {name}: {len(units)} units measured ({time.perf_counter() - t0:.0f} s)", flush=True)

    def ci(x):
        return f"{x[0]:.3e} [{x[1]:.2e}, {x[2]:.2e}]"

    report = {"tokens": int(len(tok)), "sequences": rollouts.num_sequences, "configs": {}}
    print(
        f"\n{'config':<16}{'side':<18}{'k3 [90 % CI]':<36}{'mean |dlogp| [90 % CI]':<36}"
        f"{'KL(q||p) full':<15}{f'KL >= (top-{TOPK})'}"
    )
    for name, c in configs.items():
        rows = {}
        for side, key in (
            ("sim fp32", "sim"),
            (f"profile {args.engine}", "profile"),
            ("vLLM-CUDA" if cuda else "vLLM-CPU", "vllm"),
        ):
            if key not in c:
                continue
            d = logp_ref - c[key]
            rows[side] = {
                "k3": _boot(d, seq, _k3, args.bootstrap, rng),
                "abs_dlogp_mean": _boot(d, seq, _absmean, args.bootstrap, rng),
                "kl_q_p": c.get(f"kl_{key}"),
                "kl_q_p_lower_bound_top20": c[f"bound_{key}"],
            }
            kl = f"{c[f'kl_{key}']:.3e}" if f"kl_{key}" in c else "-"
            print(
                f"{name:<16}{side:<18}{ci(rows[side]['k3']):<36}{ci(rows[side]['abs_dlogp_mean']):<36}{kl:<15}"
                f"{c[f'bound_{key}']:.3e}"
            )
        gap = _boot(c["profile"] - c["vllm"], seq, _absmean, args.bootstrap, rng)
        rows["profile_vs_vllm_abs_dlogp"] = gap
        report["configs"][name] = {"units": c["units"], **rows}
    floor = report["configs"]["floor (bf16)"]["profile_vs_vllm_abs_dlogp"]
    print("\nmean |log q_profile - log q_vLLM| per token (two implementations of the same arithmetic):")
    for name, r in report["configs"].items():
        g = r["profile_vs_vllm_abs_dlogp"]
        print(f"  {name:<16}{ci(g)}   x{g[0] / floor[0]:.2f} the bf16 floor")
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
