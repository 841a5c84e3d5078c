"""The command line's flags, built from the library's settings (cli/options.py), and each command's examples.
Imports no torch: `fp8probe --help` is instant."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..apps.admission import CheckSettings
from ..apps.capacity import BudgetSettings, CapacitySettings
from ..apps.measure import MeasureSettings
from ..apps.plan import PlanSettings
from ..apps.recipe import RecipeSettings
from ..apps.sources import LadderSettings, Shortcuts
from ..apps.sweep import SweepSettings
from ..apps.training import CalibrateSettings, TrainSettings
from ..core.errors import EXIT_USAGE
from ..deploy.frameworks import TARGETS
from ..deploy.serving import Serving
from ..model.settings import ModelSource, RolloutSettings
from .options import add_settings, number

EXAMPLES = {
    "sweep": ["sweep --out runs/smollm2                 # the embedded student, built-in prompts",
              "sweep ./Qwen3-1.7B --out runs/qwen3 --num-prompts 32 --max-new-tokens 128",
              "sweep --rollouts runs/smollm2 --scheme FP8_BLOCK --granularity group --out runs/block"],
    "measure": ["measure --out runs/whole                 # whole-model FP8_DYNAMIC as vLLM runs it on a Hopper GPU",
                "measure --rollouts runs/smollm2 --engine sim --out runs/whole_sim   # the sweep's simulation"],
    "recipe": ["recipe runs/smollm2 --budget 0.01 --out runs/recipe-0.01",
               "recipe runs/smollm2 --budget 1e-3 --metric k3 --keep-first 1 --keep-last 1 --out runs/r"],
    "export": ["export --recipe runs/recipe-0.01/recipe.yaml --out ckpt/smollm2-fp8",
               "export --recipe runs/r-*/recipe.yaml --target all --out runs/rollout-configs"],
    "capacity": ["capacity ./Qwen3-8B/config.json --gpu H100 --max-model-len 32768",
                 "capacity ./Llama-3.1-70B --tensor-parallel-size 4 --gpu H200 --out runs/cap --plot"],
    "ladder": ["ladder --out runs/ladder --recipe runs/recipe/recipe.yaml --kv-cache-dtype fp8 --combine",
               "ladder --rollouts runs/smollm2 --stale ckpt/step-100 ckpt/step-200 --out runs/stale"],
    "check": ["check --budget budget.json --recipe runs/recipe/recipe.yaml --kv-cache-dtype fp8 --out runs/check",
              "check --budget budget.json --recipe runs/recipe/recipe.yaml --engine vllm-cuda --out runs/check_cuda"],
    "plan": ["plan --recipe runs/recipe/recipe.yaml --kv-cache-dtype fp8 --async 1 --calibration DIR --out runs/plan",
             "plan shape:qwen3-8b --no-measure --gpu H200 --fp8 FP8_DYNAMIC --response-len 4096 --out runs/plan-8b"],
    "budget": ["budget runs.csv --out runs/budget --tolerance 0.01"],
    "calibrate": ["calibrate --out runs/calibrate            # the demo pair: embedded SmolLM2 teaching its pruned copy",
                  "calibrate --teacher ./Qwen3-8B --student ./Qwen3-1.7B --levels 0 0.003 0.01 fp8 kv stale:2 "
                  "--out runs/cal"],
}
TARGET_LINES = "\n".join(f"  {t.name:<12} {t.form:<10} {t.how}" for t in TARGETS.values())


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that points at --help, like every other error."""

    def error(self, message: str):
        print(f"fp8probe: error: {message}; see `{self.prog} --help`", file=sys.stderr)
        sys.exit(EXIT_USAGE)


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # a default worth showing: not None, not a switch's False
        shown = action.default is not None and action.default is not False and action.default != []
        return super()._get_help_string(action) if shown else action.help


# command -> (help, the settings whose fields are its flags, other flags: (name, add_argument kwargs))
OUT = ("--out", {"required": True, "help": "output directory"})
LOADING = [("--trust-remote-code", {"action": "store_true", "help": "allow custom model code"}),
           ("--allow-pickle", {"action": "store_true", "help": "read .bin/.pt weights (weights_only)"})]
