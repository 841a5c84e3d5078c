"""The exact sweep on 1 process vs 2 Ray workers, side by side in one run, and the cost model checked on it.

    python benchmarks/scaleout.py [--num-prompts 8] [--max-new-tokens 32] [--workers 2]
    python benchmarks/scaleout.py --estimate-only          # the worked estimate for a 32B student, 8 H100s

On the embedded student (its rollouts sampled here), in one process:

    1 process     the exact sweep with every CPU thread of this machine (the single-process baseline:
                  fp8probe's own loop, the fastest honest version of it here)
    N workers     the same rows measured by N Ray actors, the CPU threads split between them (threads / N each),
                  start-up (Ray, each replica's load) and the reference's transfer included
    ratio         1 process / N workers, wall time of the rows
    cost model    scaleout.CostModel with t_block and t_head measured here at each thread count, the load time of
                  one replica, Ray's start and the reference's bytes: predicted time of both runs and its error
    identical     whether the two tables are byte-identical

Then the cost model's worked estimate for a Qwen2.5-32B-shaped student in BF16 on 8 H100s, 16 rollouts of
560 tokens: its per-block time from FLOPs at an assumed 50 % of the H100's dense BF16 peak (no GPU has run it).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

H100_BF16_DENSE = 989e12  # FLOP/s, NVIDIA's datasheet (SXM)
ASSUMED_MFU = 0.5


def _estimate_32b(workers: int = 8) -> str:
    """The worked estimate: a Qwen2.5-32B-shaped student, 16 x 560 tokens (512 response), BF16, H100s."""
    from transformers import Qwen2Config

    from fp8probe.sweeps.memory import estimate
    from fp8probe.sweeps.scaleout import CostModel

    cfg = Qwen2Config(
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        vocab_size=152064,
        max_position_embeddings=32768,
    )
    h, i = cfg.hidden_size, cfg.intermediate_size
    kvd = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    block_params = h * h * 2 + h * kvd * 2 + 3 * h * i
    tokens, responses = 16 * 560, 16 * 512
    flops_block = 2 * block_params * tokens + 4 * tokens * 560 * h  # GEMMs + attention (causal, ~half of L^2)
    speed = H100_BF16_DENSE * ASSUMED_MFU
    t_block = flops_block / speed
    t_head = 2 * responses * h * cfg.vocab_size / speed + responses * cfg.vocab_size * 4 * 6 / 3.35e12  # + stats
    layers = cfg.num_hidden_layers
    units_per_block = 7
    starts = [b for b in range(layers) for _ in range(units_per_block)] + list(range(layers)) + [0, 0, 0]
    weights = (block_params * layers + 2 * cfg.vocab_size * h) * 2
    transfer = layers * tokens * h * 2 + responses * cfg.vocab_size * 4
    load = weights / 2.0e9  # from local NVMe at ~2 GB/s, every worker in parallel
    model = CostModel(t_block, t_head, start=load + 15, transfer_bytes=transfer, bandwidth=10e9)
    one = CostModel(t_block, t_head, start=load).seconds(starts, layers, 1)
    n = model.seconds(starts, layers, workers)
    mem = estimate(cfg, 2, "exact", 8, 16, 560, responses)
    return (
        f"32B estimate: {len(starts)} rows, t_block {t_block * 1e3:.1f} ms, t_head {t_head * 1e3:.1f} ms "
        f"(FLOPs at {ASSUMED_MFU:.0%} of {H100_BF16_DENSE / 1e12:.0f} TFLOP/s), weights {weights / 2**30:.0f} GiB, "
        f"reference {transfer / 2**30:.1f} GiB per worker; 1 H100: {one / 60:.1f} min; {workers} H100s: "
        f"{n / 60:.1f} min ({one / n:.1f}x); per-GPU memory (fp8probe.sweeps.memory) {mem.device / 2**30:.1f} GiB"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--estimate-only", action="store_true")
    args = ap.parse_args()
    if args.estimate_only:
        print(_estimate_32b())
        return

    from fp8probe.core.schemes import Scheme
    from fp8probe.measurement.bench import Bench
    from fp8probe.measurement.reference import Reference
    from fp8probe.model.rollouts import make_rollouts
    from fp8probe.model.student import load_student
    from fp8probe.sweeps.files import write_table
    from fp8probe.sweeps.scaleout import Cluster, CostModel, RayRows, block_costs, ray_session
    from fp8probe.sweeps.sweep import plan_rows, sweep

    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    t = time.perf_counter()
    student = load_student()
    t_load = time.perf_counter() - t
    rollouts = make_rollouts(student, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, seed=0)
    reference = Reference(student, rollouts, 8)
    layers = len(reference.layers)
    starts = [r.start_block for r in plan_rows(student, Scheme.from_name("FP8_DYNAMIC"))]
    threads = max(1, cores // args.workers)
    costs = {}
    for th in sorted({cores, threads}):
        torch.set_num_threads(th)
        costs[th] = block_costs(reference)
    torch.set_num_threads(cores)
    print(
        f"embedded student, {rollouts.num_sequences} rollouts, {rollouts.num_response_tokens} response tokens, "
        f"{len(starts)} rows, {cores} cores; load {t_load:.1f} s"
    )
    for th, (tb, th_) in costs.items():
        print(f"  {th} thread(s): t_block {tb * 1e3:.1f} ms, t_head {th_ * 1e3:.1f} ms")

    t = time.perf_counter()
    single = sweep(Bench.around(reference, student, rollouts)).table
    t_single = time.perf_counter() - t

    cluster = Cluster(args.workers, threads=threads)
    load = {"name_or_path": None}
    t = time.perf_counter()
    with ray_session(cluster):
        t_ray = time.perf_counter() - t
        ex = RayRows(cluster, load)
        try:
            multi = sweep(Bench.around(reference, student, rollouts), rows_executor=ex).table
        finally:
            ex.close()
    t_multi = time.perf_counter() - t

    def table(df):
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            write_table(d, df)
            return (Path(d) / "sensitivity.csv").read_bytes()

    same = table(single) == table(multi)
    pred_single = CostModel(*costs[cores]).seconds(starts, layers, 1)
    pred_multi = CostModel(
        *costs[threads], start=t_ray + t_load, transfer_bytes=ex.stats["transfer_bytes"], bandwidth=2e9
    ).seconds(starts, layers, args.workers)
    print(
        f"1 process ({cores} threads): {t_single:.1f} s   predicted {pred_single:.1f} s "
        f"(error {100 * (pred_single / t_single - 1):+.0f} %)"
    )
    first, moved = ex.stats.get("first_rows_seconds", float("nan")), ex.stats["transfer_bytes"] / 2**20
    print(
        f"{args.workers} workers ({threads} thread(s) each): {t_multi:.1f} s (Ray start {t_ray:.1f} s, first rows "
        f"after {first:.1f} s, reference {moved:.0f} MiB)"
        f"   predicted {pred_multi:.1f} s (error {100 * (pred_multi / t_multi - 1):+.0f} %)"
    )
    print(f"ratio 1 process / {args.workers} workers: {t_single / t_multi:.2f}")
    print(f"tables byte-identical: {same}")
    print(_estimate_32b())


if __name__ == "__main__":
    main()
