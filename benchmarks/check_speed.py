"""How long an admission check takes, in units of one reference pass, on the embedded student.

    python benchmarks/check_speed.py [--num-prompts 16] [--max-new-tokens 48] [--recipe RECIPE.yaml]

Measured side by side in one run, on the same rollouts: one reference pass (the trainer's forward over the
rollouts, what any mismatch measurement needs at least once), and a whole `check` of a recipe + FP8 KV cache
(reference pass, candidate pass, prefix shift: two continuations of the prompts and a pass on the
candidate's own samples): minutes, not a training run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fp8probe import RolloutSettings, load_student, make_rollouts
from fp8probe.budget.admission import check
from fp8probe.budget.fit import default_budget
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.reference import Reference
from fp8probe.recipe.recipe import read_recipe
from fp8probe.sources import sources

MEDIUM = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m" / "kl_q_p-0.008" / "recipe.yaml"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--recipe", default=str(MEDIUM))
    args = ap.parse_args()
    student = load_student()
    rollouts = make_rollouts(student, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, seed=0)
    Reference(student, rollouts)  # warm-up
    t = time.perf_counter()
    Reference(student, rollouts)
    t_ref = time.perf_counter() - t
    config = sources.combine([sources.recipe(student, read_recipe(args.recipe)), sources.kv_cache(student, "fp8")])
    t = time.perf_counter()
    sampling = RolloutSettings(num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens)
    report = check(Bench.of(student, rollouts, sampling), config, default_budget())
    t_check = time.perf_counter() - t
    print(f"{rollouts.num_sequences} rollouts, {rollouts.num_response_tokens} response tokens; {config.name}")
    print(
        f"one reference pass: {t_ref:.1f} s; whole check: {t_check:.1f} s ({report['verdict']}, kl_q_p "
        f"{report['measured']:.4g})"
    )
    print(f"check / reference pass = {t_check / t_ref:.2f}   (two token-by-token generations of the prompts dominate)")


if __name__ == "__main__":
    main()
