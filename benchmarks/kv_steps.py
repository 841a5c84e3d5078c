"""What each step of the FP8 KV cache on CUDA costs: FlashAttention 3 (vLLM 0.32 on Hopper) against the simulation.

    python benchmarks/kv_steps.py [--rollouts DIR] [--num-prompts 16] [--max-new-tokens 48]

On the embedded student's own rollouts (the quick start's by default), every layer's KV cache in FP8 with
calibrated k/v scales, kl_q_p against the fp32 reference:

    sim                       fp8probe's simulation: K and V rounded to e4m3, in the fp32 model
    vllm-cuda alone           the engine profile with no FP8 anywhere (its bf16 arithmetic)
    vllm-cuda, K/V only       the profile's FP8 KV cache with the query and the probabilities left unrounded
    + FP8 probabilities       P = exp2(S - (max - 8)) rounded to e4m3 for the P.V product
    + FP8 query               the query rounded to e4m3 with q_scale = k_scale (vLLM without a checkpoint q_scale)
    vllm-cuda                 both: what engines.py predicts vLLM computes
"""

from __future__ import annotations

import argparse
import functools
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", help="a directory with saved rollouts (default: sample the quick start's)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()

    import fp8probe.measurement.vllm_profile as engines
    from fp8probe import load_student, make_rollouts
    from fp8probe.measurement.bench import Bench
    from fp8probe.measurement.measure import measure_scheme
    from fp8probe.model.rollouts import load_rollouts

    t0 = time.perf_counter()
    student = load_student()
    rollouts = (
        load_rollouts(args.rollouts)
        if args.rollouts
        else make_rollouts(student, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, seed=0)
    )
    bench = Bench(student, rollouts)
    print(f"{rollouts.num_sequences} rollouts, {rollouts.num_response_tokens} response tokens; kl_q_p per token:")
    print(f"  {'sim':<26}{measure_scheme(bench, units=[], kv='fp8')['kl_q_p']:.5f}")
    alone = measure_scheme(bench, units=[], engine="vllm-cuda")["kl_q_p"]
    print(f"  {'vllm-cuda alone':<26}{alone:.5f}")
    original = engines.fp8_kv_attention
    try:
        for name, kw in (
            ("vllm-cuda, K/V only", dict(fp8_query=False, fp8_probs=False)),
            ("+ FP8 probabilities", dict(fp8_query=False)),
            ("+ FP8 query", dict(fp8_probs=False)),
            ("vllm-cuda", {}),
        ):
            engines.fp8_kv_attention = functools.partial(original, **kw)
            kl = measure_scheme(bench, units=[], kv="fp8", engine="vllm-cuda")["kl_q_p"]
            print(f"  {name:<26}{kl:.5f}", flush=True)
    finally:
        engines.fp8_kv_attention = original
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
