"""fp8probe command line: a thin layer that parses arguments and calls the library.

Whatever goes wrong reaches the user as one line on stderr, `fp8probe: error: ...`, that says what to do,
with the exit codes of errors.py: 2 for bad input, a missing extra or a refusing environment (full disk,
no permission), 1 for a bug in fp8probe, 130 when interrupted. The traceback only with --verbose. Output
is validated before anything is created, and a failed command leaves no half-written output.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import math
import signal
import sys
import time
import traceback
from pathlib import Path

# only modules that import no torch: `fp8probe --help` stays instant; each command imports what it uses
from .. import __version__
from ..core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_REJECT, EXIT_USAGE, FP8ProbeError, one_line
from ..core.metrics import METRICS
from ..sweeps.files import METHODS
from ..deploy.frameworks import TARGETS, recipe_form
from ..recipe.forms import FORMS
from ..core.schemes import KV_CACHE_DTYPES, KV_CACHE_SCHEMES, SCHEMES
from ..deploy.serving import KV_DTYPE_BYTES
from ..deploy.serving import GPUS

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
  fp8probe export --recipe runs/r-*/recipe.yaml --target all --out runs/rollout-configs

targets (what each rollout framework can apply; its file under OUT/frameworks/):
""" + "\n".join(f"  {t.name:<12} {t.form:<10} {t.how}" for t in TARGETS.values()) + "\n"

EPILOG_CAPACITY = """examples:
  fp8probe capacity ./Qwen3-8B/config.json --gpu H100 --max-model-len 32768
  fp8probe capacity --recipe runs/recipe/recipe.yaml --kv-cache-memory 1073741824 --block-size 128
  fp8probe capacity ./Llama-3.1-70B --tensor-parallel-size 4 --gpu H200 --out runs/cap --plot
"""

EPILOG_LADDER = """examples:
  fp8probe ladder --out runs/ladder --recipe runs/recipe/recipe.yaml --kv-cache-dtype fp8 --combine
  fp8probe ladder --rollouts runs/smollm2 --stale ckpt/step-100 ckpt/step-200 --out runs/stale
"""

EPILOG_CHECK = """examples:
  fp8probe check --budget budget.json --recipe runs/recipe/recipe.yaml --kv-cache-dtype fp8 --out runs/check
  fp8probe check --budget 1e-3 --metric k3 --stale ckpt/step-99 --rollouts runs/smollm2 --out runs/check
  fp8probe check --budget budget.json --recipe runs/recipe/recipe.yaml --engine vllm-cuda --out runs/check_cuda
"""

EPILOG_BUDGET = """examples:
  fp8probe budget runs.csv --out runs/budget --tolerance 0.01
"""

EPILOG_CALIBRATE = """examples:
  fp8probe calibrate --out runs/calibrate            # the demo pair: embedded SmolLM2 teaching its pruned copy
  fp8probe calibrate --out runs/calibrate --resume   # continue a killed calibration
  fp8probe calibrate --teacher ./Qwen3-8B --student ./Qwen3-1.7B --levels 0 0.003 0.01 fp8 kv stale:2 \\
      --out runs/cal --mark runs/recipe/recipe.json runs/ladder/ladder.csv

levels: """ + "a number: weight noise sigma (x each tensor's std; 0: no mismatch); fp8[:SCHEME]: every unit in FP8 "\
    "(default FP8_DYNAMIC); kv[:DTYPE]: FP8 KV cache, scale 1.0; stale:K: rollouts from the weights of K updates ago\n"

