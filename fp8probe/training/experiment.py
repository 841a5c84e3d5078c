"""Calibrate the mismatch budget with short training runs at known rollout mismatch, paired by seed.

    fp8probe calibrate [--teacher T] [--student S|pruned[:K]] --out DIR [--objectives opd grpo grpo-is]
                       [--levels ...] [--seeds N] [--tolerance 0.02] [--quality auc|final] [--bracket 2]

Each run trains the student toward the teacher (an objective of runs.OBJECTIVES: on-policy
distillation, or GRPO rewarded by the teacher's log-likelihood, with or without importance-sampling correction),
its rollouts taken from a perturbed copy of the student at one *level*: seeded weight noise σ (a fresh draw each
step, as a rollout engine re-quantizing new weights makes a fresh error), the FP8 weights of every unit, an FP8 KV
cache, or k-step stale weights. The mismatch of every rollout batch is measured while it trains, on fp8probe's
one scale, so the x-axis is measured, not assumed.

The design is paired: every level runs each seed with the same data order, generation and evaluation seeds as
its mismatch-free twin, a run's quality loss is its relative rise over its twin's (runs.py), and the
budget's interval comes from a paired bootstrap over seeds (budget/fit.py). The tolerance is the user's choice
(default 2 %); the seeds' own spread is reported beside it.

The ladder is adaptive: after the levels asked for, the noise level between the last admitted and the first
rejected one (their geometric mean in σ, since the KL grows as σ²) is run and the budget refitted, until the edge
is bracketed within `bracket` (a factor on the measured mismatch) or `max_added` levels were added; with no level
rejected it climbs (σ x 3), with none admitted it descends (σ / 3). Every objective gets its own budget.

The directory:

    DIR/calibrate.json            the calibration (schema_version); calibrate.partial.json until it is done
    DIR/runs/<objective>/...      one directory per run (runs.py)
    DIR/runs.csv                  one row per finished run, in the format `fp8probe budget` reads
    DIR/budget.json               the first objective's budget; DIR/budget-<objective>.json for each
    DIR/calibration.png           quality loss vs measured mismatch per objective, the budgets, learning curves
                                  (drawn by apps/calibrate.py from what calibrate() returns)

A killed calibration resumes with --resume: finished runs are kept, an unfinished one starts again, and the
adaptive ladder takes the same decisions from the same results.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.files import atomic_write_text
from ..core.records import CalibrationRecord
from ..sources.sources import SourceSpec, parse_source
from .runs import (
    check_objectives,
    finished,
    load_pair,
    objective_loss,
    run_dir,
    runs_table,
    train_one,
)
from .settings import RunId, TrainSettings

BOOTSTRAP = 1000  # resamples behind every budget the ladder fits
PARTIAL = "calibrate.partial.json"  # the calibration while runs are missing: resume state (kept on failure)


@dataclass(frozen=True)
class Experiment:
    """A calibration resolved from CalibrateSettings: the pair, the objectives, the parsed ladder, the prompt split,
    one run's training settings and how the budget is read. Recorded in calibrate.json; a resume must match it."""

    teacher: str | None
    student: str
    levels: tuple[str, ...]
    seeds: int
    train: TrainSettings
    train_prompts: tuple[str, ...]
    heldout_prompts: tuple[str, ...]
    objectives: tuple[str, ...] = ("opd",)
    tolerance: float = 0.02
    quality: str = "auc"
    bracket: float = 2.0
    max_added: int = 3
    max_runs: int = 0
    max_hours: float = 0.0
    response: str = "gain"  # what a level's loss is (design.RESPONSES)
    save_checkpoints: bool = False  # the mismatch-free runs keep their student at the first, middle and last step
    pilot: str | None = None  # a budget.json whose variance components size the design (None: pair A's OPD)

    def record(self) -> CalibrationRecord:
        """calibrate.json's record of what was asked for (calibrate.partial.json's whole content)."""
        d = asdict(self)
        return CalibrationRecord(**{k: list(v) if isinstance(v, tuple) else v for k, v in d.items()})

    @classmethod
    def of(cls, record: CalibrationRecord, **changes) -> Experiment:
        """The Experiment a calibrate.json recorded (settings added since it was written take their defaults)."""
        names = {x.name for x in fields(cls)} - {"train"}
        train = TrainSettings(
            **{k: v for k, v in (record.train or {}).items() if k in {x.name for x in fields(TrainSettings)}}
        )
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in record.body().items() if k in names}
        return cls(**{**kw, "train": train, **changes})


