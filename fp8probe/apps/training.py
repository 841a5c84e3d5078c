"""How OPD training runs are set up (TrainSettings: one run, recorded in calibrate.json) and what `fp8probe
calibrate` is asked for (CalibrateSettings). Light: the CLI reads both for its flags."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.settings import Settings, opt
from .sources import CALIBRATION_LEVELS, SOURCE_HELP


@dataclass(frozen=True)
class TrainSettings(Settings):
    """One run's training settings (shared by every level and seed of a calibration)."""

    steps: int = opt(30, "optimizer steps per run", low=1)
    batch_size: int = opt(8, "prompts per step, one completion each", low=1)
    max_new_tokens: int = opt(32, "completion length", low=1)
    learning_rate: float = opt(2e-5, "AdamW, constant", low=0.0, open_low=True)
    temperature: float = 1.0  # OPD samples its rollouts
    eval_every: int = opt(10, "held-out evaluation interval (steps)", low=1)
    eval_samples: int = opt(2, "responses sampled per held-out prompt", low=1)
    eval_seed: int = 1234

    def __post_init__(self):
        super().__post_init__()
        if not self.temperature > 0:
            from ..core.errors import FP8ProbeError

            raise FP8ProbeError("`temperature` must be a positive number (OPD samples its rollouts)")


@dataclass(frozen=True)
class CalibrateSettings(Settings):
    """A calibration as a user asks for it: the pair, the ladder of levels, seeds per level, prompts, the tolerance
    of the budget and configurations to mark on its curve."""

    teacher: str | None = opt(None, "the teacher: HF directory, .gguf file, model id in the local HF cache; default: "
                              "the embedded SmolLM2-135M-Instruct")
    student: str = opt("pruned", "the student (same tokenizer as the teacher), or pruned[:K]: the teacher "
                       "depth-pruned to every K-th decoder block, initialised from its weights")
    levels: tuple[str, ...] = opt(CALIBRATION_LEVELS, f"rollout mismatch levels: {SOURCE_HELP}", nargs="+",
                                  metavar="LEVEL")
    seeds: int = opt(2, "runs per level", low=1)
    prompts: str | None = opt(None, "prompts file (text or JSONL); every 5th is held out; default: the built-in 40")
    tolerance: float | None = opt(None, "largest relative rise of the held-out reverse KL accepted (default: how far "
                                  "the mismatch-free runs land apart by their seeds alone, at least 0.01)", low=0.0)
    mark: tuple[str, ...] = opt((), "configurations measured elsewhere to mark on the curve: recipe.json, ladder.csv, "
                                "sensitivity.csv (whole-model rows)", metavar="FILE")
    device: str = opt("cpu", "torch device")
