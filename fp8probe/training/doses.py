"""A calibration level's dose on `check`'s scale: its perturbation measured on the budget's student before
training, exactly as `fp8probe check` measures a configuration.

A run's mean KL over training is not that number. The student sharpens as it trains, and the KL of one
perturbation on it falls 4-60x in 20 steps (pair A, OPD, σ = 0.0405: 1.68 at step 1, 0.076 at step 20), at a rate
that depends on the objective, while whole-model FP8's rose; `check` measures a configuration once, on the student
it is given. So a budget's dose is the check's measurement of the level's perturbation, on the budget's student,
with check's default rollouts (the first 16 built-in prompts, up to 48 tokens, seed 0, temperature 1), the same
metric (kl_q_p, its excess), the same engine (the simulation):

    noise σ     the mean over DOSE_DRAWS noise draws (seeds 0..3; training draws a fresh one every step)
    fp8, kv     the level's one perturbation (every unit in FP8; the FP8 KV cache at scale 1.0 as online engines
                run it)
    stale:K     a lag of K optimizer steps where a user's `check MODEL --stale OLD --stale-steps K` measures it: at
                the checkpoints of a run. The objective's own mismatch-free run is trained again and, at each of
                its evaluation steps t >= K (every eval_every steps: 5, 10, 15, 20 in the demo), its student is
                checked with its own weights of K steps before as the stale rollout policy (`check MODEL_AT_t
                --stale MODEL_AT_t-K` on MODEL_AT_t's own rollouts); the dose is the mean over those steps and the
                calibration's first 3 seeds, each step's mean kept beside it (`steps`). The student moves most in
                the first steps (pair A, OPD: a one-step lag measured 0.71 from step 0 to 1, 0.001-0.1 later), so
                step 0 -> K alone (budget.json 4's first stale doses) was not the check's axis.

The run-mean KL stays in runs.csv (`mismatch_run`, `mismatch_run_mean`) with its ratio to the dose per level in
calibrate.json (`dose_mapping`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.files import atomic_write_json
from ..core.metrics import excess
from ..measurement.perturbation import Perturbation

DOSE_DRAWS = 4  # noise draws averaged into a noise level's dose
STALE_SEEDS = 3  # seeds of the mismatch-free run along which a stale level's dose is checked
STALE_HOW = "along the run: the mean over its evaluation steps t >= K of check(t --stale t - K)"
HOW = (
    "kl_q_p as `fp8probe check` measures it on the student before training: its own rollouts to the first 16 "
    "built-in prompts (up to 48 tokens, seed 0), the simulation; noise: the mean of 4 draws; stale:K: the "
    "mismatch-free run's student at each of its evaluation steps t >= K checked against its own weights of K steps "
    "before (`check --stale`), the mean over those steps and 3 seeds"
)


def checked_steps(train, k: int) -> list[int]:
    """The steps of a run at which a stale level's lag `k` is checked: its evaluation steps (every `eval_every`, the
    last one included) from k on."""
    steps = sorted({*range(train.eval_every, train.steps + 1, train.eval_every), train.steps})
    return [t for t in steps if t >= k]


def check_rollouts(student):
    """The rollouts `fp8probe check` samples when given none: RolloutSettings' defaults."""
    from ..model.rollouts import make_rollouts
    from ..model.settings import RolloutSettings

    s = RolloutSettings()
    return make_rollouts(student, s.prompts, s.sampling())


def _measured(bench, perturbation) -> dict:
    """check's measurement of one perturbation on the bench: kl_q_p's excess and its 90 % interval over the
    prompts."""
    from ..measurement.measure import measure

    m = measure(bench, perturbation)
    return {"dose": excess("kl_q_p", m.metrics["kl_q_p"]), "interval": m.excess_interval("kl_q_p")}


