"""The fast sensitivity estimate (`--method fisher`) against the exact sweep, side by side in one run.

    python benchmarks/fast_vs_exact.py [--exact runs/smollm2-exact] [--budget 0.008] [--repeat 3]

On the embedded student (its 16 rollouts of up to 48 tokens) and two tiny random-weight models built from
their configs (a Qwen3 and a Qwen3-MoE, on the embedded tokenizer), prints per model:

    fisher / reference   time of the estimate over one reference pass (median of --repeat, seeds 0, 1, ...;
                         target <= 4); rho and top-10 for each seed show the estimate's own noise
    exact / fisher       time of the exact sweep over the estimate (target >= 20 on the embedded student)
    rho, top-10          Spearman's rho and top-10 overlap of estimate vs exact kl_q_p (targets >= 0.9, >= 7)
                         for the default estimator, and rho for the other two (fisher.py)
    recipes              the recipe each table gives under one kl_q_p budget, both measured

The exact sweep is run here unless --exact names a finished exact sweep of the embedded student, whose
table and recorded sweep time (run.json) are used instead (the recorded time ran alone on this machine).
ModelOpt's own two modes (auto_quantize's KL and gradient scores) agree at Spearman 0.88 on the embedded
student (benchmarks/vs_modelopt.py), the figure the estimate has to beat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def _tiny(tokenizer, model_type: str, seed: int = 0):
    import transformers as tf

    from fp8probe.model.structure import list_units
    from fp8probe.model.student import Student

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    if model_type == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**common, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256)
    else:
        cfg = tf.Qwen3Config(**common)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval().requires_grad_(False)
    with torch.no_grad():  # weights large enough that the model is not a uniform distribution
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0, 0.05)
    return Student(
        model=model,
        tokenizer=tokenizer,
        units=list_units(model),
        name=f"tiny-{model_type}",
        path="",
        model_type=model_type,
    )


def _median_time(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def measure(name, student, rollouts, repeat: int, budget, exact_df=None, exact_seconds=None) -> dict:
    from fp8probe.core.schemes import Scheme
    from fp8probe.core.stats import spearman, top_overlap
    from fp8probe.measurement.bench import Bench
    from fp8probe.measurement.fisher import ESTIMATORS, Draws, fisher_rows
    from fp8probe.measurement.reference import Reference
    from fp8probe.recipe.agreement import agreement
    from fp8probe.sweeps.settings import SweepSettings
    from fp8probe.sweeps.sweep import plan_rows, sweep

    rows = plan_rows(student, Scheme.from_name("FP8_DYNAMIC"))
    t_ref, reference = _median_time(lambda: Reference(student, rollouts), repeat)
    runs = []  # one label draw per seed: the spread of rho and top-10 is the estimate's own noise
    t_fisher, _ = _median_time(lambda: runs.append(fisher_rows(student, rollouts, rows, Draws(seed=len(runs)))), repeat)
    fr = runs[0]
    if exact_df is None:
        t = time.perf_counter()
        exact_df = sweep(Bench.around(reference, student, rollouts)).table
        exact_seconds = time.perf_counter() - t + t_ref  # a sweep includes its reference pass
    fast_df = sweep(Bench(student, rollouts), SweepSettings(method="fisher")).table
    ex = dict(zip(exact_df["unit"], exact_df["kl_q_p"]))
    units = [r.unit for r in rows if r.kind != "model"]
    rho = {e: spearman([fr.column(e)[u] for u in units], [ex[u] for u in units]) for e in ESTIMATORS}
    est = fr.column()
    per_seed = [
        (
            spearman([f.column()[u] for u in units], [ex[u] for u in units]),
            top_overlap({u: f.column()[u] for u in units}, {u: ex[u] for u in units}),
        )
        for f in runs
    ]
    a = agreement(fast_df, exact_df, Bench.around(reference, student, rollouts), SweepSettings(agreement_budget=budget))
    return {
        "model": name,
        "rows": len(units),
        "response_tokens": fr.num_tokens,
        "reference_s": t_ref,
        "fisher_s": t_fisher,
        "exact_s": exact_seconds,
        "fisher_over_reference": t_fisher / t_ref,
        "exact_over_fisher": exact_seconds / t_fisher,
        "spearman": rho,
        "top10_overlap": top_overlap({u: est[u] for u in units}, {u: ex[u] for u in units}),
        "per_seed": per_seed,
        "scale": a["scale"],
        "budget": a["budget"]["value"],
        "recipes": a["recipes"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exact", help="a finished exact sweep of the embedded student to reuse (default: run one)")
    ap.add_argument("--budget", type=float, default=0.008, help="kl_q_p budget of the embedded student's recipes")
    ap.add_argument("--repeat", type=int, default=3, help="timings are the median of this many runs")
    ap.add_argument("--out", default="runs/fast-vs-exact")
    args = ap.parse_args()

    from fp8probe.model.rollouts import load_rollouts, make_rollouts
    from fp8probe.model.student import load_student
    from fp8probe.sweeps.files import read_sweep

    torch.manual_seed(0)
    results = []
    student = load_student(None)
    if args.exact:
        run = read_sweep(args.exact)
        if (run.table["method"] != "exact").any() or run.run.scheme != "FP8_DYNAMIC":
            raise SystemExit(f"{args.exact} is not an exact FP8_DYNAMIC sweep")
        rollouts = load_rollouts(args.exact)
        results.append(
            measure(
                "SmolLM2-135M (embedded)",
                student,
                rollouts,
                args.repeat,
                args.budget,
                run.table,
                run.run.seconds["sweep"],
            )
        )
    else:
        rollouts = make_rollouts(student, num_prompts=16, max_new_tokens=48, seed=0)
        results.append(measure("SmolLM2-135M (embedded)", student, rollouts, args.repeat, args.budget))
    for arch in ("qwen3", "qwen3_moe"):
        tiny = _tiny(student.tokenizer, arch)
        r = make_rollouts(tiny, num_prompts=16, max_new_tokens=32, seed=0)
        results.append(measure(f"tiny {arch} (random weights, 8 blocks)", tiny, r, args.repeat, None))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fast_vs_exact.json").write_text(json.dumps(results, indent=2))
    print(
        f"\n{'model':40} {'rows':>5} {'fisher/ref':>10} {'exact/fisher':>12} {'rho':>6} {'top10':>6} "
        f"{'est/exact':>9}  rho(sequence, position, element)"
    )
    for r in results:
        rho = r["spearman"]
        print(
            f"{r['model']:40} {r['rows']:5d} {r['fisher_over_reference']:10.2f} {r['exact_over_fisher']:12.1f} "
            f"{rho['window']:6.3f} {r['top10_overlap']:4d}/10 {r['scale']:9.2f}  "
            f"{rho['sequence']:.3f}, {rho['position']:.3f}, {rho['element']:.3f}"
        )
    print("\nthe estimate's own noise, one label draw per seed (rho, top-10 for seeds 0, 1, ...):")
    for r in results:
        print(f"  {r['model']}: " + "; ".join(f"{rho:.3f}, {top}/10" for rho, top in r["per_seed"]))
    print("\nrecipes at one kl_q_p budget (no refinement), chosen from each table, both measured:")
    for r in results:
        rec = r["recipes"]
        if "measured_kl_q_p" not in rec["exact"] or "measured_kl_q_p" not in rec["fast"]:
            print(f"  {r['model']}: {rec}")
            continue
        print(
            f"  {r['model']}: budget {r['budget']:.3g}: exact table {rec['exact']['fp8_groups']} groups in FP8, "
            f"measured {rec['exact']['measured_kl_q_p']:.4g}, {rec['exact']['bytes_saved'] / 2**20:.1f} MiB; "
            f"fast table {rec['fast']['fp8_groups']} groups, measured {rec['fast']['measured_kl_q_p']:.4g}, "
            f"{rec['fast']['bytes_saved'] / 2**20:.1f} MiB; {'the same recipe' if rec['same'] else 'different'}"
        )
    print(
        "\ntimes (s): "
        + "; ".join(
            f"{r['model'].split(' ')[0]} {r['model'].split(' ')[1]}: reference "
            f"{r['reference_s']:.2f}, fisher {r['fisher_s']:.2f}, exact {r['exact_s']:.0f}"
            for r in results
        )
    )


if __name__ == "__main__":
    main()