HELDOUT_EVERY = 10  # every 10th prompt is held out: 24 of the 240 built-in training prompts


def split_prompts(prompts: list[str], heldout_every: int = HELDOUT_EVERY) -> tuple[list[str], list[str]]:
    """Every `heldout_every`-th prompt held out for evaluation, the rest trained on."""
    held = [p for i, p in enumerate(prompts) if i % heldout_every == heldout_every - 1]
    train = [p for i, p in enumerate(prompts) if i % heldout_every != heldout_every - 1]
    if not held or not train:
        raise FP8ProbeError(
            f"{len(prompts)} prompt(s) cannot be split into training and held-out prompts: "
            f"give at least {heldout_every}"
        )
    return train, held


def prepare(settings, train: TrainSettings) -> Experiment:
    """The Experiment from what a user asks for (CalibrateSettings): levels parsed, no level twice, objectives and
    training settings checked, every 10th prompt held out; before any output exists."""
    from ..model.prompts import TRAINING_PROMPTS
    from ..model.pruning import pruned_every
    from ..model.rollouts import read_prompts

    names = [parse_source(x).name for x in settings.levels]
    if len(set(names)) != len(names):
        raise FP8ProbeError(f"`levels` names a level twice ({', '.join(names)})")
    if "0" not in names:
        raise FP8ProbeError("`levels` needs 0: every level is compared with its mismatch-free twin")
    if settings.student.startswith("pruned"):
        pruned_every(settings.student)
    objectives = tuple(dict.fromkeys(o for given in settings.objectives for o in given.split(",") if o))
    check_objectives(objectives, train)
    tr, held = split_prompts(read_prompts(settings.prompts) if settings.prompts else list(TRAINING_PROMPTS))
    return Experiment(
        settings.teacher,
        settings.student,
        tuple(settings.levels),
        settings.seeds,
        train,
        tuple(tr),
        tuple(held),
        objectives,
        settings.tolerance,
        settings.quality,
        settings.bracket,
        settings.max_added,
        settings.max_runs,
        settings.max_hours,
        settings.response,
        settings.save_checkpoints,
        _pilot(settings.pilot),
    )


def _pilot(path: str | None) -> str | None:
    """A pilot budget.json whose variance components can size the design, checked before any output."""
    if path is None:
        return None
    from ..budget.fit import read_budget
    from ..budget.sizing import components_of

    if components_of(read_budget(path)) is None:
        raise FP8ProbeError(
            f"`pilot` {path} records no variance components (a budget.json 4 from `fp8probe calibrate` has them)"
        )
    return str(path)


def design_sizing(calibration: Experiment, dose, log=None) -> list | None:
    """What the design can decide at the asked tolerance and at 2, 5 and 10 % (budget/sizing.py, MODELLED), from the
    ladder's noise levels' doses (`dose(objective, level)`: measured before any run trains) and the pilot's
    components (or pair A's OPD); printed with `log`. None with fewer than two noise levels."""
    from ..budget.fit import read_budget
    from ..budget.sizing import PAIR_A_OPD, components_of, sizing, sizing_lines

    noise = [lv for lv in map(parse_source, calibration.levels) if lv.kind == "noise"]
    if len(noise) < 2 or not calibration.objectives:
        return None
    doses = [dose(calibration.objectives[0], lv)["dose"] for lv in noise]
    c = components_of(read_budget(calibration.pilot)) if calibration.pilot else PAIR_A_OPD
    rows = sizing(c, doses, calibration.seeds, sorted({calibration.tolerance, 0.02, 0.05, 0.10}))
    if log is not None:
        for line in sizing_lines(c, calibration.seeds, rows):
            log(line)
    return rows


