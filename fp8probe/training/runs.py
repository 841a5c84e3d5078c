"""One calibration run and its files: an objective (OPD or GRPO) trained at one rollout-mismatch level and seed.

    DIR/runs/<objective>/<level>-seed<k>/   steps.csv (loss and rollout mismatch per step), eval.csv (held-out
                                            quality every `eval_every` steps), run.json once finished

The paired design lives here: every run of a seed uses that seed for data order, generation and the noise draws,
and every run is evaluated on the same held-out prompts with the same evaluation seed at each step
(`TrainSettings.eval_seed_at`), so a level and its mismatch-free twin differ only by what the mismatch did. The
evaluation before training is the same for every run of a calibration (one student, one seed): made once, shared.

Quality (lower is better: the held-out reverse KL to the teacher, per token, over the full vocabulary):

    auc      the mean of the held-out learning curve, trapezoid over the evaluation steps, step 0 included (the
             default): every evaluation counts, so the score is not read off one point of a steep curve
    plateau  the mean of the evaluations over the second half of training: the part of the curve where the
             mismatch-free runs should have stopped improving (`late_improvement` says whether they have)
    final    the last evaluation

Which is quieter was measured on the demo's pair A (OPD, σ = 0.03 against its twins, 4 seeds, an evaluation every
2 steps with per-step seeds; docs/admission.md): the paired losses' standard deviation was 2.6 % (auc), 5.6 %
(plateau) and 2.6 % (final) at a constant learning rate, 2.4 %, 4.8 % and 8.5 % with a linear decay, so auc stays
the default.
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.files import atomic_write_text
from ..core.records import TrainingRunRecord
from ..sources.sources import SourceSpec
from .settings import RunId, TrainerRun, TrainSettings

QUALITY_NAME = "held-out reverse KL(student ‖ teacher) per token, full vocabulary"
RUN_COLUMNS = [
    "objective",
    "level",
    "kind",
    "value",
    "seed",
    "metric",
    "mismatch",
    "mismatch_run_mean",
    "mismatch_run",
    "k3",
    "quality",
    "quality_plateau",
    "quality_auc",
    "quality_final",
    "paired_loss",
    "late_improvement",
    "higher_is_better",
    "quality_start",
    "teacher_logp",
    "teacher_logp_start",
    "steps",
    "rollout_tokens",
    "seconds",
]


# what TRL logs per step that steps.csv keeps beside the loss (GRPO: the reward, the policy's entropy, the share of
# tokens the PPO clip cut; the collapse of an RL run shows in these first)
STEP_LOGS = ("reward", "reward_std", "entropy", "clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean")


def _opd(loss_mode: str | None = None):
    def make(student, teacher, prompts, settings, run: TrainerRun, arg=None):
        from .opd import make_trainer, verl_supervised_loss

        loss = verl_supervised_loss(loss_mode, arg) if loss_mode else None
        return make_trainer(student, teacher, prompts, settings, run, loss=loss)

    return make


def _grpo(correction: bool = False, bypass: bool = False, opd_pg: bool = False):
    def make(student, teacher, prompts, settings, run: TrainerRun, arg=None):
        from .grpo import make_grpo_trainer

        return make_grpo_trainer(
            student, teacher, prompts, settings, run, correction=correction, bypass=bypass, opd_pg=opd_pg
        )

    return make


from ..deploy.frameworks.verl import TOPK  # noqa: E402  opd-topk without :K: DistillationLossConfig.topk

# objective -> (how its trainer is made, what it is); opd-topk takes :K (the teacher's top-K)
OBJECTIVES = {
    "opd": (_opd(), "on-policy distillation: TRL's DistillationTrainer, per-token reverse KL to the teacher"),
    "opd-k3": (
        _opd("k3"),
        "verl's supervised OPD: the k3 reverse-KL estimator on the sampled tokens "
        "(distillation_loss.loss_mode=k3, use_policy_gradient=false)",
    ),
    "opd-topk": (
        _opd("forward_kl_topk"),
        f"verl's supervised OPD: forward KL over the teacher's top-K tokens (loss_mode=forward_kl_topk, "
        f"opd-topk:K; K {TOPK} by default)",
    ),
    "opd-pg": (
        _grpo(opd_pg=True),
        "verl's policy-gradient OPD: the k1 estimate as a per-token advantage in PPO-clip 0.2, the rollout's "
        "log-probs the ratio's denominator (loss_mode=k1, use_policy_gradient=true); needs --iterations 2 or more",
    ),
    "grpo": (_grpo(), "GRPO, reward the teacher's log-likelihood of the completion, no correction"),
    "grpo-is": (_grpo(correction=True), "GRPO as above with token-level truncated importance sampling (cap 2.0)"),
    "grpo-bypass": (
        _grpo(bypass=True),
        "GRPO as above, the PPO ratio anchored at the rollout's own log-probs (verl's bypass mode)",
    ),
}
# the objectives whose steps sample group_size completions per prompt (TRL's GRPOTrainer underneath)
GROUPED = ("opd-pg", "grpo", "grpo-is", "grpo-bypass")


def parse_objective(objective: str) -> tuple[str, int | None]:
    """(the OBJECTIVES key, its argument) of an objective as named: `opd-topk:64` -> ("opd-topk", 64)."""
    name, _, arg = objective.partition(":")
    if name not in OBJECTIVES:
        raise FP8ProbeError(f"unknown `objectives` {objective!r}; one of {', '.join(OBJECTIVES)} (opd-topk:K)")
    if name != "opd-topk":
        if arg:
            raise FP8ProbeError(f"`objectives` {objective!r}: only opd-topk takes an argument (:K)")
        return name, None
    if arg and not (arg.isdigit() and int(arg) > 0):
        raise FP8ProbeError(f"`objectives` {objective!r}: K in opd-topk:K is a positive whole number of tokens")
    return name, int(arg) if arg else TOPK


def objective_loss(objective: str) -> str | None:
    """The loss `objective` trains, in words (None: not one of OBJECTIVES, e.g. a verl run's own label)."""
    try:
        name, arg = parse_objective(objective)
    except FP8ProbeError:
        return None
    text = OBJECTIVES[name][1]
    return text.replace("top-K tokens", f"top-{arg} tokens") if arg else text


def objective_note(budget, named: str | None) -> str | None:
    """What a verdict says when the budget's objective is not the one the user trains with (`named`; None: not
    named, nothing said): the tolerance of one objective's training to a mismatch is not another's."""
    if named is None:
        return None
    parse_objective(named)  # an unknown name is refused before any output
    if budget.objective == named or not budget.calibrated:
        return None
    if budget.objective is None:
        return f"the budget does not record the objective it was calibrated under; you train with {named}"
    theirs = budget.loss or objective_loss(budget.objective) or "its loss not recorded"
    return (
        f"the budget was calibrated under {budget.objective} ({theirs}), not {named} ({objective_loss(named)}), "
        f"which you train with: its tolerance of the same mismatch was not measured (fp8probe calibrate "
        f"--objectives {named})"
    )


def trainer_maker(objective: str):
    """The function that makes `objective`'s trainer (student, teacher, prompts, settings, run) -> trainer."""
    name, arg = parse_objective(objective)
    make = OBJECTIVES[name][0]
    return lambda *a: make(*a, arg=arg)


def curve_quality(evals: list[dict]) -> dict[str, float]:
    """The run's quality every way (module docstring) and how much the last fifth of training still improved it."""
    steps = [e["step"] for e in evals]
    q = [e["reverse_kl"] for e in evals]
    area = sum((steps[i + 1] - steps[i]) * (q[i] + q[i + 1]) / 2 for i in range(len(q) - 1))
    span = steps[-1] - steps[0]
    auc = area / span if span else q[-1]
    late_half = [x for s, x in zip(steps, q) if s >= steps[0] + span / 2]
    cut = steps[-1] - span / 5
    before = max((i for i, s in enumerate(steps) if s <= cut), default=0)
    late = (q[before] - q[-1]) / abs(q[before]) if q[before] else 0.0
    return {"plateau": sum(late_half) / len(late_half), "auc": auc, "final": q[-1], "late_improvement": late}


def run_dir(out: Path, objective: str, level: SourceSpec, seed: int) -> Path:
    return Path(out) / "runs" / objective / f"{level.slug}-seed{seed}"


def finished(out: Path, objective: str, level: SourceSpec, seed: int) -> TrainingRunRecord | None:
    """The run's run.json when it finished (None: not run, or its file unreadable: it runs again)."""
    f = run_dir(out, objective, level, seed) / "run.json"
    if not f.exists():
        return None
    try:
        return TrainingRunRecord.read(f, "it runs again")
    except FP8ProbeError:
        return None


def train_one(
    teacher,
    initial_student,
    run: RunId,
    calibration,
    out: Path,
    *,
    on_step=None,
    device: str = "cpu",
    start: dict | None = None,
) -> TrainingRunRecord:
    """One run (its objective at one level and seed); writes its run directory and returns its run.json. `start`:
    the held-out evaluation before training, when already made (it is the same for every run of a calibration)."""
    from transformers import TrainerCallback

    from .opd import Perturber, heldout_quality, trainable_student

    objective, level, seed = run.objective, run.level, run.seed
    d = run_dir(out, objective, level, seed)
    d.mkdir(parents=True, exist_ok=True)
    student = trainable_student(
        copy.deepcopy(initial_student.model), initial_student.tokenizer, f"{calibration.student}@{level.name}"
    )
    tr = calibration.train
    evals: list[dict] = []

    def evaluate(step):
        evals.append({"step": step, **heldout_quality(student, teacher, list(calibration.heldout_prompts), tr, step)})

    keep = (
        {0, tr.steps // 2, tr.steps}
        if getattr(calibration, "save_checkpoints", False) and level.kind == "none"
        else set()
    )

    def save(step):  # the mismatch-free student along training, for `check --checkpoints`
        if step in keep:
            student.model.save_pretrained(d / "checkpoints" / f"step-{step}")
            student.tokenizer.save_pretrained(d / "checkpoints" / f"step-{step}")

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            evals.append({"step": 0, **start}) if start is not None else evaluate(0)
            save(0)

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % tr.eval_every == 0 or state.global_step == tr.steps:
                evaluate(state.global_step)
            save(state.global_step)
            if on_step is not None:
                on_step(state.global_step, evals[-1]["reverse_kl"])

    perturber = None
    if level.kind != "none":
        perturber = Perturber(student.model, level.rollout(student, seed), stale=level.stale_steps)
    t0 = time.perf_counter()
    make = trainer_maker(objective)
    trainer = make(
        student,
        teacher,
        list(calibration.train_prompts),
        tr,
        TrainerRun(seed, str(d / "trl"), perturber, (Progress(),), device),
    )
    trainer.train()
    return _write_run(d, trainer, evals, perturber, objective, level, seed, tr, time.perf_counter() - t0)


def states_along(teacher, initial_student, objective: str, seed: int, calibration, steps, folder, device: str = "cpu"):
    """The mismatch-free run of `objective` and `seed`, trained exactly as its run trains (the run's settings,
    schedule and seeds), its weights saved at each of `steps` (0: before training) into `folder` as safetensors:
    step -> the file. What a stale level's dose checks (doses.py): the student at step t against itself at t - K."""
    from safetensors.torch import save_file
    from transformers import TrainerCallback

    from .opd import trainable_student

    wanted, last = set(steps), max(steps)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    student = trainable_student(
        copy.deepcopy(initial_student.model),
        initial_student.tokenizer,
        f"{calibration.student}@{objective}-seed{seed}",
    )
    saved = {}

    def save(step):
        if step in wanted:
            saved[step] = folder / f"step-{step}.safetensors"
            state = {n: p.detach().to("cpu").contiguous() for n, p in student.model.named_parameters()}
            save_file(state, str(saved[step]))

    class Along(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            save(0)

        def on_step_end(self, args, state, control, **kw):
            save(state.global_step)
            if state.global_step >= last:
                control.should_training_stop = True

    if last > 0:
        with tempfile.TemporaryDirectory() as tmp:
            make = trainer_maker(objective)
            trainer = make(
                student,
                teacher,
                list(calibration.train_prompts),
                calibration.train,
                TrainerRun(seed, tmp, None, (Along(),), device),
            )
            trainer.train()
    else:
        save(0)
    return saved


def _write_run(d: Path, trainer, evals, perturber, objective, level, seed, tr, seconds) -> dict:
    import pandas as pd

    if (d / "trl").is_dir() and not any((d / "trl").iterdir()):
        (d / "trl").rmdir()  # TRL makes its output_dir; nothing is saved there
    losses = [
        {"step": h["step"], "loss": h["loss"], **{k: h[k] for k in STEP_LOGS if k in h}}
        for h in trainer.state.log_history
        if "loss" in h
    ]
    steps = pd.DataFrame(losses)
    if trainer.rollout_mismatch:
        steps = steps.merge(pd.DataFrame(trainer.rollout_mismatch), on="step", how="left")
    atomic_write_text(d / "steps.csv", steps.to_csv(index=False))
    atomic_write_text(d / "eval.csv", pd.DataFrame(evals).to_csv(index=False))
    if perturber is None:
        mism = {"kl_q_p": 0.0, "k3": 0.0, "tokens": 0}  # q is p: nothing to measure
    else:
        m = pd.DataFrame(trainer.rollout_mismatch)
        w = m["tokens"] / m["tokens"].sum()
        mism = {
            "kl_q_p": float((m["kl_q_p"] * w).sum()),
            "k3": float((m["k3"] * w).sum()),
            "tokens": int(m["tokens"].sum()),
        }
    result = TrainingRunRecord(
        objective=objective,
        level=level.name,
        kind=level.kind,
        value=level.value,
        scheme=level.scheme,
        seed=seed,
        steps=tr.steps,
        seconds=round(seconds, 2),
        mismatch=mism,
        quality_start=evals[0],
        quality_end=evals[-1],
        quality=curve_quality(evals),
        losses=[x["loss"] for x in losses],
    )
    result.write(d / "run.json")
    return result


def runs_table(results: list[TrainingRunRecord], quality: str = "auc", dose=None):
    """runs.csv: one row per run. `mismatch` is the level's dose (what a budget fits): `dose(objective, level)`, the
    level's kl_q_p as `check` measures it (doses.py), or without `dose` the level's mean run-mean KL;
    `mismatch_run_mean` the level's mean of its runs' mean KL over training, `mismatch_run` the run's own;
    `quality` the run's `quality` score (plateau, auc or final), `quality_start` its quality before training,
    `paired_loss` its relative rise over its own seed's mismatch-free run of the same objective (0 for that run)."""
    import pandas as pd

    rows = []
    for r in results:
        q = r.quality
        if quality not in q:
            raise FP8ProbeError(
                f"run {r.objective} {r.level} seed {r.seed} has no {quality} quality (written "
                "by an older fp8probe): calibrate again, or pass the quality it has: "
                f"{', '.join(k for k in q if k != 'late_improvement')}"
            )
        rows.append(
            {
                "objective": r.objective or "opd",
                "level": r.level,
                "kind": r.kind,
                "value": r.value,
                "seed": r.seed,
                "metric": "kl_q_p",
                "mismatch_run": r.mismatch["kl_q_p"],
                "k3": r.mismatch["k3"],
                "quality": q[quality],
                "quality_plateau": q.get("plateau", float("nan")),
                "quality_auc": q["auc"],
                "quality_final": q["final"],
                "late_improvement": q["late_improvement"],
                "higher_is_better": False,
                "quality_start": r.quality_start["reverse_kl"],
                "teacher_logp": r.quality_end["teacher_logp"],
                "teacher_logp_start": r.quality_start["teacher_logp"],
                "steps": r.steps,
                "rollout_tokens": r.mismatch["tokens"],
                "seconds": r.seconds,
            }
        )
    df = pd.DataFrame(
        rows, columns=[c for c in RUN_COLUMNS if c not in ("mismatch", "mismatch_run_mean", "paired_loss")]
    )
    run_mean = df.groupby(["objective", "level"])["mismatch_run"].transform("mean")
    df.insert(
        RUN_COLUMNS.index("mismatch"),
        "mismatch",
        run_mean if dose is None else [float(dose(o, lv)) for o, lv in zip(df["objective"], df["level"])],
    )
    df.insert(RUN_COLUMNS.index("mismatch_run_mean"), "mismatch_run_mean", run_mean)
    twin = df[df["kind"] == "none"].set_index(["objective", "seed"])["quality"]
    base = [twin.get((o, s), float("nan")) for o, s in zip(df["objective"], df["seed"])]
    df.insert(RUN_COLUMNS.index("paired_loss"), "paired_loss", (df["quality"] - base) / [abs(b) for b in base])
    return df


def load_pair(teacher_path: str | None, student_spec: str, device: str = "cpu"):
    """(teacher, initial student): the student a model of the teacher's tokenizer, or `pruned[:K]` (every K-th
    decoder block of the teacher kept, K=2 by default; see model/pruning.py)."""
    from ..measurement.opd import check_teacher
    from ..model.pruning import depth_pruned, pruned_every
    from ..model.structure import list_units
    from ..model.student import Student, load_student

    teacher = load_student(teacher_path, device=device)
    if student_spec.startswith("pruned"):
        every = pruned_every(student_spec)
        model = depth_pruned(teacher.model, every)
        student = Student(model, teacher.tokenizer, list_units(model), student_spec, teacher.path, teacher.model_type)
    else:
        student = load_student(student_spec, device=device)
        check_teacher(student, teacher)
    return teacher, student


def check_objectives(objectives, train: TrainSettings) -> None:
    """Refuse, before any output, an unknown objective or GRPO settings it cannot run."""
    names = [parse_objective(o)[0] for o in objectives]
    if any(n in GROUPED for n in names) and train.batch_size % train.group_size:
        raise FP8ProbeError(
            f"`batch_size` {train.batch_size} must be a multiple of `group_size` {train.group_size} "
            "(GRPO and opd-pg sample group_size completions per prompt)"
        )
    if "opd-pg" in names and train.iterations < 2:
        raise FP8ProbeError(
            "opd-pg trains as verl's policy-gradient OPD does, with two or more PPO updates per generation "
            "(mini-batches or epochs), so the clip acts on the policy's own drift as well as the mismatch: "
            "add --iterations 2"
        )