class Doses:
    """The doses of one calibration's levels, measured once each on the student before training (and for stale
    levels, on the objective's mismatch-free student after K steps), kept in DIR/doses.json so a resume does not
    measure again."""

    def __init__(self, student, path, along=None, train=None):
        """`along(objective, seed, steps, folder)`: the mismatch-free run of that objective and seed trained again,
        its weights saved at `steps` into `folder` (step -> file; runs.states_along); `train`: the runs'
        TrainSettings (their evaluation steps). Both for stale levels."""

        self.student, self.path, self.along, self.train = student, Path(path), along, train
        self.known: dict = json.loads(self.path.read_text(encoding="utf-8")) if self.path.exists() else {}
        self._bench = None  # check's rollouts of the student before training, made when a level first needs them

    def _key(self, objective: str, level) -> str:
        return f"{objective}/{level.name}" if level.kind == "stale" else level.name

    def dose(self, objective: str, level) -> dict:
        """{"dose", "interval", "draws"} of `level` (a SourceSpec) for `objective`; 0 for the mismatch-free level."""
        if level.kind == "none":
            return {"dose": 0.0, "interval": [0.0, 0.0], "draws": []}
        key = self._key(objective, level)
        if level.kind == "stale" and self.known.get(key, {}).get("how") != STALE_HOW:
            self.known.pop(key, None)  # measured on another axis (step 0 -> K): measured again
        if key not in self.known:
            self.known[key] = self._stale(objective, level) if level.kind == "stale" else self._measure(level)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path, self.known)
        return self.known[key]

    def _measure(self, level) -> dict:
        from ..measurement.bench import Bench

        if self._bench is None:
            self._bench = Bench(self.student, check_rollouts(self.student))
        draws = [
            _measured(self._bench, level.rollout(self.student, k)(0))
            for k in range(DOSE_DRAWS if level.kind == "noise" else 1)
        ]  # noise: seed k's draw at step 0
        return _mean(draws)

    def _stale(self, objective: str, level) -> dict:
        import tempfile

        from safetensors.torch import load_file

        from ..measurement.bench import Bench

        k = level.stale_steps
        ts = checked_steps(self.train, k)
        if not ts:
            raise FP8ProbeError(f"stale:{k} lags more steps than a run trains ({self.train.steps}): use a smaller K")
        draws, by_step = [], {}
        for seed in range(STALE_SEEDS):
            with tempfile.TemporaryDirectory() as tmp:
                files = self.along(objective, seed, sorted({*ts, *(t - k for t in ts)}), tmp)
                for t in ts:
                    moved = self._at(files[t])
                    bench = Bench(moved, check_rollouts(moved))
                    d = _measured(bench, Perturbation(stale=load_file(str(files[t - k]))))
                    draws.append(d)
                    by_step.setdefault(t, []).append(d["dose"])
        return {
            **_mean(draws),
            "steps": {str(t): sum(v) / len(v) for t, v in by_step.items()},
            "how": STALE_HOW,
        }

    def _at(self, file):
        """A copy of the student holding the weights saved in `file` (eval mode, no gradients)."""
        import copy

        from safetensors.torch import load_file

        from .opd import trainable_student

        model = copy.deepcopy(self.student.model)
        model.load_state_dict(load_file(str(file)), strict=False)
        moved = trainable_student(model, self.student.tokenizer, f"{self.student.name}@{Path(file).stem}")
        moved.model.eval()
        moved.model.requires_grad_(False)
        return moved


def _mean(draws: list[dict]) -> dict:
    return {
        "dose": sum(d["dose"] for d in draws) / len(draws),
        "interval": [sum(d["interval"][i] for d in draws) / len(draws) for i in (0, 1)],
        "draws": [d["dose"] for d in draws],
    }


def mapping(table) -> list[dict]:
    """Per objective and level: the run-mean KL over training beside the dose, and their ratio (runs.csv's rows)."""
    out = []
    for (objective, level), d in table[table["mismatch"] > 0].groupby(["objective", "level"]):
        dose, run = float(d["mismatch"].iloc[0]), float(d["mismatch_run"].mean())
        out.append(
            {
                "objective": str(objective),
                "level": str(level),
                "kind": str(d["kind"].iloc[0]),
                "dose": dose,
                "run_mean": run,
                "run_mean_over_dose": run / dose if dose > 0 else math.nan,
            }
        )
    return out
