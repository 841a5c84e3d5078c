"""Sweep speed and memory on the embedded student, measured side by side in one run.

Prints three ratios (targets from the issue):
  sweep / naive      exact sweep time / (rows x one full reference forward)          target <= 0.6
                     (the naive loop ModelOpt's KL mode runs: a whole forward, all logits, per unit)
  sweep / bound      exact sweep time / lower bound, where the bound sums, over rows, the timed cost of
                     the blocks from the perturbed one on plus the lm_head on response positions   <= 1.3
  peak RSS / data    peak resident memory / (model fp32 bytes + reference logits bytes)           <= 3

usage: python benchmarks/sweep_speed.py [--num-prompts 16] [--max-new-tokens 48] [--granularity unit]
"""

import argparse
import resource
import sys
import time

import torch

from fp8probe import load_student, make_rollouts
from fp8probe.core.schemes import Scheme
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.mismatch import CHUNK_ROWS
from fp8probe.measurement.reference import Reference, final_norm
from fp8probe.sweeps.settings import SweepSettings
from fp8probe.sweeps.sweep import plan_rows, sweep


def timed(fn, repeat=1):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--granularity", default="unit")
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

    student = load_student()
    model = student.model
    rollouts = make_rollouts(student, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens)
    print(
        f"rollouts: {rollouts.num_sequences} sequences, {int(rollouts.attention_mask.sum())} tokens, "
        f"{rollouts.num_response_tokens} response tokens",
        file=sys.stderr,
    )

    scheme = Scheme.from_name("FP8_DYNAMIC")
    ref = Reference(student, rollouts, args.batch_size)
    t = time.perf_counter()
    sweep(
        Bench.around(ref, student, rollouts, args.batch_size),
        SweepSettings(method="exact", scheme=scheme.name, granularity=args.granularity),
    )
    t_sweep_all = time.perf_counter() - t
    # the sweep's own peak: read before the naive forward below allocates full-vocabulary logits
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model_bytes = sum(p.numel() * 4 for p in {id(p): p for p in model.parameters()}.values())
    logits_bytes = ref.rows.logp.numel() * ref.rows.logp.element_size()

    # one full reference forward over the rollouts, logits on every position (the naive loop's unit of work)
    def full_forward():
        with torch.no_grad():
            for ids, am, _ in rollouts.batches(args.batch_size):
                model(input_ids=ids, attention_mask=am, use_cache=False).logits.sum()

    t_full = timed(full_forward, repeat=2)
    layers = ref.layers

    # per-block cost on the recorded inputs, and the lm_head on response positions
    def run_block(i):
        with torch.no_grad():
            for rec in ref.batches:
                a, kw = rec["inputs"][i]
                layers[i](a[0], *a[1:], **kw)

    t_block = [timed(lambda i=i: run_block(i), repeat=2) for i in range(len(layers))]

    def head():
        with torch.no_grad():
            for rec in ref.batches:
                h = rec["inputs"][-1][0][0]
                hs = final_norm(model)(h[rec["rows"], rec["cols"]])
                for s in range(0, hs.shape[0], CHUNK_ROWS):
                    model.get_output_embeddings()(hs[s : s + CHUNK_ROWS])

    t_head = timed(head, repeat=2)

    rows = [r for r in plan_rows(student, scheme, args.granularity, True) if r.kind != "model"]
    bound = sum(sum(t_block[r.start_block :]) + t_head for r in rows)
    # the sweep also measured the 3 whole-model rows (each a pass from block 0): take them out
    t_sweep = t_sweep_all - 3 * (sum(t_block) + t_head)

    print(f"rows measured: {len(rows)} (+3 whole-model rows)")
    print(
        f"one full reference forward: {t_full:.2f} s; blocks: {sum(t_block):.2f} s; "
        f"lm_head on response rows: {t_head:.2f} s"
    )
    print(
        f"exact sweep: {t_sweep:.1f} s for {len(rows)} rows; naive loop estimate: {len(rows) * t_full:.1f} s; "
        f"lower bound: {bound:.1f} s"
    )
    print(f"sweep / naive   = {t_sweep / (len(rows) * t_full):.3f}   (target <= 0.6)")
    print(f"sweep / bound   = {t_sweep / bound:.3f}   (target <= 1.3)")
    print(
        f"peak RSS / data = {peak / (model_bytes + logits_bytes):.3f}   (target <= 3; peak {peak / 2**20:.0f} MiB, "
        f"model {model_bytes / 2**20:.0f} MiB, reference logits {logits_bytes / 2**20:.0f} MiB)"
    )


if __name__ == "__main__":
    main()
