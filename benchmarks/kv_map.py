"""A per-layer KV map chosen with the weights (`recipe --kv-tokens`) against the KV maps users run today (#75).

    python benchmarks/kv_map.py SWEEP_DIR --budget 0.008 --kv-tokens 262144 [--json OUT.json]

On a finished sweep (its table with one KV row per layer, its rollouts and student), `make_recipe` under one budget
with every layer's FP8 KV cache a candidate priced at the workload (KV tokens in flight) gives the mixed recipe: its
weights W and its KV layers in BF16, S (k of them). Every row below is measured on the recipe's held-out prompts
(the search never saw them), its change from the mixed recipe a paired bootstrap over those prompts (90 %):

    mixed               W + FP8 KV cache except S                     (what the recipe chose)
    first/last, k       W + FP8 KV except the first ceil(k/2) and last floor(k/2) layers  (equal capacity)
    KV rows, k          W + FP8 KV except the k layers whose own KV rows score worst: the KV map chosen apart from
                        the weights, as a separate search would (ModelOpt's composition: weights first, KV second)
                        (equal capacity)
    boundary 2          W + FP8 KV except the first and last two layers (vLLM's packed-KV default)
    uniform FP8 KV      W + FP8 KV in every layer (more capacity)
    BF16 KV             W, the KV cache BF16 (less capacity)
    joint, every layer  the recipe made at the same budget with the KV cache in every layer (today's
                        `--kv-cache-dtype fp8`): other weights, the capacity of uniform FP8 KV

On a model with sliding-window layers (Gemma 3) the baselines skip sliding layers only, counted among them (first/
last, boundary 2: the first and last sliding layers), as the mixed recipe does: vLLM 0.32 cannot keep a
full-attention layer's KV cache BF16 beside them. Each row states its KV tokens at the same KV memory (capacity by
vLLM's accounting for the mixed cache), relative to all-BF16 KV. Skipping as many layers is equal capacity on a
full-attention student; beside sliding-window layers vLLM's grouping of identical layers makes it depend on the map
(the column says by how much).
"""

from __future__ import annotations

import argparse
import json
import math
import time


