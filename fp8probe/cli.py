"""fp8probe command line: a thin layer that parses arguments and calls the library.

Bad input -> one line on stderr starting with "fp8probe: error:", exit code 2, no half-written output.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path

from . import __version__
from .errors import FP8ProbeError

log = logging.getLogger("fp8probe")

EPILOG_SWEEP = """examples:
  fp8probe sweep --out runs/smollm2                 # the embedded student, built-in prompts
  fp8probe sweep ./Qwen3-1.7B --out runs/qwen3 --num-prompts 32 --max-new-tokens 128
  fp8probe sweep --out runs/smollm2 --resume        # continue a killed sweep
  fp8probe sweep --rollouts runs/smollm2 --scheme FP8_BLOCK --granularity group --out runs/block
"""

EPILOG_RECIPE = """examples:
  fp8probe recipe runs/smollm2 --budget 0.01 --out runs/recipe-0.01
  fp8probe recipe runs/smollm2 --budget 1e-3 --metric k3 --keep-first 1 --keep-last 1 --out runs/r
"""

EPILOG_EXPORT = """examples:
  fp8probe export --recipe runs/recipe-0.01/recipe.yaml --out ckpt/smollm2-fp8
  vllm serve ckpt/smollm2-fp8 --config ckpt/smollm2-fp8/vllm.yaml
"""

EPILOG_CAPACITY = """examples:
  fp8probe capacity ./Qwen3-8B/config.json --gpu H100 --max-model-len 32768
  fp8probe capacity --recipe runs/recipe/recipe.yaml --kv-cache-memory 1073741824 --block-size 128
  fp8probe capacity ./Llama-3.1-70B --tensor-parallel-size 4 --gpu H200 --out runs/cap --plot
"""

EPILOG_MEASURE = """examples:
  fp8probe measure --out runs/whole                 # whole-model FP8_DYNAMIC on the embedded student
  fp8probe measure --rollouts runs/smollm2 --kv-cache-dtype fp8 --out runs/whole_kv
