"""How calibration runs are set up (TrainSettings: one run, recorded in calibrate.json), what `fp8probe
calibrate` is asked for (CalibrateSettings), and the records that name one run (RunId) and say where and how its
trainer runs (TrainerRun). Light: the CLI reads the settings for its flags."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.settings import Settings, opt
from ..sources.sources import CALIBRATION_LEVELS, SOURCE_HELP


@dataclass(frozen=True)
class TrainSettings(Settings):
    """One run's training settings (shared by every level and seed of a calibration)."""

    steps: int = opt(20, "optimizer steps per run", low=1)
    batch_size: int = opt(8, "completions per step (OPD: one per prompt; GRPO: group_size per prompt)", low=1)
    group_size: int = opt(4, "GRPO: completions per prompt, whose rewards are normalised together", low=2)
    max_new_tokens: int = opt(16, "completion length", low=1)
    learning_rate: float = opt(2e-5, "AdamW's peak learning rate", low=0.0, open_low=True)
    lr_schedule: str = opt(
        "constant",
        "the learning rate along the run: constant, or linear / cosine decay to 0 at "
        "the last step (transformers' schedulers, no warm-up)",
        choices=("constant", "linear", "cosine"),
    )
    iterations: int = opt(
        1,
        "GRPO and opd-pg: optimisation steps per generation (TRL's num_iterations, PPO's epochs); from 2 "
        "on, the PPO ratio's anchor matters (grpo-bypass: the rollout's own log-probs)",
        low=1,
    )
    temperature: float = 1.0  # OPD samples its rollouts
    eval_every: int = opt(5, "held-out evaluation interval (steps)", low=1)
    eval_samples: int = opt(1, "responses sampled per held-out prompt", low=1)
    eval_seeds: str = opt(
        "fixed",
        "held-out sampling seed: fixed (eval_seed at every step) or per-step (eval_seed "
        "+ step: a fresh draw at every evaluation, the same draw for every run at that step, so runs "
        "stay paired)",
        choices=("fixed", "per-step"),
    )
    eval_seed: int = 1234

    def eval_seed_at(self, step: int) -> int:
        """The held-out sampling seed of the evaluation after `step` optimizer steps (the same in every run)."""
        return self.eval_seed + (step if self.eval_seeds == "per-step" else 0)

    def __post_init__(self):
        super().__post_init__()
        if not self.temperature > 0:
            from ..core.errors import FP8ProbeError

            raise FP8ProbeError("`temperature` must be a positive number (OPD samples its rollouts)")


@dataclass(frozen=True)
class CalibrateSettings(Settings):
    """A calibration as a user asks for it: the pair, the objectives, the ladder of levels, seeds per level, prompts,
    how quality is scored and the budget read, how far the ladder may adapt, and configurations to mark."""

    teacher: str | None = opt(
        None,
        "the teacher: HF directory, .gguf file, model id in the local HF cache; default: "
        "the embedded SmolLM2-135M-Instruct",
    )
    student: str = opt(
        "pruned:3",
        "the student (same tokenizer as the teacher), or pruned[:K]: the teacher "
        "depth-pruned to every K-th decoder block (K=2 by default), initialised from its weights",
    )
    objectives: tuple[str, ...] = opt(
        ("opd",),
        "training objectives (space- or comma-separated), each with its own budget: opd (TRL's full-vocabulary "
        "reverse KL), opd-k3 (verl's supervised sampled-token k3), opd-topk[:K] (verl's forward KL over the "
        "teacher's top-K, K 128), opd-pg (verl's k1 advantage in PPO-clip 0.2 anchored at the rollout's log-probs; "
        "--iterations 2), grpo (reward: the teacher's log-likelihood; PPO anchor: the trainer's own log-probs), "
        "grpo-is (with token-level truncated importance sampling: verl's decoupled mode), "
        "grpo-bypass (PPO anchor: the rollout's log-probs: verl's bypass mode)",
        nargs="+",
        metavar="OBJECTIVE",
    )
    levels: tuple[str, ...] = opt(
        CALIBRATION_LEVELS, f"rollout mismatch levels (0 included): {SOURCE_HELP}", nargs="+", metavar="LEVEL"
    )
    seeds: int = opt(3, "runs per level, paired by seed with the mismatch-free runs", low=2)
    prompts: str | None = opt(
        None, "prompts file (text or JSONL); every 10th is held out; default: the built-in 240 training prompts"
    )
    quality: str = opt(
        "auc",
        "the quality score of a run: auc (the mean of its whole held-out learning curve), "
        "plateau (the mean of its held-out evaluations over the second half of training) or final "
        "(its last evaluation)",
        choices=("auc", "plateau", "final"),
    )
    tolerance: float = opt(
        0.02,
        "largest quality loss accepted (a share of the training gain; your choice): a tolerance well below one "
        "run's noise needs many runs to decide (calibrate prints what the planned runs can decide at it and at 2, "
        "5 and 10 %% before training: pair A's runs spread 8 %% of the gain each, so 2 %% takes hundreds of runs)",
        low=0.0,
    )
    bracket: float = opt(
        2.0,
        "adaptive ladder: add noise levels until the edge is bracketed within this factor of measured mismatch",
        low=1.0,
        open_low=True,
    )
    max_added: int = opt(3, "adaptive ladder: at most this many added levels per objective (0: none)", low=0)
    max_runs: int = opt(
        0,
        "after the ladder, add runs where they narrow the benchmark dose's interval most: this "
        "many per objective, all of them (a preset budget: stopping once the interval looks narrow "
        "would make it under-cover)",
        low=0,
    )
    max_hours: float = opt(
        0.0, "... and stop adding once this many hours of training were spent in this invocation (0: no limit)", low=0.0
    )
    response: str = opt(
        "gain",
        "a run's quality loss: gain (the share of what training gained that the mismatch cost, "
        "against its twin) or relative (its relative shortfall against its twin)",
        choices=("gain", "relative"),
    )
    save_checkpoints: bool = opt(
        False,
        "the mismatch-free runs keep the student at the first, middle and last step "
        "(runs/<objective>/0-seed<k>/checkpoints/step-N), for `check --checkpoints`",
    )
    mark: tuple[str, ...] = opt(
        (),
        "configurations measured elsewhere to mark on the curve: recipe.json, ladder.csv, "
        "sensitivity.csv (whole-model rows)",
        metavar="FILE",
    )
    pilot: str | None = opt(
        None,
        "a budget.json of an earlier calibration of this student and objective: its variance components size "
        "the design printed before training (default: pair A's OPD)",
    )
    device: str = opt("cpu", "torch device")
    refit: bool = opt(
        False,
        "refit the finished calibration in `out` as this fp8probe reads budgets (each level's "
        "dose measured on check's scale; nothing trained but a stale level's first steps)",
    )


@dataclass(frozen=True)
class RunId:
    """One calibration run: its objective (runs.OBJECTIVES), its rollout-mismatch level and its seed."""

    objective: str
    level: object  # sources.SourceSpec
    seed: int


@dataclass(frozen=True)
class TrainerRun:
    """Where and how one run's trainer runs, beside its TrainSettings: its `seed`, TRL's `output_dir`, the rollout
    engine's state of the student (`perturber`: opd.Perturber; None, the student itself), TRL callbacks, the
    device."""

    seed: int
    output_dir: str
    perturber: object = None
    callbacks: tuple = ()
    device: str = "cpu"