def kv_maps(allowed: list[int], k: int, rows: dict) -> dict:
    """The baselines' skipped layers (name -> sorted layer indices) among the layers a map may skip (`allowed`: every
    layer, or on a model with sliding-window layers the sliding ones, since vLLM 0.32 cannot keep a full-attention
    layer's KV cache BF16 beside them)."""
    first, last = math.ceil(k / 2), k // 2
    worst = sorted((i for i in rows if i in allowed), key=lambda i: -rows[i])[:k]
    return {
        f"first/last, k={k}": sorted(set(allowed[:first]) | set(allowed[len(allowed) - last :])),
        f"KV rows, k={k}": sorted(worst),
        "boundary 2": sorted(set(allowed[:2]) | set(allowed[-2:])),
        "uniform FP8 KV": [],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep")
    ap.add_argument("--budget", type=float, default=0.008)
    ap.add_argument("--kv-tokens", type=int, default=262_144, help="KV tokens in flight (sequences x context)")
    ap.add_argument("--kv-context", type=int, help="one sequence's tokens (recipe --kv-context; the capacity's length)")
    ap.add_argument("--kv-memory-gib", type=float, default=8.0, help="KV memory the capacity column is sized at")
    ap.add_argument("--json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    head, rows = compare(args.sweep, args.budget, args.kv_tokens, args.kv_memory_gib, args.kv_context)
    print(head)
    print("| row | KV BF16 layers | weight MiB saved | KV tokens vs BF16 KV | held-out kl_q_p | from mixed [90 %] |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        layers = ",".join(map(str, r["kv_bf16_layers"])) or "none"
        print(
            "| {} | {} | {:.1f} | {:.3f}x | {:.5f} [{:.5f}, {:.5f}] | {:+.5f} [{:+.5f}, {:+.5f}] |".format(
                r["row"], layers, r["weight_bytes_saved"] / 2**20, r["kv_tokens_vs_bf16"], r["kl_q_p"], *r["interval"],
                *r["change"],
            )
        )  # fmt: skip
    print(f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(vars(args), head=head, rows=rows), f, indent=1)


def compare(
    sweep_dir, budget: float, kv_tokens: int, kv_memory_gib: float = 8.0, kv_context: int | None = None
) -> tuple[str, list[dict]]:
    """(a one-line description, the rows of the module docstring's table, each a dict)."""
    from fp8probe.core.errors import FP8ProbeError
    from fp8probe.core.schemes import KVCacheScheme, Scheme
    from fp8probe.deploy.capacity import kv_capacity, kv_layout
    from fp8probe.measurement.bench import Bench
    from fp8probe.measurement.measure import measure
    from fp8probe.measurement.perturbation import Perturbation
    from fp8probe.measurement.reference import Reference
    from fp8probe.model.rollouts import load_rollouts
    from fp8probe.model.structure import layer_attention_types, text_config
    from fp8probe.model.student import load_student
    from fp8probe.recipe.selection import make_recipe
    from fp8probe.recipe.settings import RecipeContext, RecipeSettings
    from fp8probe.sweeps.files import read_sweep

    run = read_sweep(sweep_dir)
    rollouts = load_rollouts(sweep_dir)
    student = load_student(run.model_source, dtype=run.run.dtype or "float32")
    context = RecipeContext(scheme=run.run.scheme, scales=run.sequence_scales(rollouts))
    bench = Bench(student, rollouts, run.run.batch_size)
    common = dict(budget=budget, kv_cache_dtype="fp8", engine="none")
    per_layer = RecipeSettings(**common, kv_tokens=kv_tokens, kv_context=kv_context)
    mixed = make_recipe(run.table, bench, per_layer, context=context)
    try:  # today's --kv-cache-dtype fp8: the KV cache in every layer, within the same budget if it fits at all
        joint, no_joint = make_recipe(run.table, bench, RecipeSettings(**common), context=context), ""
    except FP8ProbeError as e:
        joint, no_joint = None, f"; joint, every layer: none ({e})"
    search, held, _ = rollouts.split(2)  # the recipes' own split (RecipeSettings.holdout's default)
    n = len(student.layers)
    table = run.table
    kv_rows = {int(r.block): float(r.kl_q_p) for r in table[table.kind == "kv"].itertuples()}

    # the held-out prompts' reference with the search set's calibration (what an export calibrates before they are seen)
    from fp8probe.measurement.calibration import calibrate

    ref = Reference(student, held, run.run.batch_size, calibrate=False)
    ref.calibration = calibrate(student, search, list(student.unit_names), batch_size=run.run.batch_size)
    scheme, kv = Scheme.from_name(run.run.scheme), KVCacheScheme.from_name("fp8")

    def measured(rec, skip):
        units = tuple(u.name for u in rec.fp8_units(student.units))
        layers = tuple(i for i in student.layers if i not in set(skip))
        return measure(Bench.around(ref, student, held, run.run.batch_size), Perturbation(units, scheme, layers, kv))

    def tokens(skip, dtype="fp8"):
        lay = kv_layout(cfg, dtype, skip=tuple(skip)) if dtype != "auto" else kv_layout(cfg, "auto")
        return kv_capacity(lay, int(kv_memory_gib * 2**30), kv_context or 4096)["kv_tokens"]

    # the checkpoint as vLLM serves it: bfloat16 (the student here may be loaded in fp32)
    cfg = type(student.model.config).from_dict({**student.model.config.to_dict(), "dtype": "bfloat16"})

    skip = mixed.kv_skip_layers if mixed.kv_cache_dtype else list(range(n))  # no layer chosen: no FP8 KV cache
    k = len(skip)
    windows = layer_attention_types(text_config(cfg), True)
    allowed = [i for i in range(n) if windows[i] is not None] if any(windows) else list(range(n))
    rows = [("mixed", mixed, skip, "fp8")]
    rows += [(name, mixed, skip, "fp8") for name, skip in kv_maps(allowed, k, kv_rows).items()]
    rows += [("BF16 KV", mixed, list(range(n)), "auto")] + ([("joint, every layer", joint, [], "fp8")] if joint else [])
    base = measured(mixed, skip)
    assert math.isclose(base.metrics["kl_q_p"], mixed.measured, rel_tol=1e-6), (base.metrics, mixed.measured)
    bf16_tokens = tokens([], "auto")
    head = (
        f"{student.name}: budget kl_q_p {budget}, {kv_tokens:,} KV tokens in flight; mixed recipe: "
        f"{len(mixed.quantized)} fused groups in FP8 ({mixed.bytes_saved / 2**20:.1f} MiB), KV BF16 in layers "
        f"{skip}; held out: {held.num_prompts} prompts{no_joint}"
    )
    out = []
    for name, rec, bf16, dtype in rows:
        m = base if name == "mixed" else measured(rec, bf16 if dtype == "fp8" else list(range(n)))
        d, dlo, dhi = (0.0, 0.0, 0.0) if name == "mixed" else m.change_from(base, "kl_q_p")
        out.append(
            dict(
                row=name,
                kv_bf16_layers=list(bf16) if dtype == "fp8" else list(range(n)),
                weight_bytes_saved=rec.bytes_saved,
                kv_tokens_vs_bf16=tokens(bf16 if dtype == "fp8" else [], dtype) / bf16_tokens,
                kl_q_p=m.metrics["kl_q_p"],
                interval=list(m.interval("kl_q_p")),
                change=[float(d), float(dlo), float(dhi)],
            )
        )
    return head, out


if __name__ == "__main__":
    main()