"""


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="HF directory, model id in the local HF cache, .gguf file; default: the embedded "
                        "SmolLM2-135M-Instruct")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--dtype", default="float32", help="compute dtype (default: float32; bf16 is slow on CPU)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code (off by default)")


def _add_rollout_args(p: argparse.ArgumentParser, default_prompts: int, default_tokens: int) -> None:
    p.add_argument("--prompts", help="prompts file: text (one per line) or JSONL with a 'prompt' field")
    p.add_argument("--num-prompts", type=int, default=default_prompts,
                   help=f"use the first N prompts (default: {default_prompts})")
    p.add_argument("--max-new-tokens", type=int, default=default_tokens,
                   help=f"response length cap (default: {default_tokens})")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward (default: 8)")
    p.add_argument("--rollouts", help="reuse rollouts saved in this directory instead of sampling new ones")


def _add_run_args(p: argparse.ArgumentParser, scheme: bool = True) -> None:
    """What every command that samples or reuses rollouts takes: model, rollouts, --out (and --scheme)."""
    _add_model_args(p)
    _add_rollout_args(p, default_prompts=16, default_tokens=48)
    p.add_argument("--out", required=True, help="output directory")
    if scheme:
        p.add_argument("--scheme", default="FP8_DYNAMIC", help="FP8, FP8_DYNAMIC or FP8_BLOCK (default: FP8_DYNAMIC)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fp8probe", description="Per-layer FP8 sensitivity and mismatch-budgeted "
                                 "FP8 recipes for RL / on-policy-distillation students.")
    ap.add_argument("--version", action="version", version=f"fp8probe {__version__}")
    verb = ap.add_mutually_exclusive_group()
    verb.add_argument("-q", "--quiet", action="store_true", help="only warnings and the final summary")
    verb.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("sweep", help="quantize one unit at a time, score the mismatch (the main job)",
                       epilog=EPILOG_SWEEP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_args(p)
    p.add_argument("--granularity", default="unit", choices=["unit", "group"],
                   help="one row per Linear (unit) or per fused group as vLLM loads it (group)")
    p.add_argument("--no-kv", action="store_true", help="skip the per-layer FP8 KV-cache rows")
    p.add_argument("--kv-cache-dtype", default="fp8", help="fp8 (e4m3) or fp8_e5m2 for the KV rows (default: fp8)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep in --out")

    p = sub.add_parser("measure", help="whole-model mismatch of one scheme (and FP8 KV) on the rollouts",
                       epilog=EPILOG_MEASURE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_args(p)
    p.add_argument("--kv-cache-dtype", default=None, help="also put the KV cache in fp8 / fp8_e5m2")

    p = sub.add_parser("rollouts", help="sample the student's own rollouts and save them")
    _add_run_args(p, scheme=False)

    p = sub.add_parser("recipe", help="pick the FP8 recipe that saves the most under a mismatch budget",
                       epilog=EPILOG_RECIPE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", help="a directory written by `fp8probe sweep`")
    p.add_argument("--budget", type=float, required=True, help="largest allowed measured mismatch of the recipe")
    p.add_argument("--metric", default="kl_q_p", help="sensitivity column the budget bounds (default: kl_q_p)")
    p.add_argument("--out", required=True, help="output directory for recipe.yaml and recipe.json")
    p.add_argument("--kv-cache-scheme", choices=["fp8"], help="also put the KV cache in FP8 (counts in the budget)")
    p.add_argument("--keep-first", type=int, default=0, help="keep the first N blocks in BF16")
    p.add_argument("--keep-last", type=int, default=0, help="keep the last N blocks in BF16")
    p.add_argument("--keep", nargs="*", default=[], help="units or groups to keep in BF16")
    p.add_argument("--force", nargs="*", default=[], help="units or groups to put in FP8 regardless")
    p.add_argument("--device", default="cpu")
    p.add_argument("--trust-remote-code", action="store_true")

    p = sub.add_parser("export", help="apply a recipe with llm-compressor; write a checkpoint vLLM loads",
                       epilog=EPILOG_EXPORT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None, help="HF directory or id; default: the embedded student")
    p.add_argument("--recipe", required=True, help="recipe.yaml")
    p.add_argument("--out", required=True, help="checkpoint directory (must not exist or be empty)")
    p.add_argument("--rollouts", help="calibration data for static input scales / a kv_cache_scheme (a sweep dir)")
    p.add_argument("--max-model-len", type=int, help="written into vllm.yaml / vllm_args.json")
    p.add_argument("--trust-remote-code", action="store_true")

    p = sub.add_parser("capacity", help="KV-cache tokens and concurrency, BF16 vs FP8, as vLLM accounts them",
                       epilog=EPILOG_CAPACITY, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None,
                   help="HF directory or id, .gguf, a bare config.json (or a directory holding only one); "
                        "default: the embedded student")
    p.add_argument("--recipe", help="recipe.yaml written by `fp8probe recipe` (default: every unit in --scheme)")
    p.add_argument("--scheme", default="FP8_DYNAMIC", help="whole-model scheme when no --recipe (default: FP8_DYNAMIC)")
    p.add_argument("--kv-cache-dtype", default="fp8", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
                   help="the candidate's KV-cache dtype (default: fp8; the baseline is always auto)")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", default="H100", help="GPU preset: H100, H200, A100-40GB, A100-80GB, L40S, B200, RTX4090")
    gpu.add_argument("--gpu-memory", type=float, help="GPU memory in GiB (instead of --gpu)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-memory", type=int, help="KV-cache bytes per GPU, as vLLM's --kv-cache-memory "
                   "(skips the memory estimate)")
    p.add_argument("--max-model-len", type=int, help="default: the config's max_position_embeddings")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16, help="16 on GPUs, 128 on vLLM's CPU backend")
    p.add_argument("--reserve-gib", type=float, help="activation + non-torch memory to set aside (default: estimate)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                   help="allocate sliding-window layers as full attention, as vLLM does with this flag")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--out", help="write DIR/capacity.json")
    p.add_argument("--plot", action="store_true", help="with --out, also DIR/capacity.png")

    p = sub.add_parser("units", help="list the quantizable units and their fused groups")
    _add_model_args(p)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command is None:
        ap.print_help()
        return 2
    _setup_logging(args)
    try:
        return {"sweep": cmd_sweep, "measure": cmd_measure, "rollouts": cmd_rollouts, "units": cmd_units,
                "capacity": cmd_capacity, "recipe": cmd_recipe, "export": cmd_export}[
            args.command](args)
    except FP8ProbeError as e:
        print(f"fp8probe: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fp8probe: interrupted; rerun with --resume to continue", file=sys.stderr)
        return 130


def _setup_logging(args) -> None:
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    args.progress = not args.quiet
    if not args.verbose:
        import warnings

        warnings.filterwarnings("ignore")
        try:
            from transformers.utils import logging as tlog

            tlog.set_verbosity_error()
            tlog.disable_progress_bar()
        except ImportError:
            pass


# ---------------------------------------------------------------------------------------------------
# shared steps


def _validate_common(args) -> None:
    """Check everything that can be checked before loading a model, so bad input fails in a second."""
    from ._files import check_writable
    from .fp8 import KVCacheScheme, Scheme
    from .rollouts import read_prompts
    from .student import resolve_source

    if getattr(args, "scheme", None):
        Scheme.from_name(args.scheme)
    if getattr(args, "kv_cache_dtype", None):
        KVCacheScheme.from_name(args.kv_cache_dtype)
    if getattr(args, "prompts", None):
        read_prompts(args.prompts)
    if getattr(args, "rollouts", None):
        from .rollouts import load_rollouts

        load_rollouts(args.rollouts)
    if getattr(args, "num_prompts", 1) is not None and getattr(args, "num_prompts", 1) < 1:
        raise FP8ProbeError("--num-prompts must be at least 1")
    if getattr(args, "max_new_tokens", 1) < 1:
        raise FP8ProbeError("--max-new-tokens must be at least 1")
    if getattr(args, "batch_size", 1) < 1:
        raise FP8ProbeError("--batch-size must be at least 1")
    if args.model is not None:
        resolve_source(args.model)  # a missing path or a broken GGUF fails here
    if getattr(args, "out", None):
        check_writable(args.out)


def _load(args):
    from .student import load_student

    t = time.perf_counter()
    log.info("loading %s", args.model or "the embedded student (smollm2-135m)")
    s = load_student(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    return s, time.perf_counter() - t


def _rollouts(args, student, out: Path | None, reuse_from: Path | None = None):
    from .rollouts import load_rollouts, make_rollouts, save_rollouts

    t = time.perf_counter()
    src = args.rollouts or (reuse_from if reuse_from and (reuse_from / "rollouts.json").exists() else None)
    if src:
        r = load_rollouts(src)
        log.info("reusing %d rollouts (%d response tokens) from %s", r.num_sequences, r.num_response_tokens, src)
    else:
        r = make_rollouts(student, prompts=args.prompts, num_prompts=args.num_prompts,
                          max_new_tokens=args.max_new_tokens, seed=args.seed, temperature=args.temperature,
                          batch_size=args.batch_size, progress=args.progress)
        log.info("sampled %d rollouts, %d response tokens", r.num_sequences, r.num_response_tokens)
    if out is not None and Path(src or "") != out:
        save_rollouts(r, out)
    return r, time.perf_counter() - t


def _versions() -> dict:
    import torch
    import transformers

    return {"fp8probe": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


# ---------------------------------------------------------------------------------------------------
# commands


def cmd_sweep(args) -> int:
    from ._files import atomic_write_json, atomic_write_text, output_dir
    from .sweep import PARTIAL, PARTIAL_SETTINGS, sweep

    _validate_common(args)
    out = Path(args.out)
    if not args.resume and (out / PARTIAL).exists():
        raise FP8ProbeError(f"{out} holds an unfinished sweep; pass --resume to continue it, or choose another --out")
    t0 = time.perf_counter()
    with output_dir(out, keep=("rollouts.safetensors", "rollouts.json")) as out:
        student, t_load = _load(args)
        rollouts, t_roll = _rollouts(args, student, out, reuse_from=out if args.resume else None)
        log.info("reference pass and sweep (%s, %s granularity%s)", args.scheme.upper(), args.granularity,
                 "" if args.no_kv else ", KV rows")
        t = time.perf_counter()
        df = sweep(student, rollouts, scheme=args.scheme, granularity=args.granularity, include_kv=not args.no_kv,
                   kv=args.kv_cache_dtype, batch_size=args.batch_size, progress=args.progress, out_dir=out,
                   resume=args.resume)
        t_sweep = time.perf_counter() - t
        atomic_write_text(out / "sensitivity.csv", df.to_csv(index=False, float_format="%.17g"))
        run = {
            "schema_version": 1,
            "command": "sweep",
            "model": student.name,
            "model_path": student.path,
            "model_type": student.model_type,
            "scheme": args.scheme.upper(),
            "granularity": args.granularity,
            "include_kv": not args.no_kv,
            "kv_cache_dtype": args.kv_cache_dtype,
            "seed": rollouts.meta.get("seed"),
            "device": args.device,
            "dtype": args.dtype,
            "batch_size": args.batch_size,
            "num_sequences": rollouts.num_sequences,
            "num_tokens": int(rollouts.attention_mask.sum()),
            "num_response_tokens": rollouts.num_response_tokens,
            "rows": len(df),
            "seconds": {"load": round(t_load, 3), "rollouts": round(t_roll, 3),
                        "reference": round(df.attrs.get("reference_seconds", 0.0), 3),
                        "sweep": round(t_sweep, 3), "total": round(time.perf_counter() - t0, 3)},
            "versions": _versions(),
        }
        atomic_write_json(out / "run.json", run)
        for f in (PARTIAL, PARTIAL_SETTINGS):
            (out / f).unlink(missing_ok=True)
    _print_sweep_summary(df, out, time.perf_counter() - t0)
    return 0


def _print_sweep_summary(df, out: Path, seconds: float) -> None:
    units = df[df["kind"] != "model"].sort_values("kl_q_p", ascending=False).head(10)
    cols = ["unit", "kind", "kl_q_p", "k3", "top1_agree", "sqnr_db"]
    print("\nten most sensitive rows (mean KL(q||p) per response token):")
    print(units[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    whole = df[df["kind"] == "model"].set_index("unit")
    for name in ("model.fp8_all", "model.fp8_all_kv"):
        if name in whole.index:
            r = whole.loc[name]
            print(f"{name}: kl_q_p={r.kl_q_p:.3g} k3={r.k3:.3g} top1_agree={r.top1_agree:.4f} "
                  f"token_mult_prob_error={r.token_mult_prob_error:.5f}")
    print(f"sweep: {len(df)} rows in {seconds:.0f} s -> {out / 'sensitivity.csv'}")


def cmd_measure(args) -> int:
    from ._files import atomic_write_json, output_dir
    from .measure import measure

    _validate_common(args)
    t0 = time.perf_counter()
    with output_dir(args.out) as out:
        student, _ = _load(args)
        rollouts, _ = _rollouts(args, student, out)
        metrics = measure(student, rollouts, scheme=args.scheme, kv=args.kv_cache_dtype, batch_size=args.batch_size)
        report = {"schema_version": 1, "command": "measure", "model": student.name, "scheme": args.scheme.upper(),
                  "kv_cache_dtype": args.kv_cache_dtype, "num_sequences": rollouts.num_sequences,
                  "num_response_tokens": rollouts.num_response_tokens, "metrics": metrics,
                  "seconds": round(time.perf_counter() - t0, 3), "versions": _versions()}
        atomic_write_json(out / "mismatch.json", report)
    what = args.scheme.upper() + (f" + {args.kv_cache_dtype} KV cache" if args.kv_cache_dtype else "")
    print(f"\nwhole-model {what} vs reference on {rollouts.num_response_tokens} response tokens:")
    for k, v in metrics.items():
        print(f"  {k:<22} {v:.6g}")
    print(f"measure: {time.perf_counter() - t0:.0f} s -> {Path(args.out) / 'mismatch.json'}")
    return 0


def cmd_rollouts(args) -> int:
    from ._files import output_dir

    _validate_common(args)
    with output_dir(args.out) as out:
        student, _ = _load(args)
        r, secs = _rollouts(args, student, out)
    print(f"rollouts: {r.num_sequences} sequences, {r.num_response_tokens} response tokens in {secs:.0f} s "
          f"-> {Path(args.out)}")
    return 0


def cmd_recipe(args) -> int:
    from ._files import check_writable, output_dir
    from .recipe import make_recipe
    from .rollouts import load_rollouts
    from .student import load_student

    sweep_dir = Path(args.sweep_dir)
    run_file, table = sweep_dir / "run.json", sweep_dir / "sensitivity.csv"
    if not run_file.is_file() or not table.is_file():
        raise FP8ProbeError(f"{sweep_dir} is not a finished sweep (no run.json / sensitivity.csv); run `fp8probe sweep`")
    run = json.loads(run_file.read_text())
    rollouts = load_rollouts(sweep_dir)
    check_writable(args.out)
    t0 = time.perf_counter()
    student = load_student(None if run["model"] == "smollm2-135m" else run["model_path"], device=args.device,
                           dtype=run.get("dtype", "float32"), trust_remote_code=args.trust_remote_code)
    recipe = make_recipe(table, args.budget, student, rollouts, scheme=run["scheme"], metric=args.metric,
                         kv_cache=args.kv_cache_scheme, keep_first=args.keep_first, keep_last=args.keep_last,
                         keep=args.keep, force=args.force, batch_size=run.get("batch_size", 8),
                         sweep_dir=str(sweep_dir.resolve()))
    with output_dir(args.out) as out:
        recipe.write(out)
    total = len(recipe.quantized) + len(recipe.kept)
    print(f"recipe: {len(recipe.quantized)}/{total} fused groups in {recipe.scheme}"
          f"{' + FP8 KV cache' if recipe.kv_cache else ''}; {args.metric} predicted {recipe.predicted:.4g}, "
          f"measured {recipe.measured:.4g} <= budget {args.budget}; {recipe.bytes_saved / 2**20:.1f} MiB saved; "
          f"{len(recipe.search)} measured passes in {time.perf_counter() - t0:.0f} s -> {Path(args.out) / 'recipe.yaml'}")
    return 0


def cmd_export(args) -> int:
    from .export import export
    from .rollouts import load_rollouts

    rollouts = load_rollouts(args.rollouts) if args.rollouts else None
    t0 = time.perf_counter()
    out = export(args.model, args.recipe, args.out, rollouts=rollouts, max_model_len=args.max_model_len,
                 trust_remote_code=args.trust_remote_code)
    print(f"export: compressed-tensors checkpoint in {time.perf_counter() - t0:.0f} s -> {out} "
          f"(vllm serve {out} --config {out / 'vllm.yaml'})")
    return 0


def cmd_capacity(args) -> int:
    from ._files import atomic_write_json, check_writable, output_dir
    from .capacity import GiB, Precision, capacity, load_config_only, meta_model
    from .fp8 import Scheme

    if args.out:
        check_writable(args.out)
    if args.plot and not args.out:
        raise FP8ProbeError("--plot needs --out DIR")
    cfg = load_config_only(args.model, args.trust_remote_code)
    if args.recipe:
        from .recipe import read_recipe_yaml

        precision = read_recipe_yaml(args.recipe).precision(meta_model(cfg))
    else:
        from .student import list_units

        precision = Precision(Scheme.from_name(args.scheme),
                              frozenset(u.name for u in list_units(meta_model(cfg)) if u.quantizable),
                              Scheme.from_name(args.scheme).static_input)
    rep = capacity(cfg, precision, kv_cache_dtype=args.kv_cache_dtype, gpu=args.gpu, gpu_memory_gib=args.gpu_memory,
                   gpu_memory_utilization=args.gpu_memory_utilization, kv_cache_memory=args.kv_cache_memory,
                   max_model_len=args.max_model_len, tensor_parallel_size=args.tensor_parallel_size,
                   block_size=args.block_size, reserve_bytes=None if args.reserve_gib is None else
                   int(args.reserve_gib * GiB), max_num_batched_tokens=args.max_num_batched_tokens,
                   max_num_seqs=args.max_num_seqs, hybrid=not args.disable_hybrid_kv_cache_manager)
    rep["model"] = args.model or "smollm2-135m"
    rep["recipe"] = args.recipe
    print(format_capacity(rep))
    if args.out:
        with output_dir(args.out) as out:
            atomic_write_json(out / "capacity.json", rep)
            if args.plot:
                from .plots import capacity_bars

                capacity_bars(rep, out / "capacity.png")
        print(f"capacity: -> {Path(args.out) / 'capacity.json'}")
    return 0


def format_capacity(rep: dict) -> str:
    from .capacity import GiB

    b, c = rep["baseline"], rep["candidate"]
    cand = f"{c['scheme'] or 'BF16'} ({c['fp8_units']} units) + {c['kv_cache_dtype']} KV"
    where = rep["gpu"] or "--kv-cache-memory"
    lines = [f"{rep['model_type']}, max_model_len {rep['max_model_len']:,}, block size {rep['block_size']}, "
             f"TP {rep['tensor_parallel_size']}, {where}",
             f"{'':<24}{'BF16 + auto KV':>20}{cand:>40}{'ratio':>9}"]

    def row(name, key, fmt, ratio=False):
        r = f"{c[key] / b[key]:>8.2f}x" if ratio and b[key] else ""
        lines.append(f"{name:<24}{fmt(b[key]):>20}{fmt(c[key]):>40}{r:>9}")

    row("weights per GPU", "weight_bytes", lambda v: f"{v / GiB:.2f} GiB")
    row("KV bytes per token", "kv_bytes_per_token", lambda v: f"{v:,}")
    row("KV memory", "kv_memory_bytes", lambda v: f"{v / GiB:.2f} GiB")
    row("KV blocks", "num_blocks", lambda v: f"{v:,}")
    row("KV tokens", "kv_tokens", lambda v: f"{v:,}", ratio=True)
    row("max concurrency", "max_concurrency", lambda v: f"{v:.2f}x", ratio=True)
    return "\n".join(lines)


def cmd_units(args) -> int:
    _validate_common(args)
    student, _ = _load(args)
    for u in student.units:
        flag = "" if u.quantizable else "  (kept BF16)"
        print(f"{u.name:<48} {u.kind:<8} block {u.block:>3}  {u.params:>12,}  group {u.group}{flag}")
    q = student.quantizable
    print(f"units: {len(q)} quantizable in {len(student.groups())} fused groups, "
          f"{sum(u.params for u in q):,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