def check_resume(out: Path, calibration: Experiment, resume: bool) -> None:
    """Refuse to mix calibrations: a directory holding one is resumed only with `resume` and the same settings
    (levels, seeds and objectives may grow; finished runs are kept)."""
    f = next((out / n for n in (PARTIAL, "calibrate.json") if (out / n).exists()), None)
    if f is None:
        if out.exists() and any(x for x in out.iterdir() if not x.name.startswith(".")) and not resume:
            raise FP8ProbeError(f"{out} exists and is not empty: choose another `out`")
        return
    if not resume:
        raise FP8ProbeError(f"{out} holds a calibration: pass `resume` to continue it, or another `out`")
    old = CalibrationRecord.read(f, "start in another `out`").to_json()  # a key it lacks: its default then
    new = json.loads(json.dumps(calibration.record().to_json()))
    if isinstance(old.get("train"), dict):  # settings added since it was written held their defaults then
        old["train"] = {**json.loads(json.dumps(asdict(TrainSettings()))), **old["train"]}
    for key in (
        "teacher",
        "student",
        "train",
        "train_prompts",
        "heldout_prompts",
        "tolerance",
        "quality",
        "bracket",
        "max_added",
    ):
        if old.get(key) != new.get(key):
            raise FP8ProbeError(
                f"{out} was calibrated with another {key.replace('_', ' ')}: resume with the same "
                "settings, or choose another `out`"
            )


def next_level(budget, table, bracket: float) -> SourceSpec | None:
    """The noise level the adaptive ladder runs next (module docstring), or None when the edge is bracketed within
    `bracket`. `table`: one objective's runs (runs_table), `budget`: its fit."""
    fitted = {round(lv["mismatch"], 15): lv["fitted"] for lv in budget.levels}
    noise = table[table["kind"] == "noise"].groupby("value")["mismatch"].first().sort_index()
    if noise.empty:
        return None
    ok = {sigma: fitted[round(m, 15)] <= budget.tolerance for sigma, m in noise.items()}
    admitted = [s for s in noise.index if ok[s]]
    rejected = [s for s in noise.index if not ok[s]]
    if not rejected:
        return SourceSpec("noise", _round(noise.index.max() * 3))
    if not admitted:
        return SourceSpec("noise", _round(noise.index.min() / 3))
    lo, hi = max(admitted), min(rejected)
    if hi < lo or noise[hi] <= bracket * noise[lo]:
        return None
    return SourceSpec("noise", _round(math.sqrt(lo * hi)))


def _round(x: float) -> float:
    return float(f"{x:.3g}")


