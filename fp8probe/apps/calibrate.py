"""Calibrate the mismatch budget with short on-policy distillation runs at known rollout mismatch.

    fp8probe calibrate --teacher T [--student S|pruned] --out DIR [--levels ...] [--steps N] [--seeds K]

Each run trains the student toward the teacher with TRL's DistillationTrainer (opd_train.py: reverse KL on the
student's own samples), its rollouts taken from a perturbed copy of the student at one *level*: seeded weight
noise σ by default (a fresh draw each step, as a rollout engine re-quantizing new weights makes a fresh error),
or the FP8 weights of every unit, an FP8 KV cache, k-step stale weights. The mismatch of every rollout batch
is measured while it trains, on fp8probe's one scale, so the x-axis is measured, not assumed; the quality is
the held-out reverse KL to the teacher at the end (and the teacher's log-likelihood, along the way).

The run directory:

    DIR/calibrate.json              settings (schema_version); calibrate.partial.json until every run is done
    DIR/runs/<level>-seed<k>/       one run: steps.csv (loss and rollout mismatch per step), eval.csv
                                    (held-out quality every --eval-every steps), run.json once finished
    DIR/runs.csv                    one row per finished run, in the format `fp8probe budget` reads
    DIR/budget.json                 the budget fitted to them (budget.py), when the table allows a fit
    DIR/calibration.png             quality vs measured mismatch, the budget line, marked configurations

A killed calibration resumes with --resume: finished runs are kept, an unfinished one starts again.
In runs.csv a run's `mismatch` is its level's mean measured KL(q‖p) over the seeds (`mismatch_run` its own),
so that `fp8probe budget` pools the seeds of a level into one point.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.artifacts import version
from ..core.errors import FP8ProbeError
from .sources import SourceSpec, parse_source
from .training import TrainSettings

SCHEMA_VERSION = version("calibrate.json")
MIN_TOLERANCE = 0.01  # the tolerance when the mismatch-free runs agree closer than this (or there is one)
RUN_COLUMNS = ["level", "kind", "value", "seed", "metric", "mismatch", "mismatch_run", "k3", "quality",
               "higher_is_better", "quality_start", "teacher_logp", "teacher_logp_start", "steps",
               "rollout_tokens", "seconds"]
QUALITY = "held-out reverse KL(student ‖ teacher) per token, full vocabulary"


def perturbation_maker(level: SourceSpec, student, seed: int):
    """step -> Perturbation of the rollout engine at that step (stale levels get their weights from the
    opd_train.Perturber)."""
    from ..core.schemes import KVCacheScheme, Scheme
    from ..measurement.perturbation import Perturbation

    units = student.unit_names
    if level.kind == "noise":
        return lambda step: Perturbation(noise=level.value, noise_units=units, noise_seed=seed * 1_000_003 + step)
    if level.kind == "fp8":
        from ..model.structure import scheme_blockers

        scheme = Scheme.from_name(level.scheme)
        blocked = scheme_blockers(student.quantizable, scheme)  # groups its kernels refuse stay BF16, as in a sweep
        units = tuple(u.name for u in student.quantizable if u.group not in blocked)
        if not units:
            raise FP8ProbeError(f"`levels` {level.name}: {level.scheme} fits none of the student's units "
                                f"({next(iter(blocked.values()))}); use fp8 (FP8_DYNAMIC)")
        return lambda step: Perturbation(units=units, scheme=scheme)
    if level.kind == "kv":
        from dataclasses import replace

        kv = replace(KVCacheScheme.from_name(level.scheme), scale="unit")
        layers = student.layers
        return lambda step: Perturbation(kv_layers=layers, kv=kv)
    return lambda step: Perturbation()


@dataclass(frozen=True)
class Calibration:
    """A calibration resolved from CalibrateSettings: the pair, parsed levels, the prompt split and one run's
    training settings. Recorded in calibrate.json; a resume must match it."""

    teacher: str
    student: str
    levels: tuple[str, ...]
    seeds: int
    train: TrainSettings
    train_prompts: tuple[str, ...]
    heldout_prompts: tuple[str, ...]

    def to_json(self) -> dict:
        d = asdict(self)
        d["train"] = asdict(self.train)
        return {"schema_version": SCHEMA_VERSION, **d}


def split_prompts(prompts: list[str], heldout_every: int = 5) -> tuple[list[str], list[str]]:
    """Every `heldout_every`-th prompt held out for evaluation, the rest trained on."""
    held = [p for i, p in enumerate(prompts) if i % heldout_every == heldout_every - 1]
    train = [p for i, p in enumerate(prompts) if i % heldout_every != heldout_every - 1]
    if not held or not train:
        raise FP8ProbeError(f"{len(prompts)} prompt(s) cannot be split into training and held-out prompts: "
                            f"give at least {heldout_every}")
    return train, held


PARTIAL = "calibrate.partial.json"  # the settings while runs are missing: resume state (kept on failure)


def check_resume(out: Path, calibration: Calibration, resume: bool) -> None:
    """Refuse to mix calibrations: a directory holding one is resumed only with --resume and the same settings
    (levels and seeds may grow; finished runs are kept)."""
    f = next((out / n for n in (PARTIAL, "calibrate.json") if (out / n).exists()), None)
    if f is None:
        if out.exists() and any(x for x in out.iterdir() if not x.name.startswith(".")) and not resume:
            raise FP8ProbeError(f"{out} exists and is not empty: choose another `out`")
        return
    if not resume:
        raise FP8ProbeError(f"{out} holds a calibration: pass `resume` to continue it, or another `out`")
    try:
        old = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FP8ProbeError(f"{f} is not valid JSON ({e}): start in another `out`") from e
    new = json.loads(json.dumps(calibration.to_json()))
    for key in ("schema_version", "teacher", "student", "train", "train_prompts", "heldout_prompts"):
        if old.get(key) != new.get(key):
            raise FP8ProbeError(f"{out} was calibrated with another {key.replace('_', ' ')}: resume with the same "
                                "settings, or choose another `out`")


def run_dir(out: Path, level: SourceSpec, seed: int) -> Path:
    return out / "runs" / f"{level.slug}-seed{seed}"


def finished(out: Path, level: SourceSpec, seed: int) -> dict | None:
    f = run_dir(out, level, seed) / "run.json"
    if not f.exists():
        return None
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def train_one(teacher, initial_student, level: SourceSpec, seed: int, calibration: Calibration, out: Path,
              on_step=None, device: str = "cpu") -> dict:
    """One OPD run at one level and seed; writes its run directory and returns its run.json."""
    import copy

    import pandas as pd
    from transformers import TrainerCallback

    from ..core.files import atomic_write_json, atomic_write_text
    from .opd_train import Perturber, heldout_quality, make_trainer, trainable_student

    d = run_dir(out, level, seed)
    d.mkdir(parents=True, exist_ok=True)
    student = trainable_student(copy.deepcopy(initial_student.model), initial_student.tokenizer,
                                f"{calibration.student}@{level.name}")
    tr = calibration.train
    evals: list[dict] = []

    def evaluate(step):
        evals.append({"step": step, **heldout_quality(student, teacher, list(calibration.heldout_prompts), tr)})

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            evaluate(0)

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % tr.eval_every == 0 or state.global_step == tr.steps:
                evaluate(state.global_step)
            if on_step is not None:
                on_step(state.global_step, evals[-1]["reverse_kl"])

    perturber = None
    if level.kind != "none":
        perturber = Perturber(student.model, perturbation_maker(level, student, seed),
                              stale=int(level.value) if level.kind == "stale" else 0)
    t0 = time.perf_counter()
    trainer = make_trainer(student, teacher, list(calibration.train_prompts), tr, seed, str(d / "trl"), perturber,
                           callbacks=[Progress()], device=device)
    trainer.train()
    seconds = time.perf_counter() - t0
    if (d / "trl").is_dir() and not any((d / "trl").iterdir()):
        (d / "trl").rmdir()  # TRL makes its output_dir; nothing is saved there
    losses = [{"step": h["step"], "loss": h["loss"]} for h in trainer.state.log_history if "loss" in h]
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
        mism = {"kl_q_p": float((m["kl_q_p"] * w).sum()), "k3": float((m["k3"] * w).sum()),
                "tokens": int(m["tokens"].sum())}
    result = {"schema_version": SCHEMA_VERSION, "level": level.name, "kind": level.kind, "value": level.value,
              "scheme": level.scheme, "seed": seed, "steps": tr.steps, "seconds": round(seconds, 2),
              "mismatch": mism, "quality_start": evals[0], "quality_end": evals[-1], "losses": [x["loss"] for x in losses]}
    atomic_write_json(d / "run.json", result)
    return result


def runs_table(results: list[dict]):
    """runs.csv: one row per run; `mismatch` is the level's mean measured kl_q_p over its seeds (what
    `fp8probe budget` pools), `mismatch_run` the run's own."""
    import pandas as pd

    rows = []
    for r in results:
        rows.append({"level": r["level"], "kind": r["kind"], "value": r["value"], "seed": r["seed"], "metric": "kl_q_p",
                     "mismatch_run": r["mismatch"]["kl_q_p"], "k3": r["mismatch"]["k3"],
                     "quality": r["quality_end"]["reverse_kl"], "higher_is_better": False,
                     "quality_start": r["quality_start"]["reverse_kl"], "teacher_logp": r["quality_end"]["teacher_logp"],
                     "teacher_logp_start": r["quality_start"]["teacher_logp"], "steps": r["steps"],
                     "rollout_tokens": r["mismatch"]["tokens"], "seconds": r["seconds"]})
    df = pd.DataFrame(rows, columns=[c for c in RUN_COLUMNS if c != "mismatch"])
    df.insert(RUN_COLUMNS.index("mismatch"), "mismatch", df.groupby("level")["mismatch_run"].transform("mean"))
    return df


