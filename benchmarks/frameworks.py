"""What each RL framework can apply on the embedded student at one budget: the README's framework table.

    python benchmarks/frameworks.py [--sweep runs/smollm2-exact] [--budget 0.008] [--out runs/frameworks]

Needs an exact sweep of the embedded student (`fp8probe sweep --out runs/smollm2-exact`: FP8_DYNAMIC, the
quick start's rollouts, every row measured; about 8 minutes). Makes an FP8_BLOCK sweep of the same
rollouts (the scheme verl, NeMo-RL and slime quantize with), then for every target the best recipe that
target can express under the budget (`fp8probe recipe --target`), each measured on the same rollouts
against the same reference, and one `fp8probe export --target all` of all of them. Where a target cannot
apply any FP8 recipe at this budget, the table says why and what the one recipe it can express measures.
About 5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fp8probe import FP8ProbeError, load_rollouts, load_student, measure_scheme
from fp8probe.cli import main as cli
from fp8probe.core.schemes import KVCacheScheme, Scheme
from fp8probe.deploy.export import export
from fp8probe.deploy.frameworks import TARGETS
from fp8probe.measurement.bench import Bench
from fp8probe.model.settings import ModelSource
from fp8probe.model.structure import scheme_blockers
from fp8probe.recipe.refine import DEFAULT_REFINE_PASSES
from fp8probe.recipe.selection import make_recipe
from fp8probe.recipe.settings import RecipeContext, RecipeSettings
from fp8probe.sweeps.files import read_sweep

KEYS = {
    "vllm": "`vllm serve CKPT --config CKPT/vllm.yaml` (compressed-tensors checkpoint)",
    "verl": "`actor_rollout_ref.rollout.quantization=fp8`, `+…engine_kwargs.vllm.kv_cache_dtype`, "
    "`algorithm.rollout_correction.rollout_is=token`",
    "verl-sglang": "the same with `rollout.name=sglang` + `SGLANG_FP8_IGNORED_LAYERS` (Ray runtime env)",
    "verl-opd": "verl's rollout FP8 and KV as `verl`, `distillation.{enabled, distillation_loss.{loss_mode, "
    "use_policy_gradient, use_task_rewards}, teacher_models.teacher_model.model_path}`, "
    "`algorithm.rollout_correction.rollout_{is,rs}` by loss",
    "verl-fully-async": "`verl.experimental.fully_async_policy.fully_async_main`, "
    "`async_training.{staleness_threshold, trigger_parameter_sync_step, partial_rollout}`, "
    "`{rollout,trainer}.n_gpus_per_node`, `rollout_rs`",
    "verl-separate-async": "`trainer.v1.{trainer_mode=separate_async, separate_async.{parameter_sync_step, "
    "num_warmup_batches}, sampler.max_off_policy_threshold}`, the rollout pool and `checkpoint_engine.backend=nccl`, "
    "`rollout_is=token`",
    "verl-colocate-async": "`trainer.v1.{trainer_mode=colocate_async, colocate_async.num_warmup_batches, "
    "sampler.max_off_policy_threshold}`, `rollout_is=token`",
    "nemo-rl": "`policy.generation.vllm_cfg.{precision, kv_cache_dtype, num_first_layers_in_bf16, "
    "num_last_layers_in_bf16, quantization_ignored_layer_kws}`, `loss_fn.truncated_importance_sampling_*`",
    "slime": "`tools/convert_hf_to_fp8.py --strategy block`, `--sglang-kv-cache-dtype`, `--use-tis --tis-clip`",
    "openrlhf": "`--algo.advantage.is_correction_{level,mode,threshold}` (no FP8 option)",
    "trl": "`trl vllm-serve --kv_cache_dtype fp8`, `vllm_importance_sampling_*`",
    "skyrl": "`generator.inference_engine.engine_init_kwargs.{quantization,kv_cache_dtype}`, "
    "`trainer.algorithm.off_policy_correction.*`",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", default="runs/smollm2-exact")
    ap.add_argument("--budget", type=float, default=0.008)
    ap.add_argument("--out", default="runs/frameworks")
    args = ap.parse_args()
    out, t0 = Path(args.out), time.perf_counter()
    block_dir = out / "sweep-fp8-block"
    if not (block_dir / "sensitivity.csv").exists():
        code = cli(
            [
                "-q",
                "sweep",
                "--rollouts",
                args.sweep,
                "--method",
                "exact",
                "--scheme",
                "FP8_BLOCK",
                "--no-kv",
                "--out",
                str(block_dir),
            ]
        )
        assert code == 0, "the FP8_BLOCK sweep failed"
    runs = {"FP8_DYNAMIC": read_sweep(args.sweep), "FP8_BLOCK": read_sweep(block_dir)}
    student = load_student()
    rollouts = load_rollouts(args.sweep)
    bench = Bench(student, rollouts, runs["FP8_DYNAMIC"].run.batch_size)  # one reference pass for every recipe
    rows, made = [], []
    plan = [("vllm", "free"), ("vllm", "first-last")] + [(t, None) for t in TARGETS if t != "vllm"]
    for name, form in plan:
        target = TARGETS[name]
        form = form or target.form
        scheme = target.scheme or "FP8_DYNAMIC"
        run = runs.get(scheme, runs["FP8_DYNAMIC"])
        kv = "fp8" if form == "none" and target.kv else None
        label = ("vllm" if form == "free" else "vllm, first/last blocks only") if name == "vllm" else name
        if not target.weights and kv is None:
            rows.append((label, form, "-", "BF16 only: no FP8 weights or KV cache reach its engine", ""))
            continue
        d = out / "recipes" / (name if name != "vllm" else f"vllm-{form}")
        try:
            ask = RecipeSettings(
                budget=args.budget, kv_cache_dtype=kv, form=form, refine=DEFAULT_REFINE_PASSES, holdout=0, engine="none"
            )
            context = RecipeContext(
                scheme=scheme,
                sweep_dir=str(run.directory),
                kv_scale=target.kv_scale,
                target=name if form == target.form else None,
            )
            rec = make_recipe(run.table, bench, ask, context=context)
        except FP8ProbeError as e:
            rows.append(
                (
                    label,
                    form,
                    scheme if target.weights else "-",
                    _why(bench, target, scheme, e),
                    "",
                )
            )
            continue
        rec.write(d)
        made.append(d / "recipe.yaml")
        what = (
            f"{len(rec.quantized)}/{len(rec.quantized) + len(rec.kept)} groups FP8, "
            f"{rec.bytes_saved / 2**20:.1f} MiB saved"
            if rec.quantized
            else "BF16 weights"
        ) + (" + FP8 KV (scales 1.0)" if rec.kv_cache_dtype and rec.kv_scale == "unit" else "")
        rows.append((label, form, scheme if rec.quantized else "-", what, f"{rec.measured:.4g}"))
    exported = export(ModelSource(), made, out / "export", targets=["all"], rollouts=rollouts)
    print(f"| framework | can apply | FP8 scheme | best recipe at kl_q_p <= {args.budget} | measured kl_q_p | keys |")
    print("|---|---|---|---|---|---|")
    for label, form, scheme, what, measured in rows:
        print(f"| {label} | {form} | {scheme} | {what} | {measured} | {KEYS[label.split(' ')[0].rstrip(',')]} |")
    print()
    for p in exported.plans:
        print(f"- {p.summary().replace(str(out) + '/', '')}")
    print(f"\nall in {time.perf_counter() - t0:.0f} s; configs in {exported.out}/frameworks/")


def _why(bench, target, scheme, err) -> str:
    """Why no recipe of the target's form fits, with what its one recipe measures when it can run at all."""
    student = bench.student
    blocked = scheme_blockers(student.quantizable, Scheme.from_name(scheme))
    if target.form == "all" and blocked:
        g, why = next(iter(blocked.items()))
        return (
            f"none: {scheme} cannot take {len(blocked)} of {len(student.groups())} groups ({why}); "
            "the engine refuses the model"
        )
    if target.form == "all":
        m = measure_scheme(bench, scheme)["kl_q_p"]
        return f"none at this budget: every Linear in {scheme} measures {m:.4g}"
    if target.form == "none":
        m = measure_scheme(bench, units=[], kv=KVCacheScheme(scale="unit"))["kl_q_p"]
        return f"none at this budget: its FP8 KV cache (scales 1.0) alone measures {m:.4g}"
    return f"none: {err}"


if __name__ == "__main__":
    main()
