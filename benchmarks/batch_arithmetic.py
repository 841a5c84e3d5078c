"""The arithmetic component of a measurement: the same perturbation on the same rollouts, batched another way.

    python benchmarks/batch_arithmetic.py [--sizes 2x8 4x24 16x48] [--json runs/batch-arithmetic.json]

A candidate pass and its reference run the rollouts in batches (Rollouts.batches: `batch_size` sequences in rollout
order, each batch cut to its longest sequence). Another batch composition pads to other lengths and another thread
count splits the reductions otherwise; the GEMMs' last fp32 bits move, and a dynamic FP8 activation near a
rounding boundary flips (one e4m3 step is 6-12 % of a value). The exact arithmetic would give one number; each
composition gives another draw of the last bits. This measures how far those draws spread, beside the interval
fp8probe prints (the 90 % bootstrap over prompts at the default composition):

- compositions: batch sizes 1, 2, 4, 8 (the default), 16 in rollout order; four random orders of the sequences at
  batch 8; one and two torch threads at batch 8;
- perturbations: the whole model in FP8_DYNAMIC (model.fp8_all), with the FP8 KV cache (model.fp8_all_kv), the
  shipped 0.008 recipe of the embedded student, the sweep's most sensitive unit (layers.29.mlp.down_proj) and one
  KV-cache layer; and the FP8 KV cache's paired effect on top of FP8 weights (fp8_all_kv - fp8_all, on the same
  tokens, as the sweep prints it);
- per perturbation: the default's value and its 90 % interval, the standard error the interval implies
  (half-width / 1.645), the arithmetic s.d. over the compositions, their range, how many fall outside the interval,
  and the interval's width if the arithmetic s.d. were added in quadrature ("widening").

The embedded student, rollouts sampled at each size (seed 0, the quick start's sampler); one process, timings not
compared, so nothing else needs to be idle.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fp8probe import load_student, make_rollouts
from fp8probe.core.schemes import KVCacheScheme, Scheme
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.measure import Measured, measure
from fp8probe.measurement.perturbation import Perturbation
from fp8probe.recipe.recipe import read_recipe

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parent / "recipes" / "smollm2-135m" / "kl_q_p-0.008" / "recipe.yaml"
Z90 = 1.6448536269514722


def perturbations(student) -> dict[str, Perturbation]:
    dyn = Scheme.from_name("FP8_DYNAMIC")
    units = tuple(student.unit_names)
    recipe = read_recipe(RECIPE)
    return {
        "model.fp8_all": Perturbation(units, dyn),
        "model.fp8_all_kv": Perturbation(units, dyn, student.layers, KVCacheScheme()),
        "recipe kl_q_p-0.008": Perturbation(tuple(u.name for u in recipe.fp8_units(student.units)), dyn),
        "model.layers.29.mlp.down_proj": Perturbation(("model.layers.29.mlp.down_proj",), dyn),
        "model.layers.19.self_attn.kv_cache": Perturbation(kv_layers=(19,), kv=KVCacheScheme()),
    }


def compositions(n: int, seed: int = 0) -> list[tuple[str, list[int], int, int]]:
    """(label, sequence order, batch size, threads); the first is the default."""
    rng = np.random.default_rng(seed)
    out = [("batch 8, rollout order, 2 threads", list(range(n)), 8, 2)]
    out += [(f"batch {b}", list(range(n)), b, 2) for b in (1, 2, 4, 16) if b < n or b == 1]
    out += [(f"batch 8, order {k}", rng.permutation(n).tolist(), 8, 2) for k in range(4)]
    out.append(("batch 8, 1 thread", list(range(n)), 8, 1))
    return out


def measure_all(student, rollouts, ps: dict[str, Perturbation]) -> list[dict]:
    """Every composition's value of every perturbation (and the KV effect), the default's Measured kept."""
    rows = []
    threads = torch.get_num_threads()
    for label, order, batch, nthreads in compositions(rollouts.num_sequences):
        torch.set_num_threads(nthreads)
        r = rollouts.subset(order)
        t = time.perf_counter()
        bench = Bench(student, r, batch)
        got: dict[str, Measured] = {name: measure(bench, p) for name, p in ps.items()}
        effect = got["model.fp8_all_kv"].change_from(got["model.fp8_all"])
        rows.append(
            {
                "composition": label,
                "batch": batch,
                "threads": nthreads,
                "values": {k: m.metrics["kl_q_p"] for k, m in got.items()} | {"kv_effect": effect[0]},
                "intervals": {k: list(m.interval("kl_q_p")) for k, m in got.items()}
                | {"kv_effect": [effect[1], effect[2]]},
                "seconds": time.perf_counter() - t,
            }
        )
        print(
            f"  {label:<36} {rows[-1]['seconds']:6.1f} s  "
            + "  ".join(f"{v:.5g}" for v in rows[-1]["values"].values()),
            flush=True,
        )
    torch.set_num_threads(threads)
    return rows


def summarize(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for name in rows[0]["values"]:
        v = np.array([r["values"][name] for r in rows])
        lo, hi = rows[0]["intervals"][name]
        se = (hi - lo) / (2 * Z90)
        sd = float(v.std(ddof=1))
        out[name] = {
            "default": float(v[0]),
            "interval": [lo, hi],
            "sampling_se": se,
            "arithmetic_sd": sd,
            "arithmetic_sd_rel": sd / abs(v.mean()) if v.mean() else math.nan,
            "range": [float(v.min()), float(v.max())],
            "max_rel_change": float(np.abs(v - v[0]).max() / abs(v[0])) if v[0] else math.nan,
            "outside_interval": int(((v < lo) | (v > hi)).sum()),
            "compositions": len(v),
            "sd_over_se": sd / se if se else math.nan,
            "widening": math.sqrt(1 + (sd / se) ** 2) if se else math.nan,
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["2x8", "4x24", "16x48"], help="PROMPTSxTOKENS")
    ap.add_argument("--json", default=None, help="write every composition's values here")
    a = ap.parse_args(argv)
    student = load_student()
    ps = perturbations(student)
    doc = {"threads_default": torch.get_num_threads(), "torch": torch.__version__, "sizes": {}}
    for size in a.sizes:
        prompts, tokens = map(int, size.split("x"))
        r = make_rollouts(student, num_prompts=prompts, max_new_tokens=tokens, seed=0)
        print(f"{size}: {r.num_sequences} rollouts, {r.num_response_tokens} response tokens", flush=True)
        rows = measure_all(student, r, ps)
        doc["sizes"][size] = {"response_tokens": r.num_response_tokens, "rows": rows, "summary": summarize(rows)}
    for size, d in doc["sizes"].items():
        print(
            f"\n{size} ({d['response_tokens']} response tokens): kl_q_p, default = batch 8 in rollout order, "
            f"2 threads; {len(d['rows'])} compositions"
        )
        print(
            f"{'perturbation':<36}{'default [90 % interval]':>34}{'arith s.d.':>12}{'sd/se':>8}{'max change':>12}"
            f"{'outside':>9}{'widening':>10}"
        )
        for name, s in d["summary"].items():
            lo, hi = s["interval"]
            print(
                f"{name:<36}{s['default']:>12.4g} [{lo:.4g}, {hi:.4g}]".ljust(70)
                + f"{s['arithmetic_sd']:>12.3g}{s['sd_over_se']:>8.2f}{s['max_rel_change']:>11.1%}"
                f"{s['outside_interval']:>6}/{s['compositions']:<3}{s['widening']:>9.3f}x"
            )
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