def load_pair(teacher_path: str | None, student_spec: str, device: str = "cpu"):
    """(teacher, initial student): the student a model of the teacher's tokenizer, or `pruned[:K]` (every K-th
    decoder block of the teacher kept, K=2 by default; see student.depth_pruned)."""
    from ..measurement.opd import check_teacher
    from ..model.pruning import depth_pruned
    from ..model.structure import list_units
    from ..model.student import Student, load_student

    teacher = load_student(teacher_path, device=device)
    if student_spec.startswith("pruned"):
        _, _, k = student_spec.partition(":")
        try:
            every = int(k) if k else 2
        except ValueError:
            raise FP8ProbeError(f"`student` {student_spec}: pruned:K takes a whole number K >= 2") from None
        model = depth_pruned(teacher.model, every)
        student = Student(model, teacher.tokenizer, list_units(model), student_spec, teacher.path, teacher.model_type)
    else:
        student = load_student(student_spec, device=device)
        check_teacher(student, teacher)
    return teacher, student


def seed_tolerance(df) -> float:
    """The default tolerance: the relative range (max - min) / mean of the mismatch-free runs' quality, i.e. how
    far two runs without any mismatch land apart by their seeds alone (at least MIN_TOLERANCE). A level is
    admitted when its fitted loss stays within what the seeds alone produce."""
    q = df[df["mismatch"] == 0]["quality"]
    if len(q) < 2 or q.mean() == 0:
        return MIN_TOLERANCE
    return max(MIN_TOLERANCE, float((q.max() - q.min()) / abs(q.mean())))