class Ladder:
    """One calibration's decisions, given how a run is made: every level of the ladder for an objective, the adaptive
    levels, then the runs allocated where they narrow the benchmark dose most, with the stop rule. `run(objective,
    level, seed)` returns a run's run.json (runs.py: trained, found finished, or synthetic in
    benchmarks/budget_coverage.py), `dose(objective, level)` its level's dose (doses.py; None: the run-mean KL)."""

    def __init__(self, calibration: Experiment, run, dose=None, bootstrap: int = BOOTSTRAP, on_more=None):
        self.c, self._run, self._dose, self.bootstrap = calibration, run, dose, bootstrap
        self.on_more = on_more or (lambda runs: None)  # told how many runs the ladder added (a progress bar)
        self.levels = [parse_source(x) for x in calibration.levels]
        self.results: dict[tuple, dict] = {}
        self.spent: dict[str, dict] = {}  # per objective: the runs allocate() added

    def run(self, objective: str, level: SourceSpec, seed: int) -> dict:
        done = self._run(objective, level, seed)
        self.results[(objective, level.name, seed)] = done
        return done

    def table(self, objective: str, pairs: list):
        dose = None if self._dose is None else (lambda o, lv: self._dose(o, parse_source(lv))["dose"])
        return runs_table([self.results[(objective, lv.name, s)] for lv, s in pairs], self.c.quality, dose)

    def fit(self, df):
        from ..budget.fit import fit_budget
        from ..budget.settings import BudgetSettings

        return fit_budget(
            df, BudgetSettings(tolerance=self.c.tolerance, bootstrap=self.bootstrap, response=self.c.response)
        )

    def objective(self, objective: str):
        """Every level of the ladder for one objective, then the adaptive levels, then the runs that narrow the
        benchmark dose most (allocated); its runs table and budget."""
        levels, added = list(self.levels), []
        while True:
            for lv in levels:
                for seed in range(self.c.seeds):
                    self.run(objective, lv, seed)
                if lv.kind == "none":
                    self.check_gain(objective, lv)
            pairs = [(lv, s) for lv in levels for s in range(self.c.seeds)]
            df = self.table(objective, pairs)
            budget = self.fit(df)
            nxt = next_level(budget, df, self.c.bracket)
            if nxt is None or len(added) >= self.c.max_added or nxt.name in {lv.name for lv in levels}:
                break
            added.append(nxt.name)
            levels.append(nxt)
            self.on_more(self.c.seeds)
        df, budget, spent = self.allocate(objective, pairs, df, budget)
        self.spent[objective] = spent
        return df, budget, added + [name for name in spent["levels"] if name not in added]

    def check_gain(self, objective: str, zero) -> None:
        """With the gain response, refuse as soon as the mismatch-free runs are in (they train first) when one of
        them did not improve on the student before training: the fit would refuse it after every other level had
        trained (budget/design.py), and there is no training gain to lose."""
        if self.c.response != "gain":
            return
        df = self.table(objective, [(zero, s) for s in range(self.c.seeds)])
        sign = [-1.0 if not h else 1.0 for h in df["higher_is_better"]]
        if any((q - q0) * s <= 0 for q, q0, s in zip(df["quality"], df["quality_start"], sign)):
            raise FP8ProbeError(
                f"{objective}: a mismatch-free run did not improve on the quality before training "
                f"({df['quality_start'].iloc[0]:.4g}), so there is no training gain to lose (found before the other "
                "levels trained); train longer, or pass the relative response"
            )

    def allocate(self, objective: str, pairs: list, df, budget):
        """Runs added where they narrow the benchmark dose's interval most (dose.allocate: a new noise level at the
        current BMD, run with the ladder's seeds, or one more seed at a tested level, with its mismatch-free twin;
        at the level the seed bootstrap's tail comes from when that end decides the interval), refitting after
        each, until `max_runs` (or `max_hours`) is spent. The stop rule is the preset run budget alone: stopping when
        the interval first looks narrow enough is optional stopping, and its intervals under-cover. The decisions
        follow from the results alone, so a resumed calibration takes them again."""
        from ..budget.dose import allocate, binding
        from ..budget.fit import ruler_design

        spent = {
            "runs": 0,
            "levels": [],
            "seeds": [],
            "hours": 0.0,
            "stop_rule": "the preset run budget (max_runs, max_hours): never the interval's width",
        }
        start = time.time()
        while self.c.max_runs and spent["runs"] < self.c.max_runs:
            if self.c.max_hours and (time.time() - start) / 3600 >= self.c.max_hours:
                spent["stopped"] = "max_hours"
                break
            fitted = (budget.dose_response or {}).get("rulers", {}).get("noise")
            design, rows, pairing = ruler_design(df, fitted)
            step = allocate(
                design, rows, self.c.tolerance, runs=1, bind=binding(fitted), response=self.c.response, pairing=pairing
            )
            if not step:
                spent["stopped"] = "no fit to allocate from"
                break
            todo = self._next_runs(pairs, df, step[0])
            left = self.c.max_runs - spent["runs"]
            if len(todo) > left:  # a new level takes the seeds the cap allows; a twin is not run without its level
                todo = todo[:left] if step[0]["new_level"] else []
                if not todo:
                    spent["stopped"] = "max_runs"
                    break
            for lv, seed in todo:
                self.run(objective, lv, seed)
                pairs.append((lv, seed))
                spent["runs"] += 1
            self.on_more(len(todo))
            if not todo:
                spent["stopped"] = "nothing left to run at the allocated level"
                break
            if step[0]["new_level"]:
                spent["levels"].append(todo[-1][0].name)
            spent["seeds"].append({"level": todo[-1][0].name, "seeds": [s for lv, s in todo if lv.kind != "none"]})
            df = self.table(objective, pairs)
            budget = self.fit(df)
        else:
            if self.c.max_runs:
                spent["stopped"] = "max_runs"
        spent["hours"] = (time.time() - start) / 3600
        return df, budget, spent

    def _next_runs(self, pairs: list, df, step: dict) -> list:
        """The (level, seed) runs one allocation step asks for: a new noise level (σ read off the tested levels'
        dose, log-log) with the ladder's seeds, or the next seed at a tested level, its mismatch-free twin first when
        that seed has none."""
        noise = df[df["kind"] == "noise"].groupby("value")["mismatch"].mean().sort_index()
        if step["new_level"]:
            level = SourceSpec("noise", _round(sigma_for(noise, step["mismatch"])))
            done = {s for lv, s in pairs if lv.name == level.name}
            return [(level, s) for s in range(self.c.seeds) if s not in done]
        level = next(
            lv
            for lv, _ in pairs
            if lv.kind == "noise"
            and abs(float(noise.get(lv.value, -1)) - step["mismatch"]) <= 1e-9 * max(1.0, step["mismatch"])
        )
        seeds = {s for lv, s in pairs if lv.name == level.name}
        seed = next(s for s in range(10**6) if s not in seeds)
        twin = next(lv for lv, _ in pairs if lv.kind == "none")
        has_twin = any(lv.name == twin.name and s == seed for lv, s in pairs)
        return ([] if has_twin else [(twin, seed)]) + [(level, seed)]


