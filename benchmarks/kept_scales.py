"""What the sweep's per-sequence static amax buy the recipe: the default recipe (a memory target, its own held-out
split, unrefined) with the search set's scales read from the sweep's amax, against the same recipe calibrating them
with a pass of its own; and what keeping them costs the sweep's calibration pass.

    python benchmarks/kept_scales.py --model smollm2-135m --rollouts runs/smollm2-128 --bits 12 [--repeat 2]

Timed side by side in one run, alternating, best of --repeat: the calibration pass over the rollouts with and
without each sequence's amax (what `fp8probe sweep` runs when it calibrates), and make_recipe with and without them
(the sweep table is the default fisher sweep of the same rollouts, made once first, untimed). Both recipes must
choose the same groups and report the same held-out figure: the kept amax over the search set are, to the bit, what
its pass records (up to the fp32 rounding of a batch's other sequences).
"""

from __future__ import annotations

import argparse
import time

import torch

from fp8probe import RecipeSettings, load_rollouts, load_student
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.calibration import calibrate
from fp8probe.model.embedded import STUDENTS
from fp8probe.recipe.selection import make_recipe
from fp8probe.recipe.settings import RecipeContext
from fp8probe.sweeps.settings import SweepSettings
from fp8probe.sweeps.sweep import sweep


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", choices=sorted(STUDENTS))
    ap.add_argument("--rollouts", default="runs/smollm2", help="a sweep dir (or rollouts dir) of that student")
    ap.add_argument("--bits", type=float, default=12.0, help="the recipe's memory target, effective bits")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    student, rollouts = load_student(args.model), load_rollouts(args.rollouts)
    swept = sweep(Bench(student, rollouts), SweepSettings(scheme="FP8", granularity="group", include_kv=False))
    names = list(student.unit_names)
    ask = RecipeSettings(effective_bits=args.bits, engine="none")
    times = {k: [] for k in ("calibrate", "calibrate, per sequence", "recipe, its own pass", "recipe, kept amax")}
    recipes = {}
    for _ in range(args.repeat):
        s, _ = _timed(lambda: calibrate(student, rollouts, names))
        times["calibrate"].append(s)
        s, cal = _timed(lambda: calibrate(student, rollouts, names, per_sequence=True))
        times["calibrate, per sequence"].append(s)
        for key, ctx in (
            ("recipe, its own pass", RecipeContext(scheme="FP8")),
            ("recipe, kept amax", RecipeContext(scheme="FP8", scales=cal.per_sequence)),
        ):
            s, recipes[key] = _timed(
                lambda ctx=ctx: make_recipe(swept.table, Bench(student, rollouts), ask, context=ctx)
            )
            times[key].append(s)
    own, kept = recipes["recipe, its own pass"], recipes["recipe, kept amax"]
    print(
        f"{args.model}: {rollouts.num_sequences} rollouts, {rollouts.num_response_tokens} response tokens; "
        f"recipe at {args.bits:g} effective bits, held out every {ask.holdout}th prompt; best of {args.repeat}, "
        "alternating"
    )
    for k, v in times.items():
        print(f"  {k:<26}{min(v):8.2f} s  [{', '.join(f'{x:.2f}' for x in v)}]")
    print(
        f"  recipe time, kept / own pass: {min(times['recipe, kept amax']) / min(times['recipe, its own pass']):.3f}; "
        f"calibration, per sequence / plain: {min(times['calibrate, per sequence']) / min(times['calibrate']):.3f}"
    )
    print(
        f"  same groups: {own.quantized == kept.quantized}; held-out kl_q_p {own.measured:.6g} (own pass) against "
        f"{kept.measured:.6g} (kept), relative difference {abs(kept.measured - own.measured) / own.measured:.2e}"
    )


if __name__ == "__main__":
    main()