def calibrate(calibration: Calibration, out: Path, device: str = "cpu", progress: bool = True,
              tolerance: float | None = None, marks=(), log=None) -> dict:
    """Every level x seed run (finished ones kept), then runs.csv, budget.json and calibration.png. Without a
    `tolerance`, the seeds' own spread at level 0 (seed_tolerance)."""
    from tqdm.auto import tqdm

    from ..core.files import atomic_write_json, atomic_write_text
    from ..recipe.budget import fit_budget

    levels = [parse_source(x) for x in calibration.levels]
    todo = [(lv, s) for lv in levels for s in range(calibration.seeds)]
    teacher, initial = load_pair(calibration.teacher, calibration.student, device)
    for lv in levels:  # a level the student cannot take is refused before any run starts
        perturbation_maker(lv, initial, 0)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / PARTIAL, calibration.to_json())
    results = []
    total = sum(calibration.train.steps for lv, s in todo if finished(out, lv, s) is None)
    bar = tqdm(total=total, desc="calibrate", unit="step", disable=not progress)
    for lv, seed in todo:
        done = finished(out, lv, seed)
        if done is None:
            bar.set_postfix_str(f"level {lv.name} seed {seed}")
            last = [0]

            def on_step(step, rkl, last=last, lv=lv, seed=seed):
                bar.update(step - last[0])
                last[0] = step
                bar.set_postfix_str(f"level {lv.name} seed {seed} held-out rKL {rkl:.3f}")

            done = train_one(teacher, initial, lv, seed, calibration, out, on_step, device)
            if log is not None:
                log(f"level {lv.name} seed {seed}: mismatch {done['mismatch']['kl_q_p']:.4g}, held-out reverse KL "
                    f"{done['quality_start']['reverse_kl']:.4f} -> {done['quality_end']['reverse_kl']:.4f} "
                    f"({done['seconds']:.0f} s)")
        results.append(done)
    bar.close()
    df = runs_table(results)
    atomic_write_text(out / "runs.csv", df.to_csv(index=False))
    budget = None
    if (df["mismatch"] == 0).any() and df["mismatch"].nunique() > 1:
        if tolerance is None:
            tolerance = seed_tolerance(df)
        budget = fit_budget(df[["level", "seed", "metric", "mismatch", "quality", "higher_is_better"]],
                            tolerance=tolerance)
        budget = type(budget)(**{**budget.__dict__, "source": f"fp8probe calibrate: {len(df)} OPD runs in {out}"})
        atomic_write_json(out / "budget.json", budget.to_json())
    from ..plots.figures import calibration_plot

    calibration_plot(df, out / "calibration.png", budget=budget, marks=read_marks(marks), quality=QUALITY,
                     curves={(r["level"], r["seed"]): run_dir(out, parse_source(r["level"]), r["seed"]) / "eval.csv"
                             for r in results})
    atomic_write_json(out / "calibrate.json", calibration.to_json())
    (out / PARTIAL).unlink()
    return {"runs": df, "budget": budget}