class _Trainer:
    """The runs of a calibration trained for real: the pair loaded once, each run trained or found finished on disk,
    each level's dose measured once (doses.py), the progress bar."""

    def __init__(self, calibration: Experiment, out: Path, device: str, progress: bool, log):
        from tqdm.auto import tqdm

        from .doses import Doses
        from .runs import states_along

        self.c, self.out, self.device, self.log = calibration, out, device, log
        self.teacher, self.initial = load_pair(calibration.teacher, calibration.student, device)
        levels = [parse_source(x) for x in calibration.levels]
        for lv in levels:  # a level the student cannot take is refused before any run starts
            lv.rollout(self.initial, 0)
        todo = [(o, lv, s) for o in calibration.objectives for lv in levels for s in range(calibration.seeds)]
        self.bar = tqdm(
            total=sum(calibration.train.steps for o, lv, s in todo if finished(out, o, lv, s) is None),
            desc="calibrate",
            unit="step",
            disable=not progress,
        )
        self.doses = Doses(
            self.initial,
            out / "doses.json",
            lambda o, seed, steps, folder: states_along(
                self.teacher, self.initial, o, seed, calibration, steps, folder, device
            ),
            calibration.train,
        )
        self.start = None  # the held-out evaluation before training: one student, one seed, the same for every run

    def more(self, runs: int) -> None:
        self.bar.total += self.c.train.steps * runs
        self.bar.refresh()

    def dose(self, objective: str, level: SourceSpec) -> dict:
        return self.doses.dose(objective, level)

    def run(self, objective: str, level: SourceSpec, seed: int) -> dict:
        done = finished(self.out, objective, level, seed)
        if done is None:
            if self.start is None:
                from .opd import heldout_quality

                self.start = heldout_quality(self.initial, self.teacher, list(self.c.heldout_prompts), self.c.train)
            last = [0]

            def on_step(step, rkl):
                self.bar.update(step - last[0])
                last[0] = step
                self.bar.set_postfix_str(f"{objective} level {level.name} seed {seed} held-out rKL {rkl:.3f}")

            done = train_one(
                self.teacher,
                self.initial,
                RunId(objective, level, seed),
                self.c,
                self.out,
                on_step=on_step,
                device=self.device,
                start=self.start,
            )
            if self.log is not None:
                q = done.quality
                self.log(
                    f"{objective} level {level.name} seed {seed}: mismatch {done.mismatch['kl_q_p']:.4g}, "
                    f"held-out reverse KL {done.quality_start['reverse_kl']:.4f} -> {q['final']:.4f} "
                    f"(mean along training {q['auc']:.4f}; {done.seconds:.0f} s)"
                )
        return done