EPILOG_MEASURE = """examples:
  fp8probe measure --out runs/whole                 # whole-model FP8_DYNAMIC as vLLM runs it on a Hopper GPU
  fp8probe measure --rollouts runs/smollm2 --kv-cache-dtype fp8 --out runs/whole_kv
  fp8probe measure --rollouts runs/smollm2 --engine sim --out runs/whole_sim   # the sweep's simulation
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that points at --help, like every other error."""

    def error(self, message: str):
        print(f"fp8probe: error: {message}; see `{self.prog} --help`", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _number(kind, low=None, low_open=False, high=None, what=""):
    """An argparse type: a finite int/float within bounds, with a message that says what is allowed."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if kind is float and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if low is not None and (v <= low if low_open else v < low):
            raise argparse.ArgumentTypeError(f"{text} must be {'>' if low_open else '>='} {low}{what}")
        if high is not None and v > high:
            raise argparse.ArgumentTypeError(f"{text} must be <= {high}{what}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


POSITIVE_INT = _number(int, low=1)
NONNEG_INT = _number(int, low=0)
NONNEG_FLOAT = _number(float, low=0.0)
POSITIVE_FLOAT = _number(float, low=0.0, low_open=True)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="HF directory, model id in the local HF cache, .gguf file; default: the embedded "
                        "SmolLM2-135M-Instruct")
    p.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:N, or auto (the model "
                   "spread over this machine's GPUs, Accelerate's device_map)")
    p.add_argument("--dtype", default="float32", help="compute dtype (default: float32; bf16 is slow on CPU)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code (off by default)")
    _add_pickle_arg(p)


def _add_pickle_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-pickle", action="store_true",
                   help="load .bin/.pt weights with torch.load(weights_only=True); by default only safetensors "
                        "and GGUF are read (never unpickled)")


def _add_rollout_args(p: argparse.ArgumentParser, default_prompts: int, default_tokens: int) -> None:
    p.add_argument("--prompts", help="prompts file: text (one per line) or JSONL with a 'prompt' field")
    p.add_argument("--num-prompts", type=POSITIVE_INT, default=default_prompts,
                   help=f"use the first N prompts (default: {default_prompts})")
    p.add_argument("--max-new-tokens", type=POSITIVE_INT, default=default_tokens,
                   help=f"response length cap (default: {default_tokens})")
    p.add_argument("--seed", type=NONNEG_INT, default=0, help="sampling seed (default: 0)")
    p.add_argument("--temperature", type=NONNEG_FLOAT, default=1.0,
                   help="sampling temperature; 0 is greedy (default: 1.0)")
    p.add_argument("--batch-size", type=POSITIVE_INT, default=8, help="sequences per forward (default: 8)")
    p.add_argument("--rollouts", help="reuse rollouts saved in this directory instead of sampling new ones")


def _add_run_args(p: argparse.ArgumentParser, scheme: bool = True) -> None:
    """What every command that samples or reuses rollouts takes: model, rollouts, --out (and --scheme)."""
    _add_model_args(p)
    _add_rollout_args(p, default_prompts=16, default_tokens=48)
    p.add_argument("--out", required=True, help="output directory")
    if scheme:
        p.add_argument("--scheme", default="FP8_DYNAMIC", help=f"{_schemes()} (default: FP8_DYNAMIC)")


def _schemes() -> str:
    return ", ".join(SCHEMES)


def _kv_dtypes() -> str:
    return ", ".join(KV_CACHE_DTYPES)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="fp8probe", description="Per-layer FP8 sensitivity and mismatch-budgeted "
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
    p.add_argument("--kv-cache-dtype", default="fp8", help=f"KV rows in {_kv_dtypes()} (default: fp8 = e4m3)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep in --out")
    p.add_argument("--method", default="exact", choices=list(METHODS),
                   help="exact: measure every row (default); fisher: estimate every row from one pass with backward "
                        "(fast); auto: estimate, then measure the --top-k highest, --controls others and the "
                        "whole model exactly")
    p.add_argument("--top-k", type=NONNEG_INT, default=24, help="--method auto: rows measured exactly (default: 24)")
    p.add_argument("--controls", type=NONNEG_INT, default=8,
                   help="--method auto: random other rows measured exactly, as a check (default: 8)")
    p.add_argument("--fisher-samples", type=POSITIVE_INT, default=2,  # fisher.DEFAULT_SAMPLES
                   help="label draws per position for the estimate, one backward each (default: 2)")
    p.add_argument("--compare", metavar="EXACT_DIR",
                   help="an exact sweep of the same rollouts: write agreement.json (automatic with --rollouts of one)")
    p.add_argument("--agreement-budget", type=NONNEG_FLOAT, metavar="X",
                   help="kl_q_p budget of the agreement's recipes (default: half the whole-model FP8 mismatch)")
    p.add_argument("--workers", type=POSITIVE_INT, default=1,
                   help="Ray workers measuring the rows, one replica of the student each (its own GPU with "
                        "--device cuda, else a share of the CPU threads); default 1: this process alone. Needs "
                        "pip install 'fp8probe[ray]'")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="join this Ray cluster (left running) instead of starting a local instance")
    p.add_argument("--threads-per-worker", type=POSITIVE_INT, metavar="T",
                   help="CPU threads per worker (default: this machine's cores / --workers)")

    p = sub.add_parser("measure", help="whole-model mismatch of one scheme (and FP8 KV) on the rollouts",
                       epilog=EPILOG_MEASURE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_args(p)
    p.add_argument("--kv-cache-dtype", default=None, help=f"also put the KV cache in FP8: {_kv_dtypes()}")
    p.add_argument("--engine", default="vllm-cuda", choices=["vllm-cuda", "vllm-cpu", "sim"],
                   help="vllm-cuda (default: what rollouts run on): the whole model as vLLM 0.32 runs it on a "
                        "Hopper GPU (bf16, its FP8 GEMMs, FlashAttention 3's FP8 KV cache with its FP8 query); "
                        "vllm-cpu: as vLLM-CPU runs it (FP8_DYNAMIC, FP8; no FP8 KV cache); sim: FP8 units "
                        "inside the reference-dtype model, as the sweep measures")

    p = sub.add_parser("rollouts", help="sample the student's own rollouts and save them")
    _add_run_args(p, scheme=False)

    p = sub.add_parser("recipe", help="pick the FP8 recipe that saves the most under a mismatch budget",
                       epilog=EPILOG_RECIPE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", help="a directory written by `fp8probe sweep`")
    goal = p.add_mutually_exclusive_group(required=True)
    goal.add_argument("--budget", type=NONNEG_FLOAT, help="largest allowed measured mismatch of the recipe "
                      "(the recipe saves the most bytes within it)")
    goal.add_argument("--min-bytes-saved", type=NONNEG_INT, metavar="BYTES",
                      help="instead of a budget: save at least this many weight bytes, with the least mismatch")
    goal.add_argument("--effective-bits", type=_number(float, low=8.0, high=16.0), metavar="B",
                      help="instead of a budget: at most B bits per weight of every Linear, lm_head included (BF16 16, "
                           "FP8 8; as ModelOpt's auto_quantize counts them), with the least mismatch")
    goal.add_argument("--fp8-share", type=_number(float, low=0.0, high=1.0), metavar="F",
                      help="instead of a budget: at least this fraction of every Linear's weights in FP8 (lm_head, "
                           "which stays BF16, included)")
    p.add_argument("--refine", type=NONNEG_INT, default=8, metavar="PASSES",  # selection.DEFAULT_REFINE_PASSES
                   help="measured passes that refine a free recipe with interactions (default: 8; 0: off)")
    p.add_argument("--metric", default="kl_q_p", choices=METRICS, metavar="METRIC",
                   help="the metric the budget bounds (default: kl_q_p); one of " + ", ".join(METRICS))
    p.add_argument("--out", required=True, help="output directory for recipe.yaml and recipe.json")
    p.add_argument("--kv-cache-scheme", choices=list(KV_CACHE_SCHEMES),
                   help="also put the KV cache in FP8 (counts in the budget)")
    p.add_argument("--keep-first", type=NONNEG_INT, default=0, help="keep the first N blocks in BF16")
    p.add_argument("--keep-last", type=NONNEG_INT, default=0, help="keep the last N blocks in BF16")
    p.add_argument("--keep", nargs="*", default=[], help="units or groups to keep in BF16")
    p.add_argument("--force", nargs="*", default=[], help="units or groups to put in FP8 regardless")
    p.add_argument("--form", choices=list(FORMS), default=None,
                   help="the recipes searched: free (default), keywords, first-last (first/last blocks BF16), "
                        "all (every Linear FP8), none (FP8 KV cache only)")
    p.add_argument("--target", choices=list(TARGETS), default=None,
                   help="a rollout framework: its form, FP8 scheme and KV-cache scales (see `fp8probe export`)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--trust-remote-code", action="store_true")
    _add_pickle_arg(p)

    p = sub.add_parser("export", help="write a vLLM checkpoint and each RL framework's rollout config for recipes",
                       epilog=EPILOG_EXPORT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None, help="HF directory or id; default: the embedded student")
    p.add_argument("--recipe", required=True, nargs="+", help="recipe.yaml file(s); each target takes the one "
                   "made for it (`fp8probe recipe --target`), else the first it can apply")
    p.add_argument("--target", nargs="+", default=["vllm"], choices=[*TARGETS, "all"], metavar="TARGET",
                   help=f"where the rollouts run (default: vllm): {', '.join(TARGETS)}, or all")
    p.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    p.add_argument("--rollouts", help="calibration data for static input scales / a kv_cache_scheme (a sweep dir)")
    p.add_argument("--max-model-len", type=POSITIVE_INT, help="written into vllm.yaml / vllm_args.json")
    p.add_argument("--trust-remote-code", action="store_true")
    _add_pickle_arg(p)

    p = sub.add_parser("capacity", help="KV-cache tokens and concurrency, BF16 vs FP8, as vLLM accounts them",
                       epilog=EPILOG_CAPACITY, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None,
                   help="HF directory or id, .gguf, a bare config.json (or a directory holding only one); "
                        "default: the embedded student")
    p.add_argument("--recipe", help="recipe.yaml written by `fp8probe recipe` (default: every unit in --scheme)")
    p.add_argument("--scheme", default="FP8_DYNAMIC", help="whole-model scheme when no --recipe (default: FP8_DYNAMIC)")
    p.add_argument("--kv-cache-dtype", default="fp8", choices=list(KV_DTYPE_BYTES),
                   help="the candidate's KV-cache dtype (default: fp8; the baseline is always auto)")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", default="H100", help=f"GPU preset: {', '.join(GPUS)} (default: H100)")
    gpu.add_argument("--gpu-memory", type=POSITIVE_FLOAT, help="GPU memory in GiB (instead of --gpu)")
    p.add_argument("--gpu-memory-utilization", type=_number(float, low=0.0, low_open=True, high=1.0), default=0.9)
    p.add_argument("--kv-cache-memory", type=POSITIVE_INT, help="KV-cache bytes per GPU, as vLLM's --kv-cache-memory "
                   "(skips the memory estimate)")
    p.add_argument("--max-model-len", type=POSITIVE_INT, help="default: the config's max_position_embeddings")
    p.add_argument("--tensor-parallel-size", type=POSITIVE_INT, default=1)
    p.add_argument("--block-size", type=POSITIVE_INT, default=16, help="16 on GPUs, 128 on vLLM's CPU backend")
    p.add_argument("--reserve-gib", type=NONNEG_FLOAT,
                   help="activation + non-torch memory to set aside (default: estimate)")
    p.add_argument("--max-num-batched-tokens", type=POSITIVE_INT, default=8192)
    p.add_argument("--max-num-seqs", type=POSITIVE_INT, default=256)
    p.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                   help="allocate sliding-window layers as full attention, as vLLM does with this flag")
    p.add_argument("--trust-remote-code", action="store_true")
    _add_pickle_arg(p)
    p.add_argument("--out", help="write DIR/capacity.json")
    p.add_argument("--plot", action="store_true", help="with --out, also DIR/capacity.png")

    p = sub.add_parser("units", help="list the quantizable units and their fused groups")
    _add_model_args(p)

    p = sub.add_parser("ladder", help="every rollout shortcut on one mismatch scale: noise ruler, recipes, FP8 KV, "
                       "stale weights, combinations, prefix shift", epilog=EPILOG_LADDER,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_args(p, scheme=False)
    _add_source_args(p)
    p.add_argument("--noise", nargs="*", type=POSITIVE_FLOAT, default=None,
                   help="relative weight-noise levels σ (x each tensor's std); default: 1e-4 3e-4 1e-3 3e-3 1e-2")
    p.add_argument("--noise-seed", type=NONNEG_INT, default=0)
    p.add_argument("--combine", action="store_true", help="also measure the recipe, KV and stale sources together")
    p.add_argument("--no-prefix-shift", action="store_true", help="skip the prefix-shift columns (faster)")

    p = sub.add_parser("check", help="admit or reject a rollout configuration against a mismatch budget "
                       "(exit 0 admit, 1 reject, 2 error)", epilog=EPILOG_CHECK,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_args(p, scheme=False)
    _add_source_args(p)
    p.add_argument("--budget", required=True, help="a number (on --metric) or a budget.json from `fp8probe budget`")
    p.add_argument("--metric", default="kl_q_p", choices=METRICS, metavar="METRIC",
                   help="the metric a numeric --budget bounds (default: kl_q_p)")

    p = sub.add_parser("budget", help="the mismatch budget from a table of training runs (quality vs mismatch)",
                       epilog=EPILOG_BUDGET, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", help="CSV: mismatch, quality[, metric, seed, higher_is_better], one row per run")
    p.add_argument("--out", required=True, help="output directory for budget.json and budget.png")
    p.add_argument("--tolerance", type=NONNEG_FLOAT, default=0.01,
                   help="largest relative quality loss accepted (default: 0.01 = 1 %%)")
    p.add_argument("--bootstrap", type=NONNEG_INT, default=1000, help="bootstrap resamples for the interval")
    p.add_argument("--seed", type=NONNEG_INT, default=0)

    p = sub.add_parser("calibrate", help="calibrate the mismatch budget with short on-policy distillation runs "
                       "(TRL) at a ladder of rollout mismatch", epilog=EPILOG_CALIBRATE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", default=None, help="the teacher: HF directory, .gguf file, model id in the local HF "
                   "cache; default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--student", default="pruned", help="the student (same tokenizer as the teacher), or pruned[:K]: "
                   "the teacher depth-pruned to every K-th decoder block, initialised from its weights (default: "
                   "pruned, K=2)")
    p.add_argument("--out", required=True, help="run directory (runs/, runs.csv, budget.json, calibration.png)")
    p.add_argument("--levels", nargs="+", default=None, metavar="LEVEL",
                   help="rollout mismatch levels (see below); default: 0 0.003 0.01 0.03 0.1 (weight noise)")
    p.add_argument("--seeds", type=POSITIVE_INT, default=2, help="runs per level (default: 2)")
    p.add_argument("--steps", type=POSITIVE_INT, default=30, help="optimizer steps per run (default: 30)")
    p.add_argument("--batch-size", type=POSITIVE_INT, default=8, help="prompts per step (default: 8)")
    p.add_argument("--max-new-tokens", type=POSITIVE_INT, default=32, help="completion length (default: 32)")
    p.add_argument("--learning-rate", type=POSITIVE_FLOAT, default=2e-5, help="AdamW, constant (default: 2e-5)")
    p.add_argument("--eval-every", type=POSITIVE_INT, default=10, help="held-out evaluation interval (default: 10)")
    p.add_argument("--eval-samples", type=POSITIVE_INT, default=2,
                   help="responses sampled per held-out prompt (default: 2)")
    p.add_argument("--prompts", help="prompts file (text or JSONL); every 5th is held out; default: the built-in 40")
    p.add_argument("--tolerance", type=NONNEG_FLOAT, default=None,
                   help="largest relative rise of the held-out reverse KL accepted (default: how far the "
                        "mismatch-free runs land apart by their seeds alone, at least 0.01)")
    p.add_argument("--mark", nargs="*", default=[], metavar="FILE",
                   help="configurations measured elsewhere to mark on the curve: recipe.json, ladder.csv, "
                        "sensitivity.csv (whole-model rows)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--resume", action="store_true", help="continue a killed calibration in --out")

    p = sub.add_parser("plot", help="every figure a run directory's files allow (sweep, recipes, capacity, ladder)")
    p.add_argument("run_dir", help="a directory written by fp8probe (a sweep, with recipes, capacity or a ladder "
                                   "in it or below it)")
    p.add_argument("--out", help="where the figures go (default: RUN_DIR/plots)")
    p.add_argument("--format", default="png", choices=["png", "svg"], help="image format (default: png)")
    return ap


def _add_source_args(p: argparse.ArgumentParser) -> None:
    """The rollout shortcuts a configuration can combine (ladder and check)."""
    p.add_argument("--recipe", nargs="*", default=[], help="recipe.yaml file(s): FP8 weights (+ their FP8 KV cache)")
    p.add_argument("--kv-cache-dtype", nargs="*", default=[], help=f"FP8 KV cache(s): {_kv_dtypes()}")
    p.add_argument("--stale", nargs="*", default=[], help="other checkpoint(s) of the student as the rollout policy")
    p.add_argument("--teacher", help="a teacher sharing the student's tokenizer: adds the OPD-signal distortion")
    p.add_argument("--engine", default="sim", choices=["sim", "vllm-cuda", "vllm-cpu"],
                   help="sim (default: every shortcut in the reference-dtype model, as recipes and budgets are "
                        "measured); vllm-cuda / vllm-cpu: every figure as vLLM 0.32 computes it (see `measure`)")


def _check_engine(args) -> None:
    """Refuse, before any output, a shortcut the --engine profile does not cover."""
    from ..core.schemes import KVCacheScheme, Scheme
    from ..measurement.engines import engine
    from ..recipe.recipe import read_recipe

    eng = engine(args.engine)
    for path in args.recipe:
        rec = read_recipe(path)
        eng.check(rec.preset, KVCacheScheme() if rec.kv_cache_scheme else None)
    for kv in args.kv_cache_dtype:
        eng.check(Scheme.from_name("FP8_DYNAMIC"), KVCacheScheme.from_name(kv))


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    sub = next((a.choices[args.command] for a in ap._actions if isinstance(a, argparse._SubParsersAction)
                and args.command in a.choices), None)
    args._flags = {a.dest: a.option_strings[0] if a.option_strings else a.dest.upper()
                   for a in (sub._actions if sub else []) if a.dest != "help"}
    if args.command is None:
        ap.print_help()
        return EXIT_USAGE
    _setup_logging(args)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt as e:
        where = getattr(e, "resumable_dir", None)
        tail = (f"finished rows are kept in {where}: rerun the same command with --resume to continue"
                if where else "nothing was written")
        return _fail(args, f"interrupted; {tail}", EXIT_INTERRUPTED, show_traceback=False)
    except FP8ProbeError as e:
        return _fail(args, _with_resume_hint(str(e), e), EXIT_USAGE)
    except OSError as e:
        return _fail(args, _with_resume_hint(_os_error(e), e), EXIT_USAGE)
    except MemoryError as e:
        return _fail(args, _with_resume_hint("out of memory; use a smaller --batch-size, fewer prompts or "
                                             "a machine with more memory", e), EXIT_USAGE)
    except Exception as e:  # a bug: say so, briefly; --verbose has the traceback
        return _fail(args, _with_resume_hint(
            f"internal error ({type(e).__name__}: {one_line(e)}); this is a bug in fp8probe: please report it "
            "with the output of the same command run with --verbose", e),
            EXIT_USAGE if args.command == "check" else EXIT_INTERNAL)  # check's 1 means REJECT
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum, frame):
    raise KeyboardInterrupt  # SIGTERM stops as cleanly as Ctrl-C: resume state kept, the rest removed


def _fail(args, message: str, code: int, show_traceback: bool = True) -> int:
    if show_traceback and getattr(args, "verbose", False):
        traceback.print_exc()
    print(f"fp8probe: error: {as_flags(message, args)}", file=sys.stderr)
    return code


def as_flags(message: str, args) -> str:
    """The library names settings fields (`num_prompts`); on the command line they are flags (--num-prompts)."""
    import re

    flags = getattr(args, "_flags", {})
    return re.sub(r"`(\w+)`", lambda m: flags.get(m.group(1), m.group(0)), message)


def _with_resume_hint(message: str, e: BaseException) -> str:
    where = getattr(e, "resumable_dir", None)
    if where and "--resume" not in message:
        return f"{message}; the rows finished so far are kept in {where}: rerun with --resume once fixed"
    return message


def _os_error(e: OSError) -> str:
    where = f" ({e.filename})" if getattr(e, "filename", None) else ""
    if e.errno == errno.ENOSPC:
        return f"no space left on device{where}; earlier results are intact: free some space and rerun"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"permission denied{where}: {e.strerror}; choose another --out or fix the permissions"
    return f"{e.strerror or e}{where}; check the path and rerun"


def _setup_logging(args) -> None:
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    logging.getLogger("fp8probe").setLevel(level)
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


def _validate(args) -> None:
    """Everything the arguments and the model's config allow is checked before any output exists, so that
    bad input fails in seconds and leaves nothing behind."""
    from ..core.files import check_writable
    from ..model.rollouts import load_rollouts, read_prompts
    from ..core.schemes import KVCacheScheme, Scheme
    from ..model.devices import check_device, parse_dtype
    from ..model.structure import check_scheme, check_supported
    from ..model.student import load_config

    scheme = Scheme.from_name(args.scheme) if getattr(args, "scheme", None) else None
    check_device(args.device)
    parse_dtype(args.dtype)
    kv = getattr(args, "kv_cache_dtype", None)
    for name in (kv if isinstance(kv, list) else [kv] if kv else []):
        KVCacheScheme.from_name(name)
    for path in getattr(args, "recipe", None) or []:
        from ..recipe.recipe import read_recipe

        read_recipe(path)
    for path in [*(getattr(args, "stale", None) or []), *([args.teacher] if getattr(args, "teacher", None) else [])]:
        check_supported(load_config(path, args.trust_remote_code, args.allow_pickle))
    if getattr(args, "prompts", None):
        read_prompts(args.prompts)
    rollouts = load_rollouts(args.rollouts) if getattr(args, "rollouts", None) else None
    if getattr(args, "out", None):
        check_writable(args.out)
    cfg = load_config(args.model, args.trust_remote_code, args.allow_pickle)
    check_supported(cfg)
    if scheme is not None:
        check_scheme(cfg, scheme, partial=args.command == "sweep")
    if rollouts is not None:
        rollouts.check_fits(cfg, args.rollouts)


def _load(args):
    from ..model.student import load_student

    t = time.perf_counter()
    log.info("loading %s", args.model or "the embedded student (smollm2-135m)")
    s = load_student(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code,
                     allow_pickle=args.allow_pickle)
    return s, time.perf_counter() - t


def _rollouts(args, student, out: Path, reuse_from: Path | None = None):
    """The rollouts: --rollouts DIR, the ones a resumed sweep saved, or new ones; saved into `out`."""
    from ..model.rollouts import load_rollouts, make_rollouts, save_rollouts

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
    if Path(src or "") != out:
        save_rollouts(r, out)
    return r, time.perf_counter() - t


# ---------------------------------------------------------------------------------------------------
# commands: parse, call the library, print one summary line


def _exact_run(args):
    """The exact sweep a fast one is compared with: --compare (refused when it measured something else), or
    --rollouts when it names a finished exact sweep of the same settings (else the rollouts are only reused)."""
    from ..recipe.agreement import settings_differ
    from ..sweeps.files import RUN_FILE, read_sweep

    if args.compare:
        return read_sweep(args.compare)
    if args.rollouts and (Path(args.rollouts) / RUN_FILE).exists():
        run = read_sweep(args.rollouts)
        why = settings_differ(run, args.scheme, args.granularity, not args.no_kv, args.kv_cache_dtype)
        if why is None:
            return run
        log.info("not compared with the sweep in %s: %s", args.rollouts, why)
    return None


def _check_memory(args, rollouts) -> None:
    """Refuse a sweep that would not fit in memory, before loading (rollouts None: sized from the arguments, with
    prompts of up to 256 tokens) and again once the rollouts are known."""
    from ..sweeps.memory import check_fits, estimate
    from ..model.rollouts import load_rollouts
    from ..model.student import load_config
    from ..model.devices import parse_dtype

    if rollouts is None and args.rollouts:
        rollouts = load_rollouts(args.rollouts)
    if rollouts is not None:
        n, t, m = rollouts.num_sequences, rollouts.input_ids.shape[1], rollouts.num_response_tokens
    else:
        n, t = args.num_prompts, 256 + args.max_new_tokens
        m = n * args.max_new_tokens
    cfg = load_config(args.model, args.trust_remote_code, args.allow_pickle)
    nbytes = parse_dtype(args.dtype).itemsize
    check_fits(estimate(cfg, nbytes, args.method, args.batch_size, n, t, m), args.device)


def cmd_sweep(args) -> int:
    from ..core.files import atomic_write_json, output_dir
    from ..recipe.agreement import AGREEMENT_FILE, agreement, check_comparable, describe
    from ..sweeps.files import RUN_FILE, check_resume_state, finish_sweep, write_run, write_table
    from ..sweeps.sweep import Method, summary, sweep

    _validate(args)
    cluster = _cluster(args)
    out = Path(args.out)
    check_resume_state(out, args.resume)
    if not args.resume and (out / RUN_FILE).exists():
        raise FP8ProbeError(f"{out} holds a finished sweep already; choose another --out (or delete it first)")
    method = Method(args.method, top_k=args.top_k, controls=args.controls, samples=args.fisher_samples,
                    seed=args.seed)
    exact_run = _exact_run(args) if args.method != "exact" else None
    _check_memory(args, None)
    t0 = time.perf_counter()
    with output_dir(out, keep=("rollouts.safetensors", "rollouts.json")) as out:
        student, t_load = _load(args)
        rollouts, t_roll = _rollouts(args, student, out, reuse_from=out if args.resume else None)
        _check_memory(args, rollouts)
        if exact_run is not None:
            check_comparable(exact_run, args.scheme, args.granularity, not args.no_kv, args.kv_cache_dtype, rollouts)
        log.info("%s (%s, %s granularity%s)", {"exact": "reference pass and sweep", "fisher": "fast estimate",
                                               "auto": "reference pass, fast estimate, exact top rows"}[args.method],
                 args.scheme.upper(), args.granularity, "" if args.no_kv else ", KV rows")
        t = time.perf_counter()
        with _row_workers(args, cluster) as executor:
            df = sweep(student, rollouts, scheme=args.scheme, granularity=args.granularity,
                       include_kv=not args.no_kv, kv=args.kv_cache_dtype, batch_size=args.batch_size,
                       progress=args.progress, out_dir=out, resume=args.resume, method=method,
                       rows_executor=executor)
        t_sweep = time.perf_counter() - t
        agree = None
        if exact_run is not None:
            log.info("agreement with the exact sweep in %s (two recipes, measured)", exact_run.directory)
            agree = agreement(df, exact_run.table, student, rollouts, args.scheme, args.batch_size,
                              budget=args.agreement_budget)
            atomic_write_json(out / AGREEMENT_FILE, {**agree, "exact_sweep": str(exact_run.directory)})
        write_table(out, df)
        write_run(out, {
            "command": "sweep", "model": student.name, "model_path": student.path,
            "model_type": student.model_type, "scheme": args.scheme.upper(), "granularity": args.granularity,
            "include_kv": not args.no_kv, "kv_cache_dtype": args.kv_cache_dtype, "seed": rollouts.meta.get("seed"),
            "method": method.settings(), "exact_rows": int((df["method"] == "exact").sum()),
            "workers": executor.stats if executor is not None else {"workers": 1},
            "device": args.device, "dtype": args.dtype, "batch_size": args.batch_size,
            "num_sequences": rollouts.num_sequences, "num_tokens": int(rollouts.attention_mask.sum()),
            "num_response_tokens": rollouts.num_response_tokens, "rows": len(df),
            "seconds": {"load": round(t_load, 3), "rollouts": round(t_roll, 3),
                        **{k: round(v, 3) for k, v in df.attrs["seconds"].items()},
                        "sweep": round(t_sweep, 3), "total": round(time.perf_counter() - t0, 3)},
        })
        finish_sweep(out)
    print(summary(df))
    if agree is not None:
        print(describe(agree))
    print(f"sweep: {len(df)} rows in {time.perf_counter() - t0:.0f} s -> {out / 'sensitivity.csv'}")
    return 0


def _cluster(args):
    """The Ray workers a sweep asked for (None: this process alone), checked before any output exists."""
    if args.workers == 1 and not args.ray_address:
        if args.threads_per_worker:
            raise FP8ProbeError("--threads-per-worker needs --workers N (N > 1) or --ray-address")
        return None
    from ..sweeps.scaleout import Cluster, check_address, require_ray

    require_ray()
    check_address(args.ray_address)
    if args.device == "auto":
        raise FP8ProbeError("--workers with --device auto: each worker holds its own replica; use --device cuda "
                            "(one GPU per worker)")
    return Cluster(args.workers, args.ray_address, args.threads_per_worker, gpus=args.device.startswith("cuda"))


@contextlib.contextmanager
def _row_workers(args, cluster):
    if cluster is None:
        yield None
        return
    from ..sweeps.scaleout import RayRows, ray_session

    load = {"name_or_path": args.model, "device": "cuda" if cluster.gpus else args.device, "dtype": args.dtype,
            "trust_remote_code": args.trust_remote_code, "allow_pickle": args.allow_pickle}
    log.info("rows measured by %d Ray worker(s)%s", cluster.workers,
             f" on the cluster at {cluster.address}" if cluster.address else
             f" ({cluster.threads_per_worker()} CPU threads each)" if not cluster.gpus else " (one GPU each)")
    with ray_session(cluster):
        executor = RayRows(cluster, load)
        try:
            yield executor
        finally:
            executor.close()


def cmd_measure(args) -> int:
    from ..core.files import atomic_write_json, output_dir
    from ..measurement.measure import measure
    from ..sweeps.files import versions

    _validate(args)
    from ..core.schemes import KVCacheScheme, Scheme
    from ..measurement.engines import engine

    engine(args.engine).check(Scheme.from_name(args.scheme),
                              KVCacheScheme.from_name(args.kv_cache_dtype) if args.kv_cache_dtype else None)
    t0 = time.perf_counter()
    with output_dir(args.out) as out:
        student, _ = _load(args)
        rollouts, _ = _rollouts(args, student, out)
        metrics = measure(student, rollouts, scheme=args.scheme, kv=args.kv_cache_dtype, batch_size=args.batch_size,
                          engine=args.engine)
        atomic_write_json(out / "mismatch.json", {
            "schema_version": 1, "command": "measure", "model": student.name, "scheme": args.scheme.upper(),
            "engine": args.engine, "kv_cache_dtype": args.kv_cache_dtype, "num_sequences": rollouts.num_sequences,
            "num_response_tokens": rollouts.num_response_tokens, "metrics": metrics,
            "seconds": round(time.perf_counter() - t0, 3), "versions": versions()})
    what = args.scheme.upper() + (f" + {args.kv_cache_dtype} KV cache" if args.kv_cache_dtype else "")
    what += "" if args.engine == "sim" else f" as {args.engine} runs it"
    print(f"\nwhole-model {what} vs reference on {rollouts.num_response_tokens} response tokens:")
    for k, v in metrics.items():
        print(f"  {k:<22} {v:.6g}")
    print(f"measure: {time.perf_counter() - t0:.0f} s -> {Path(args.out) / 'mismatch.json'}")
    return 0


def cmd_rollouts(args) -> int:
    from ..core.files import output_dir

    _validate(args)
    with output_dir(args.out) as out:
        student, _ = _load(args)
        r, secs = _rollouts(args, student, out)
    print(f"rollouts: {r.num_sequences} sequences, {r.num_response_tokens} response tokens in {secs:.0f} s "
          f"-> {Path(args.out)}")
    return 0


def cmd_recipe(args) -> int:
    from ..core.files import check_writable, output_dir
    from ..model.rollouts import load_rollouts
    from ..sweeps.files import read_sweep
    from ..recipe.selection import MemoryTarget, make_recipe
    from ..model.student import load_student

    run = read_sweep(args.sweep_dir)
    target = TARGETS[args.target] if args.target else None
    form, scheme, kv_scale = recipe_form(target, args.form, args.kv_cache_scheme, run.run["scheme"], args.sweep_dir)
    rollouts = load_rollouts(args.sweep_dir)
    check_writable(args.out)
    t0 = time.perf_counter()
    student = load_student(run.model_source, device=args.device, dtype=run.run.get("dtype", "float32"),
                           trust_remote_code=args.trust_remote_code, allow_pickle=args.allow_pickle)
    run.check_student(student)
    rollouts.check_fits(student.model.config, f"the rollouts of {args.sweep_dir}")
    memory = None
    for kind in ("min_bytes_saved", "effective_bits", "fp8_share"):
        if getattr(args, kind) is not None:
            memory = MemoryTarget(kind.replace("min_", ""), getattr(args, kind))
    try:
        recipe = make_recipe(run.table, args.budget, student, rollouts, scheme=scheme, metric=args.metric,
                             kv_cache=args.kv_cache_scheme, keep_first=args.keep_first, keep_last=args.keep_last,
                             keep=args.keep, force=args.force, batch_size=run.run["batch_size"],
                             sweep_dir=str(run.directory.resolve()), form=form, kv_scale=kv_scale,
                             target=target.name if target else None, memory=memory, refine_passes=args.refine)
    except FP8ProbeError as e:
        if target is None:
            raise
        raise FP8ProbeError(f"{target.title}: {e}") from e
    with output_dir(args.out) as out:
        recipe.write(out)
    total = len(recipe.quantized) + len(recipe.kept)
    goal = f"<= budget {args.budget}" if args.budget is not None else f"(memory target {memory.kind} {memory.given})"
    print(f"recipe{f' for {target.name}' if target else ''} (form {form}): {len(recipe.quantized)}/{total} fused "
          f"groups in {recipe.scheme}{' + FP8 KV cache' if recipe.kv_cache else ''}; {args.metric} predicted "
          f"{recipe.predicted:.4g}, measured {recipe.measured:.4g} {goal}; {recipe.bytes_saved / 2**20:.1f} MiB saved, "
          f"{recipe.effective_bits:.2f} effective bits; {len(recipe.search)} measured passes in "
          f"{time.perf_counter() - t0:.0f} s -> {Path(args.out) / 'recipe.yaml'}")
    return 0


def cmd_export(args) -> int:
    from ..deploy.export import export
    from ..model.rollouts import load_rollouts

    rollouts = load_rollouts(args.rollouts) if args.rollouts else None
    t0 = time.perf_counter()
    done = export(args.model, args.recipe, args.out, rollouts=rollouts, max_model_len=args.max_model_len,
                  trust_remote_code=args.trust_remote_code, allow_pickle=args.allow_pickle, targets=args.target)
    out = done.path
    for plan in done.plans:
        print(plan.summary())
        for w in plan.expression.warnings if plan.expression else []:
            log.warning("%s", w)
    print(f"export: {time.perf_counter() - t0:.0f} s -> {out}"
          + (f" (vllm serve {out} --config {out / 'vllm.yaml'})" if (out / "vllm.yaml").exists() else ""))
    return 0


def cmd_capacity(args) -> int:
    from ..core.files import atomic_write_json, check_writable, output_dir
    from ..deploy.capacity import capacity, format_report
    from ..recipe.recipe import Recipe, read_recipe
    from ..deploy.serving import GiB, Serving
    from ..model.structure import list_units, meta_model
    from ..model.student import load_config

    if args.plot and not args.out:
        raise FP8ProbeError("--plot needs --out DIR")
    if args.out:
        check_writable(args.out)
    serving = Serving(gpu=args.gpu, gpu_memory_gib=args.gpu_memory, gpu_memory_utilization=args.gpu_memory_utilization,
                      kv_cache_memory=args.kv_cache_memory, max_model_len=args.max_model_len,
                      tensor_parallel_size=args.tensor_parallel_size, block_size=args.block_size,
                      reserve_bytes=None if args.reserve_gib is None else int(args.reserve_gib * GiB),
                      max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                      hybrid=not args.disable_hybrid_kv_cache_manager)
    cfg = load_config(args.model, args.trust_remote_code, args.allow_pickle)
    units = list_units(meta_model(cfg))
    if args.recipe:
        recipe = read_recipe(args.recipe)
        recipe.check_model(units, args.recipe)
    else:
        recipe = Recipe.whole_model(units, args.scheme)
    rep = capacity(cfg, recipe, kv_cache_dtype=args.kv_cache_dtype, serving=serving)
    rep["model"] = args.model or "smollm2-135m"
    rep["recipe"] = args.recipe
    print(format_report(rep))
    if args.out:
        with output_dir(args.out) as out:
            atomic_write_json(out / "capacity.json", rep)
            if args.plot:
                from ..plots.figures import capacity_bars

                capacity_bars(rep, out / "capacity.png")
        print(f"capacity: -> {Path(args.out) / 'capacity.json'}")
    return 0


def cmd_units(args) -> int:
    _validate(args)
    student, _ = _load(args)
    for u in student.units:
        flag = "" if u.quantizable else "  (kept BF16)"
        print(f"{u.name:<48} {u.kind:<8} block {u.block:>3}  {u.params:>12,}  group {u.group}{flag}")
    q = student.quantizable
    print(f"units: {len(q)} quantizable in {len(student.groups())} fused groups, "
          f"{sum(u.params for u in q):,} parameters")
    return 0


def _sources(args, student) -> list:
    """The rollout shortcuts named on the command line, as sources (noise ladders are the ladder's own)."""
    from ..apps import sources
    from ..recipe.recipe import read_recipe

    out = [sources.recipe(student, read_recipe(p), name=f"recipe {p}") for p in args.recipe]
    out += [sources.kv_cache(student, d) for d in args.kv_cache_dtype]
    out += [sources.stale(student, c, allow_pickle=args.allow_pickle) for c in args.stale]
    return out


def _teacher(args):
    from ..model.student import load_student

    if not args.teacher:
        return None
    log.info("loading the teacher %s", args.teacher)
    return load_student(args.teacher, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code,
                        allow_pickle=args.allow_pickle)


def cmd_ladder(args) -> int:
    from ..core.files import atomic_write_json, atomic_write_text, output_dir
    from ..apps import sources
    from ..sweeps.files import versions

    _validate(args)
    _check_engine(args)
    t0 = time.perf_counter()
    with output_dir(args.out) as out:
        student, _ = _load(args)
        teacher = _teacher(args)
        rollouts, _ = _rollouts(args, student, out)
        named = _sources(args, student)
        ladder = [sources.noise(student, s, args.noise_seed) for s in
                  (sources.DEFAULT_SIGMAS if args.noise is None else args.noise)] + named
        if args.combine:
            ladder.append(sources.combine(named))
        if args.engine != "sim":  # what the engine's own arithmetic costs with no shortcut at all
            ladder.insert(0, sources.Source(f"{args.engine} alone", "engine", sources.Perturbation()))
        df = sources.ladder(student, rollouts, ladder, batch_size=args.batch_size, progress=args.progress,
                            prefix_tokens=None if args.no_prefix_shift else args.max_new_tokens,
                            prefix_seed=args.seed, teacher=teacher, engine=args.engine)
        atomic_write_text(out / "ladder.csv", df.to_csv(index=False, float_format="%.17g"))
        atomic_write_json(out / "ladder.json", {
            "schema_version": 1, "command": "ladder", "model": student.name, "teacher": args.teacher,
            "engine": args.engine,
            "sources": [{"name": s.name, "kind": s.kind, "parts": list(s.parts)} for s in ladder],
            "num_sequences": rollouts.num_sequences, "num_response_tokens": rollouts.num_response_tokens,
            "noise_seed": args.noise_seed, "prefix_seed": args.seed, "seconds": round(time.perf_counter() - t0, 3),
            "versions": versions()})
    cols = [c for c in ("source", "kl_q_p", "k3", "top1_agree", "sum_of_parts", "diverged", "first_div_mean",
                        "kl_q_p_own", "mean_abs_reward_delta", "ratio_out_verl") if c in df.columns]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"ladder: {len(df)} sources in {time.perf_counter() - t0:.0f} s -> {Path(args.out) / 'ladder.csv'}")
    return 0


def cmd_check(args) -> int:
    from ..core.files import atomic_write_json, output_dir
    from ..apps import sources
    from ..apps.admission import check, format_check
    from ..recipe.budget import read_budget

    budget = read_budget(args.budget, args.metric)  # a negative, NaN or unreadable budget fails here
    if not (args.recipe or args.kv_cache_dtype or args.stale):
        raise FP8ProbeError("nothing to check: give --recipe, --kv-cache-dtype and/or --stale (the rollout "
                            "configuration)")
    if len(args.recipe) > 1 or len(args.kv_cache_dtype) > 1 or len(args.stale) > 1:
        raise FP8ProbeError("check takes one configuration: at most one --recipe, --kv-cache-dtype and --stale "
                            "(compare several with `fp8probe ladder`)")
    _validate(args)
    _check_engine(args)
    with output_dir(args.out) as out:
        student, _ = _load(args)
        teacher = _teacher(args)
        rollouts, _ = _rollouts(args, student, out)
        named = _sources(args, student)
        config = named[0] if len(named) == 1 else sources.combine(named)
        report = check(student, rollouts, config, budget, teacher=teacher, prefix_tokens=args.max_new_tokens,
                       seed=args.seed, batch_size=args.batch_size, engine=args.engine)
        atomic_write_json(out / "check.json", report)
    print(format_check(report))
    return EXIT_OK if report["verdict"] == "ADMIT" else EXIT_REJECT


def cmd_budget(args) -> int:
    from ..core.files import atomic_write_json, check_writable, output_dir
    from ..recipe.budget import fit_budget

    check_writable(args.out)
    b = fit_budget(args.runs, tolerance=args.tolerance, bootstrap=args.bootstrap, seed=args.seed)
    with output_dir(args.out) as out:
        atomic_write_json(out / "budget.json", b.to_json())
        from ..plots.figures import budget_fit

        budget_fit(b, out / "budget.png")
    lo, hi = b.interval or (float("nan"), float("nan"))
    print(f"budget: {b.metric} <= {b.value:.4g} (90 % bootstrap interval {lo:.4g} .. {hi:.4g}) at a relative "
          f"quality loss <= {b.tolerance:g}, from {len(b.runs)} runs -> {Path(args.out) / 'budget.json'}")
    return 0


def cmd_calibrate(args) -> int:
    from ..core.files import check_writable, output_dir
    from ..apps.calibrate import DEFAULT_LEVELS, Settings, calibrate, check_resume, parse_level, read_marks, \
        split_prompts
    from ..apps.opd_train import TrainSettings, require_trl
    from ..model.prompts import BUILTIN_PROMPTS
    from ..model.rollouts import read_prompts

    require_trl()
    levels = tuple(args.levels or DEFAULT_LEVELS)
    names = [parse_level(x).name for x in levels]
    if len(set(names)) != len(names):
        raise FP8ProbeError(f"--levels names a level twice ({', '.join(names)})")
    read_marks(args.mark)
    train = TrainSettings(steps=args.steps, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                          learning_rate=args.learning_rate, eval_every=args.eval_every, eval_samples=args.eval_samples)
    train.check()
    prompts = read_prompts(args.prompts) if args.prompts else list(BUILTIN_PROMPTS)
    tr, held = split_prompts(prompts)
    settings = Settings(args.teacher, args.student, levels, args.seeds, train, tuple(tr), tuple(held))
    out = check_writable(args.out)
    check_resume(out, settings, args.resume)
    t0 = time.perf_counter()
    with output_dir(out, keep=("runs",)) as out:
        res = calibrate(settings, out, device=args.device, progress=args.progress, tolerance=args.tolerance,
                        marks=args.mark, log=log.info)
    df, b = res["runs"], res["budget"]
    means = df.groupby("level", sort=False).agg(mismatch=("mismatch", "first"), quality=("quality", "mean"))
    print(f"calibrate: {len(df)} OPD runs ({len(means)} levels x {args.seeds} seeds) in "
          f"{time.perf_counter() - t0:.0f} s -> {out}")
    for level, r in means.iterrows():
        print(f"  level {level:<10} mismatch kl_q_p {r['mismatch']:.4g}   held-out reverse KL {r['quality']:.4f}")
    if b is not None:
        lo, hi = b.interval or (float("nan"), float("nan"))
        print(f"budget: kl_q_p <= {b.value:.4g} (90 % bootstrap interval {lo:.4g} .. {hi:.4g}) at a relative "
              f"quality loss <= {b.tolerance:g} -> {out / 'budget.json'}")
    return 0


def cmd_plot(args) -> int:
    from ..plots.figures import plot_run

    written = plot_run(args.run_dir, args.out, args.format)
    for name, path in written.items():
        log.info("%s -> %s", name, path)
    print(f"plot: {len(written)} figures ({', '.join(written)}) -> {next(iter(written.values())).parent}")
    return 0


COMMANDS = {"calibrate": cmd_calibrate, "plot": cmd_plot, "sweep": cmd_sweep, "measure": cmd_measure, "rollouts": cmd_rollouts, "recipe": cmd_recipe,
            "ladder": cmd_ladder, "check": cmd_check, "budget": cmd_budget,
            "export": cmd_export, "capacity": cmd_capacity, "units": cmd_units}


if __name__ == "__main__":
    sys.exit(main())