def read_marks(paths) -> list[tuple[str, float]]:
    """(label, measured kl_q_p) of configurations to mark on the curve: a recipe.json (its measured value), a
    ladder.csv (each source), or a sweep's sensitivity.csv / directory (its whole-model rows)."""
    import pandas as pd

    marks = []
    for p in map(Path, paths):
        if p.is_dir():
            p = next((p / f for f in ("recipe.json", "ladder.csv", "sensitivity.csv") if (p / f).exists()), p)
        if p.name.endswith(".json") and p.is_file():
            d = json.loads(p.read_text(encoding="utf-8"))
            if d.get("metric") != "kl_q_p" and "measured_metrics" not in d:
                raise FP8ProbeError(f"`mark` {p}: a recipe.json measured on kl_q_p is needed")
            value = d.get("measured_metrics", {}).get("kl_q_p", d.get("measured"))
            marks.append((f"recipe {p.parent.name}", float(value)))
        elif p.name == "ladder.csv" and p.is_file():
            df = pd.read_csv(p)
            marks += [(str(r["source"]), float(r["kl_q_p"])) for _, r in df.iterrows() if r.get("kind") != "noise"]
        elif p.name == "sensitivity.csv" and p.is_file():
            df = pd.read_csv(p)
            names = {"model.fp8_all": "all units FP8", "model.fp8_all_kv": "all units + KV FP8"}
            marks += [(names[r["unit"]], float(r["kl_q_p"])) for _, r in df.iterrows() if r["unit"] in names]
        else:
            raise FP8ProbeError(f"`mark` {p}: give a recipe.json, a ladder.csv or a sweep's sensitivity.csv")
    return marks


def prepare(teacher: str | None, student: str, levels, seeds: int, train: TrainSettings, prompts: str | None = None):
    """The Calibration from what a user names (levels parsed, no level twice, the training settings
    checked, every 5th prompt held out), before any output exists."""
    from ..model.prompts import BUILTIN_PROMPTS
    from ..model.rollouts import read_prompts
    from .sources import CALIBRATION_LEVELS

    levels = tuple(levels or CALIBRATION_LEVELS)
    names = [parse_source(x).name for x in levels]
    if len(set(names)) != len(names):
        raise FP8ProbeError(f"`levels` names a level twice ({', '.join(names)})")
    tr, held = split_prompts(read_prompts(prompts) if prompts else list(BUILTIN_PROMPTS))
    return Calibration(teacher, student, levels, seeds, train, tuple(tr), tuple(held))


def run_calibrate(calibration: Calibration, out, resume: bool = False, device: str = "cpu", progress: bool = True,
                  tolerance: float | None = None, marks=(), log=None) -> dict:
    """`fp8probe calibrate`: every run, runs.csv, budget.json and calibration.png in `out` (calibrate()), after
    TRL, the marks and the resume state are checked; a failure keeps the finished runs for `resume`."""
    from ..core.files import check_writable, output_dir
    from .opd_train import require_trl

    require_trl()
    read_marks(marks)
    out = check_writable(out)
    check_resume(out, calibration, resume)
    with output_dir(out, keep=("runs",)) as d:
        return calibrate(calibration, d, device=device, progress=progress, tolerance=tolerance, marks=marks, log=log)


def describe(res: dict, seeds: int, out, seconds: float) -> str:
    """What `fp8probe calibrate` prints: each level's measured mismatch and quality, then the budget."""
    df, b = res["runs"], res["budget"]
    means = df.groupby("level", sort=False).agg(mismatch=("mismatch", "first"), quality=("quality", "mean"))
    lines = [f"calibrate: {len(df)} OPD runs ({len(means)} levels x {seeds} seeds) in {seconds:.0f} s -> {out}"]
    lines += [f"  level {level:<10} mismatch kl_q_p {r['mismatch']:.4g}   held-out reverse KL {r['quality']:.4f}"
              for level, r in means.iterrows()]
    if b is not None:
        lo, hi = b.interval or (float("nan"), float("nan"))
        lines.append(f"budget: kl_q_p <= {b.value:.4g} (90 % bootstrap interval {lo:.4g} .. {hi:.4g}) at a relative "
                     f"quality loss <= {b.tolerance:g} -> {Path(out) / 'budget.json'}")
    return "\n".join(lines)