def sigma_for(noise, mismatch: float) -> float:
    """The noise σ expected to give `mismatch`: log-log interpolation between the tested noise levels (σ -> their
    measured mismatch), the nearest two beyond their range (the mismatch grows about as σ²)."""
    xs = [(math.log(s), math.log(m)) for s, m in noise.items() if s > 0 and m > 0]
    if len(xs) < 2:
        s, m = next(iter(noise.items()))
        return s * math.sqrt(mismatch / m)
    t = math.log(mismatch)
    i = next((i for i in range(1, len(xs)) if xs[i][1] >= t), len(xs) - 1)
    (a, fa), (b, fb) = xs[i - 1], xs[i]
    return math.exp(a + (t - fa) * (b - a) / (fb - fa)) if fb != fa else math.exp(b)


def calibrate(calibration: Experiment, out: Path, device: str = "cpu", progress: bool = True, log=None) -> dict:
    """Every objective's ladder (finished runs kept), then runs.csv and the budgets (each naming its student,
    teacher, objective and dose); returns what calibration.png draws (apps/calibrate.py draws it)."""
    import pandas as pd

    from ..budget.fit import CHECK_SCALE, budget_ratio
    from ..model.identity import identity
    from .doses import HOW, mapping

    trainer = _Trainer(calibration, out, device, progress, log)
    ladder = Ladder(calibration, trainer.run, trainer.dose, on_more=trainer.more)
    out.mkdir(parents=True, exist_ok=True)
    calibration.record().write(out / PARTIAL)
    sized = design_sizing(calibration, trainer.dose, log)  # before any run trains (none with a refit)
    student, teacher = identity(trainer.initial), identity(trainer.teacher)
    if calibration.teacher is not None and student["name"].startswith("pruned"):
        student["name"] = f"{student['name']} of {calibration.teacher}"
    tables, budgets, added = [], {}, {}
    for objective in calibration.objectives:
        df, budgets[objective], added[objective] = ladder.objective(objective)
        tables.append(df)
    trainer.bar.close()
    kept = _kept_objectives(out, calibration)  # with no objectives (refit): every objective of runs.csv
    for objective, (table, extra) in kept.items():  # a resume of fewer objectives keeps the others' runs
        table = table.assign(
            mismatch=[trainer.dose(o, parse_source(lv))["dose"] for o, lv in zip(table["objective"], table["level"])]
        )
        budgets[objective] = ladder.fit(table)
        tables.append(table)
        added[objective] = extra.get("added_levels", [])
        ladder.spent.setdefault(objective, extra.get("allocated", {}))
    for objective, b in budgets.items():
        n = sum(len(t[t["objective"] == objective]) for t in tables)
        budgets[objective] = replace(
            b,
            source=f"fp8probe calibrate ({objective}): {n} runs in {out}",
            objective=objective,
            student=student,
            teacher=teacher,
            dose=HOW,
            loss=objective_loss(objective),
            dose_scale=dict(CHECK_SCALE),
        )
    df = pd.concat(tables, ignore_index=True)
    atomic_write_text(out / "runs.csv", df.to_csv(index=False))
    for i, (objective, b) in enumerate(budgets.items()):
        b.write(out / f"budget-{objective}.json")
        if i == 0:
            b.write(out / b.KIND)
    curves = {
        (o, lv, s): run_dir(out, o, parse_source(lv), s) / "eval.csv"
        for o, lv, s in zip(df["objective"], df["level"], df["seed"])
    }
    objectives = list(budgets)
    first = budgets[objectives[0]]
    ratios = [{**budget_ratio(first, budgets[o]), **sigma_ratio(df, first, budgets[o])} for o in objectives[1:]]
    done = replace(
        calibration.record(),
        objectives=objectives,
        added_levels=added,
        allocated=ladder.spent,
        ratios=ratios,
        kept_objectives=sorted(kept),
        dose=HOW,
        dose_mapping=mapping(df),
        sizing=sized if sized is not None else _recorded_sizing(out),
    )
    done.write(out / CalibrationRecord.KIND)
    (out / PARTIAL).unlink()
    return {
        "runs": df,
        "budgets": budgets,
        "added": added,
        "allocated": ladder.spent,
        "ratios": ratios,
        "curves": curves,  # (objective, level, seed) -> its run's learning curve (eval.csv), for calibration.png
    }


