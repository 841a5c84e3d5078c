"""The default sweep's cost over its floor: its wall time as a multiple of one forward + backward pass over the same
rollouts, the least any gradient-based estimate of every layer's cost must spend (ModelOpt's gradient mode spends
at least that; so does fisher, the sweep's default method).

    python benchmarks/cost_floor.py --model smollm2-135m --rollouts runs/smollm2 [--repeat 3]

Both timed side by side in one run, alternating, best of --repeat: the floor is a forward of the fp32 student over
the rollouts in the sweep's batches (8) and a backward of the sampled response tokens' log-likelihood to the
embeddings' output (every activation's gradient; no parameter's, as the fisher estimate's own pass); the sweep is
`sweep()` with SweepSettings' defaults except what the peer table measures (scheme FP8, per fused group, no KV rows),
its whole time (calibration, estimate, the whole-model rows' reference and passes).
"""

from __future__ import annotations

import argparse
import time

import torch

from fp8probe import load_rollouts, load_student
from fp8probe.measurement.bench import Bench
from fp8probe.model.embedded import STUDENTS
from fp8probe.sweeps.settings import SweepSettings
from fp8probe.sweeps.sweep import sweep


def forward_backward(student, rollouts, batch_size: int = 8) -> float:
    """Seconds of one forward + backward over the rollouts: the sampled response tokens' negative log-likelihood,
    back to the embeddings' output (every layer's activation gradient, what a gradient score reads; no parameter's)."""
    model = student.model
    leaf = model.get_input_embeddings().register_forward_hook(lambda m, a, out: out.requires_grad_(True))
    t = time.perf_counter()
    for ids, am, rm in rollouts.batches(batch_size):  # the lm_head on the response-predicting rows only, as the sweep
        hidden = model.get_decoder()(input_ids=ids, attention_mask=am).last_hidden_state[:, :-1]
        rows = rm[:, 1:].bool()
        logits = model.get_output_embeddings()(hidden[rows])
        torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][rows], reduction="sum").backward()
    secs = time.perf_counter() - t
    leaf.remove()
    return secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", choices=sorted(STUDENTS))
    ap.add_argument("--rollouts", default="runs/smollm2", help="a sweep dir (or rollouts dir) of that student")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    student, rollouts = load_student(args.model), load_rollouts(args.rollouts)
    settings = SweepSettings(scheme="FP8", granularity="group", include_kv=False)
    floor, swept = [], []
    for _ in range(args.repeat):
        floor.append(forward_backward(student, rollouts))
        t = time.perf_counter()
        sweep(Bench(student, rollouts), settings)
        swept.append(time.perf_counter() - t)
    f, s = min(floor), min(swept)
    print(
        f"{args.model}: {rollouts.num_sequences} rollouts, {rollouts.num_response_tokens} response tokens; default "
        f"sweep (method {settings.method}, FP8 per group, no KV) {s:.1f} s "
        f"[runs {', '.join(f'{x:.1f}' for x in swept)}]; "
        f"one forward + backward {f:.2f} s [runs {', '.join(f'{x:.2f}' for x in floor)}]; "
        f"sweep / floor {s / f:.1f}x (best of {args.repeat} each)"
    )


if __name__ == "__main__":
    main()