SPECS = {
    "sweep": ("quantize one unit at a time, score the mismatch (the main job)",
              (ModelSource, RolloutSettings, SweepSettings),
              [OUT, ("--resume", {"action": "store_true", "help": "continue an interrupted sweep in --out"})]),
    "measure": ("whole-model mismatch of one scheme (and FP8 KV) on the rollouts, as an engine computes it",
                (ModelSource, RolloutSettings, MeasureSettings), [OUT]),
    "rollouts": ("sample the student's own rollouts and save them", (ModelSource, RolloutSettings), [OUT]),
    "recipe": ("pick the FP8 recipe that saves the most under a mismatch budget", (RecipeSettings,),
               [("sweep_dir", {"help": "a directory written by `fp8probe sweep`"}), OUT,
                ("--device", {"default": "cpu"}), *LOADING]),
    "export": ("write a vLLM checkpoint and each RL framework's rollout config for recipes", (),
               [("model", {"nargs": "?", "help": "HF directory or id; default: the embedded student"}),
                ("--recipe", {"required": True, "nargs": "+", "help": "recipe.yaml file(s); each target takes the "
                              "one made for it, else the first it can apply"}),
                ("--target", {"nargs": "+", "default": ["vllm"], "choices": [*TARGETS, "all"], "metavar": "TARGET",
                              "help": f"where the rollouts run: {', '.join(TARGETS)}, or all"}),
                ("--out", {"required": True, "help": "output directory (must not exist or be empty)"}),
                ("--rollouts", {"help": "calibration data for static input scales / a kv_cache_scheme (a sweep dir)"}),
                ("--max-model-len", {"type": number(int, 1), "help": "written into vllm.yaml / vllm_args.json"}),
                *LOADING]),
    "capacity": ("KV-cache tokens and concurrency, BF16 vs FP8, as vLLM accounts them; config only",
                 (CapacitySettings, Serving),
                 [("model", {"nargs": "?", "help": "HF directory or id, .gguf, a bare config.json; default: the "
                             "embedded student"}), *LOADING, ("--out", {"help": "write DIR/capacity.json"}),
                  ("--plot", {"action": "store_true", "help": "with --out, also DIR/capacity.png"})]),
    "units": ("list the quantizable units and their fused groups", (ModelSource,), []),
    "ladder": ("every rollout shortcut on one mismatch scale: noise ruler, recipes, FP8 KV, stale weights",
               (ModelSource, RolloutSettings, Shortcuts, LadderSettings), [OUT]),
    "check": ("admit or reject a rollout configuration against a mismatch budget (exit 0 admit, 1 reject, 2 error)",
              (ModelSource, RolloutSettings, Shortcuts, CheckSettings), [OUT]),
    "plan": ("each rollout configuration's cost (measured) beside its benefit (modelled throughput, time to quality)",
             (ModelSource, RolloutSettings, Serving, PlanSettings), [OUT]),
    "budget": ("the mismatch budget from a table of training runs (quality vs mismatch)", (BudgetSettings,),
               [("runs", {"help": "CSV: mismatch, quality[, metric, seed, higher_is_better], one row per run"}),
                ("--out", {"required": True, "help": "output directory for budget.json and budget.png"})]),
    "calibrate": ("calibrate the mismatch budget with short on-policy distillation runs (TRL) at a ladder of rollout "
                  "mismatch", (CalibrateSettings, TrainSettings),
                  [("--out", {"required": True, "help": "run directory (runs/, runs.csv, budget.json, calibration.png)"}),
                   ("--resume", {"action": "store_true", "help": "continue a killed calibration in --out"})]),
    "plot": ("every figure a run directory's files allow (sweep, recipes, capacity, ladder)", (),
             [("run_dir", {"help": "a directory written by fp8probe"}),
              ("--out", {"help": "where the figures go (default: RUN_DIR/plots)"}),
              ("--format", {"default": "png", "choices": ["png", "svg"]})]),
}


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="fp8probe", description="Per-layer FP8 sensitivity and mismatch-budgeted FP8 recipes for RL / "
                 "on-policy-distillation students.")
    ap.add_argument("--version", action="version", version=f"fp8probe {__version__}")
    verb = ap.add_mutually_exclusive_group()
    verb.add_argument("-q", "--quiet", action="store_true", help="only warnings and the final summary")
    verb.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help, settings, extra) in SPECS.items():
        epilog = ["examples:", *(f"  fp8probe {e}" for e in EXAMPLES[name])] if name in EXAMPLES else []
        epilog += ["targets (what each rollout framework can apply; its file under OUT/frameworks/):",
                   TARGET_LINES] if name == "export" else []
        p = sub.add_parser(name, help=help, epilog="\n".join(epilog) or None, formatter_class=_Help)
        for flag, kw in extra:
            p.add_argument(flag, **kw)
        for cls in settings:
            add_settings(p, cls)
    return ap


def flags_of(ap: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """Settings fields (argparse dests) -> the flag that sets them (MODEL for the positional): `command`'s own, then
    any other command's (an error may point at another command's setting: "a sweep run with --method exact")."""
    subs = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices
    out = {}
    for name in [n for n in subs if n != command] + [command]:
        out.update({a.dest: a.option_strings[0] if a.option_strings else a.dest.upper() for a in subs[name]._actions
                    if a.option_strings or name == command})
    return out