def _recorded_sizing(out: Path):
    """The sizing a calibration in `out` printed before it trained (a refit keeps it)."""
    f = out / CalibrationRecord.KIND
    return json.loads(f.read_text(encoding="utf-8")).get("sizing") if f.exists() else None


def read_experiment(out: Path, response: str) -> Experiment:
    """The Experiment a calibration in `out` ran (its calibrate.json; version 2 too), with every objective left to
    its runs.csv (`calibrate(refit)`: nothing is trained) and the budgets read on `response`."""
    f = Path(out) / "calibrate.json"
    if not f.is_file():
        raise FP8ProbeError(f"no calibrate.json in {out}: `refit` refits a finished calibration; run it first")
    if not (Path(out) / "runs.csv").is_file():
        raise FP8ProbeError(
            f"no runs.csv in {out}: `refit` refits the runs a finished calibration listed there; "
            "run `fp8probe calibrate --resume` to finish it first"
        )
    return Experiment.of(CalibrationRecord.read(f, "run `fp8probe calibrate` again"), objectives=(), response=response)


def sigma_ratio(df, a, b) -> dict:
    """The two budgets' ratio on the noise ruler's σ: each BMD's σ read off that objective's tested noise levels
    (log-log, sigma_for), their ratio (the dose grows about as σ², so this is about the square root of the doses')."""
    out = {}
    for key, x in (("a", a), ("b", b)):
        noise = df[(df["objective"] == x.objective) & (df["kind"] == "noise")].groupby("value")["mismatch"].mean()
        if x.method != "benchmark dose" or noise.empty:
            return {"sigma_ratio": None}
        out[key] = sigma_for(noise.sort_index(), x.value)
    return {"sigma": {a.objective: out["a"], b.objective: out["b"]}, "sigma_ratio": out["a"] / out["b"]}


def _kept_objectives(out: Path, calibration: Experiment) -> dict:
    """objective -> (its rows of runs.csv, what calibrate.json recorded for it) for the objectives a previous
    calibration in `out` ran and this one (a resume) does not: their runs stay in runs.csv, their budgets are
    refitted."""
    import pandas as pd

    runs = out / "runs.csv"
    if not runs.exists():
        return {}
    old = pd.read_csv(runs, dtype={"level": str})
    if "mismatch_run_mean" not in old.columns:  # runs.csv before doses.py: its `mismatch` was the run-mean KL
        old.insert(
            old.columns.get_loc("mismatch") + 1,
            "mismatch_run_mean",
            old.groupby(["objective", "level"])["mismatch_run"].transform("mean"),
        )
    info = {}
    for name in ("calibrate.json", PARTIAL):
        if (out / name).exists():
            info = json.loads((out / name).read_text(encoding="utf-8"))
            break
    kept = {}
    listed = [o for o in info.get("objectives", []) if o in set(old["objective"].astype(str))]
    for objective in dict.fromkeys([*listed, *old["objective"].astype(str)]):  # calibrate.json's order first
        if objective not in calibration.objectives:
            extra = {k: (info.get(k) or {}).get(objective) for k in ("added_levels", "allocated")}
            kept[objective] = (
                old[old["objective"].astype(str) == objective].reset_index(drop=True),
                {k: v for k, v in extra.items() if v is not None},
            )
    return kept


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
