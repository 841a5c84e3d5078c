"""The mismatch budget: the largest rollout mismatch that training runs tolerate, read off real runs.

    fp8probe budget RUNS.csv --out DIR [--tolerance 0.02] [--objective opd]

RUNS.csv has one row per training run: `mismatch` (the dose: the run's rollout mismatch on one of our metrics, 0
for mismatch-free runs), `quality` (its quality), `quality_start` (the quality before training, the same for every
run: the gain response needs it), and optionally `metric` (which metric `mismatch` is; one value for the whole
table, default kl_q_p), `seed`, `objective` (pick one with `objective` when there are several),
`higher_is_better` (the quality's direction, default true) and `kind` / `level` (which source a level is).

The response (design.py) is the share of the training gain a run lost against its mismatch-free twin, (q_twin − q)
/ (q_twin − q_start); `response="relative"` takes budget.json 3's relative shortfall instead. With seeds whose
every seed has its mismatch-free twin (as `fp8probe calibrate` runs them) the design is paired: the seed is a random
effect, its runs resampled together, and the baseline is each seed's own twin or the twins' mean, whichever the
estimated variance components say is steadier (both recorded). Otherwise (unpaired) a run's loss is against the
mean of the mismatch-free runs, and runs are resampled within each level.

The budget is a benchmark dose (budget/dose.py): monotone dose–response families (linear, power, exponential,
Hill; zero loss at zero mismatch) fitted to every level's mean loss, each weighted by its own spread, averaged with
Akaike weights; the budget is the mismatch at which the averaged curve reaches the tolerance (a user's choice;
default 2 % relative), its interval (BMDL, BMDU) the paired bootstrap over seeds. Every level informs the curve, so
one noisy low level no longer decides the edge. The ruler is the noise levels (a table with a `kind` column: the
mismatch-free and noise levels); every other kind of level with runs (stale weights) gets a curve of its own, and
levels of sources no ruler stands for (FP8, the FP8 KV cache) are read against the noise ruler's prediction at
their measured mismatch, paired by seed. When no family fits (every one tested fails its lack-of-fit test), the
budget falls back to the isotonic fit: the largest tested level whose non-decreasing (pool-adjacent-violators) fit
of the mean loss stays within the tolerance, as budget.json 2 had it; `method` says which. budget.json also holds
each level's mean loss with its interval and both fits, and the seed spread (how far the mismatch-free runs land
apart by their seeds alone: reported beside the tolerance, not used as it).

Without runs, `default_budget()` is a published rule of thumb (NeMo-RL calls a generation KL below 1e-3
acceptable), labelled uncalibrated in every output that uses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.artifacts import Record, optional, read_artifact
from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS, VERL_METRICS
from ..core.stats import expansion
from .settings import BudgetSettings


@dataclass(frozen=True)
class Budget(Record):
    """A mismatch budget: budget.json's record (written by `fp8probe budget` and `calibrate`; versions 1-3 read too),
    or a number given on the command line (uncalibrated)."""

    KIND = "budget.json"
    metric: str
    value: float
    calibrated: bool
    source: str
    interval: tuple[float, float] | None = None
    tolerance: float | None = None
    runs: list | None = None  # per run fitted: its level, seed, mismatch and loss (runs.csv's rows)
    paired: bool = False  # losses against each seed's mismatch-free twin (True) or the mean of those runs
    levels: list | None = None  # per tested level: mismatch, mean loss, its interval, the isotonic fit, runs
    seed_spread: float | None = None  # relative range of the mismatch-free runs' quality (seeds alone)
    other_levels: list | None = None  # levels of other sources (stale:K, fp8, kv): their loss, not fitted
    method: str = "isotonic"  # "benchmark dose" (dose.py's averaged curve) or "isotonic" (no family fits; schema <3)
    dose_response: dict | None = None  # per ruler: families, fits, the BMD and its interval, the curve; predictions
    response: str = "relative"  # what a level's loss is (design.RESPONSES); budget.json < 4: relative
    censored: bool = False  # the BMD lies beyond the highest tested dose: the value is only "> value"
    interval_censored: bool = False  # the interval's upper end is the highest tested dose: "> its upper end"
    objective: str | None = None  # the training objective the runs trained (calibrate's, or the table's)
    student: dict | None = None  # the student the budget was calibrated on: name, sha256 (model/identity.py)
    teacher: dict | None = None  # ... and its teacher
    dose: str | None = None  # what the dose is: how `mismatch` was measured
    kinds: dict | None = None  # per kind of source run as a calibration level: its own measured loss and reading
    loss: str | None = optional()  # the objective's training loss, in words (calibrate: runs.OBJECTIVES)
    dose_scale: dict | None = optional()  # where the doses were measured: engine, prompts, response length (scale_of)

    def __post_init__(self):
        if self.metric not in METRICS and self.metric not in VERL_METRICS:
            raise FP8ProbeError(
                f"budget metric {self.metric!r} is not one of {', '.join(METRICS)} or verl's {', '.join(VERL_METRICS)}"
            )
        if not isinstance(self.value, (int, float)) or not math.isfinite(self.value) or self.value < 0:
            raise FP8ProbeError(f"a budget must be a finite, non-negative number, got {self.value!r}")

    @classmethod
    def from_json(cls, d: dict, where: str = "budget.json") -> Budget:
        """The budget a budget.json holds, any version read (1-3: relative responses, no student recorded; the
        censoring flags of version 3 live in the noise ruler)."""
        try:
            interval = tuple(d["interval"]) if d.get("interval") is not None else None
            noise = ((d.get("dose_response") or {}).get("rulers") or {}).get("noise") or {}
            return cls(
                d["metric"],
                d["value"],
                bool(d.get("calibrated", False)),
                str(d.get("source", where)),
                interval,
                d.get("tolerance"),
                d.get("runs"),
                bool(d.get("paired", False)),
                d.get("levels"),
                d.get("seed_spread"),
                d.get("other_levels"),
                str(d.get("method", "isotonic")),
                d.get("dose_response"),
                str(d.get("response", "relative")),
                bool(d.get("censored", noise.get("above_range", False))),
                bool(d.get("interval_censored", noise.get("interval_censored", False))),
                d.get("objective"),
                d.get("student"),
                d.get("teacher"),
                d.get("dose"),
                d.get("kinds"),
                d.get("loss"),
                d.get("dose_scale"),
            )
        except KeyError as e:
            raise FP8ProbeError(f"{where} lacks {e}; write it with `fp8probe budget`") from e

    @property
    def scale(self) -> dict | None:
        """Where the budget's doses were measured (`dose_scale`; a calibration's before it was recorded: check's
        default scale, CHECK_SCALE), None where nothing says (a number, a table of the user's own doses)."""
        if self.dose_scale:
            return self.dose_scale
        return dict(CHECK_SCALE) if self.calibrated and self.dose and "fp8probe check" in self.dose else None

    def other_scale(self, scale: dict) -> str | None:
        """Why a check on rollouts of `scale` (scale_of) would measure on another scale than the budget's doses
        (None: the same, or the budget does not say). The prompts' count and seed do not change the scale (more prompts
        of the same kind only narrow the interval); their kind, the response length and the sampling do."""
        mine = self.scale
        if not mine:
            return None
        diff = [
            f"{k} {scale.get(k)!r} (the budget's {mine.get(k)!r})"
            for k in ("prompts", "max_new_tokens", "temperature", "top_p")
            if k in mine and scale.get(k) != mine.get(k)
        ]
        return "; ".join(diff) or None

    def check_judgeable(self) -> None:
        """Refuse, in one line, a budget a configuration cannot be judged against here: one on a verl metric (fitted
        to a user's verl runs, `budget --from-verl`), which fp8probe measures on the candidate's own samples without
        the interval a verdict needs."""
        if self.metric in VERL_METRICS:
            raise FP8ProbeError(
                f"{self.source} bounds verl's {self.metric}, measured on each run's own rollouts: check, plan and "
                f"recipe judge fp8probe's metrics; compare with the {self.metric} a check reports under "
                "prefix_shift, or fit the budget on kl_q_p (fp8probe calibrate)"
            )

    def for_kind(self, kind: str) -> Budget:
        """The budget a configuration of this kind of mismatch is judged against: the kind's own dose–response
        curve where the calibration fitted one that fits (stale weights: the demo's stale:1 cost 7 % at a KL where
        noise cost 1 %), else this (the noise ruler's)."""
        r = ((self.dose_response or {}).get("rulers") or {}).get(kind)
        if self.method != "benchmark dose" or not r or "bmd" not in r or r.get("fits") is not True:
            return self
        return replace(
            self,
            value=float(r["bmd"]),
            interval=tuple(r["interval"]) if r.get("interval") else None,
            source=f"{self.source} ({kind} ruler)",
            censored=bool(r.get("above_range")),
            interval_censored=bool(r.get("interval_censored")),
        )


# the scale `fp8probe check` measures a configuration on when given no rollouts (RolloutSettings' defaults: the first
# 16 built-in prompts, up to 48 tokens, temperature 1, in the simulation): where calibrate measures every level's dose
CHECK_SCALE = {"engine": "sim", "prompts": "built-in", "max_new_tokens": 48, "temperature": 1.0, "top_p": 1.0}


def scale_of(prompts, max_new_tokens: int, temperature: float, top_p: float = 1.0) -> dict:
    """The scale of rollouts sampled from `prompts` (texts or chat messages; None: the built-in ones) with these
    settings: their prompts' kind ("built-in" when every one is a built-in prompt, else a digest of the set)."""
    import hashlib
    import json as _json

    from ..model.prompts import BUILTIN_PROMPTS

    if prompts is None or all(isinstance(p, str) and p in set(BUILTIN_PROMPTS) for p in prompts):
        kind = "built-in"
    else:
        text = _json.dumps(sorted(_json.dumps(p, sort_keys=True) for p in prompts))
        kind = "prompts " + hashlib.sha256(text.encode()).hexdigest()[:12]
    return {"prompts": kind, "max_new_tokens": int(max_new_tokens), "temperature": float(temperature), "top_p": top_p}


OTHER_STUDENT = "other_student"  # the setting (--other-student) that judges a student against another's budget


def check_student(budget: Budget, student, override: bool = False, start=None) -> str | None:
    """Refuse, in one line, to judge `student` against a budget calibrated on another one (budget.json records its
    student's content hash: model/identity.py); with `override`, judge it anyway and return the note every output
    of the verdict carries. `start`: the student `student` was trained from (`descends_from`), accepted as the
    budget's own when it is the budget's student and `student` has its architecture and vocabulary: a later
    checkpoint of the run the budget is for (the note says so). A budget that records no student (budget.json < 4, a
    number, a table fitted without `student`) returns a note saying so."""
    from ..model.identity import SHORT, hash_as_recorded, same_architecture

    if not budget.calibrated:
        return None
    if not budget.student:
        return (
            "the budget does not record the student it was calibrated on (budget.json < 4, or `fp8probe budget` "
            "without `student`): it may belong to another"
        )
    theirs = budget.student["sha256"]
    mine = hash_as_recorded(budget.student, student)
    if mine == theirs:
        return None
    if start is not None:
        if hash_as_recorded(budget.student, start) != theirs:
            raise FP8ProbeError(
                f"`descends_from` {start.name} is not the student {budget.source} was calibrated on "
                f"({budget.student['name']}, sha256 {theirs[:SHORT]}): name the checkpoint its run started from"
            )
        if not same_architecture(start, student):
            raise FP8ProbeError(
                f"{student.name} cannot descend from {start.name}: another architecture, weight shapes or "
                "vocabulary; check a checkpoint of that run"
            )
        return (
            f"a descendant of the budget's student: {student.name} (sha256 {mine[:SHORT]}) trained from "
            f"{budget.student['name']} (sha256 {theirs[:SHORT]}), as `descends_from` says"
        )
    which = (
        f"{budget.source} was calibrated on {budget.student['name']} (sha256 {theirs[:SHORT]}), not on "
        f"{student.name} (sha256 {mine[:SHORT]})"
    )
    if not override:
        raise FP8ProbeError(
            f"{which}: check that student's configurations (MODEL {budget.student['name']}), name the student a "
            f"checkpoint was trained from with `descends_from`, or pass `{OTHER_STUDENT}` to judge this one against "
            "it anyway (the verdict will say so)"
        )
    return f"judged against another student's budget ({which}; `{OTHER_STUDENT}` given)"


def check_teacher(budget: Budget, teacher, override: bool = False) -> str | None:
    """Refuse, in one line, a teacher other than the one the budget was calibrated with (when both are known); with
    `override`, the note the verdict carries."""
    from ..model.identity import SHORT, hash_as_recorded

    if teacher is None or not budget.calibrated or not budget.teacher:
        return None
    theirs = budget.teacher["sha256"]
    mine = hash_as_recorded(budget.teacher, teacher)
    if mine == theirs:
        return None
    which = (
        f"{budget.source} was calibrated with the teacher {budget.teacher['name']} (sha256 {theirs[:SHORT]}), not "
        f"{teacher.name} (sha256 {mine[:SHORT]})"
    )
    if not override:
        raise FP8ProbeError(f"{which}: give that teacher, or pass `{OTHER_STUDENT}` to judge anyway")
    return f"judged with another teacher than the budget's ({which}; `{OTHER_STUDENT}` given)"


def default_budget() -> Budget:
    return Budget(
        "kl_q_p",
        1e-3,
        calibrated=False,
        source="uncalibrated default: NeMo-RL calls a generation KL below 1e-3 acceptable",
    )


def read_budget(text: str, metric: str = "kl_q_p") -> Budget:
    """A budget from the command line: a number (on `metric`), or a budget.json written by `fp8probe budget` or
    `calibrate` (versions 1-3 read too: relative responses, no student recorded)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        return Budget(metric, value, calibrated=False, source="given on the command line")
    p = Path(text)
    if not p.is_file():
        raise FP8ProbeError(f"`budget` {text}: neither a number nor a budget.json file")
    return Budget.from_json(read_artifact(Budget.KIND, p, "write it with `fp8probe budget`"), where=text)


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """Pool-adjacent-violators: the non-decreasing sequence closest to `values` in weighted least squares."""
    blocks = [[v, w, 1] for v, w in zip(values, weights)]  # mean, weight, count
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][0] > blocks[i + 1][0]:
            a, b = blocks[i], blocks[i + 1]
            w = a[1] + b[1]
            blocks[i] = [(a[0] * a[1] + b[0] * b[1]) / w, w, a[2] + b[2]]
            del blocks[i + 1]
            i = max(i - 1, 0)
        else:
            i += 1
    return [m for m, _, n in blocks for _ in range(n)]


def _threshold(
    levels: list[float], means: dict[float, float], weights: dict[float, int], tolerance: float
) -> tuple[float, list[float]]:
    """The largest level whose isotonic (non-decreasing) fit of the mean loss stays within the tolerance, and the
    fit itself."""
    present = [lv for lv in levels if lv in means]
    fitted = _isotonic([means[lv] for lv in present], [weights[lv] for lv in present])
    ok = [lv for lv, f in zip(present, fitted) if f <= tolerance]
    return (max(ok) if ok else 0.0), fitted


def _is_paired(df) -> bool:
    """Every run has a seed, each seed runs once per level, and every seed of a level has its mismatch-free twin."""
    if "seed" not in df.columns or df["seed"].isna().any() or df.duplicated(["_level", "seed"]).any():
        return False
    clean = set(df[df["mismatch"] == 0]["seed"])
    return len(clean) >= 2 and set(df["seed"]) <= clean


def _where(runs) -> str:
    """How an error line names the runs: the file, or "the runs table" for a DataFrame."""
    return str(runs) if isinstance(runs, (str, Path)) else "the runs table"


def _read_runs(runs, where: str):
    import numpy as np
    import pandas as pd

    if not isinstance(runs, pd.DataFrame):
        p = Path(runs)
        if not p.is_file():
            raise FP8ProbeError(f"no such runs table: {runs}")
        try:
            runs = pd.read_csv(p, dtype={"level": str})
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise FP8ProbeError(f"{where} is not a readable CSV ({str(e).splitlines()[0]})") from e
    missing = {"mismatch", "quality"} - set(runs.columns)
    if missing:
        raise FP8ProbeError(
            f"{where} lacks the column(s) {', '.join(sorted(missing))}: one row per training run "
            "with its rollout mismatch and its final quality"
        )
    df = runs.copy()
    for c in ("mismatch", "quality"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
        if df[c].isna().any() or not np.isfinite(df[c]).all():
            raise FP8ProbeError(f"{where}: column {c!r} must hold finite numbers on every row")
    if (df["mismatch"] < 0).any():
        raise FP8ProbeError(f"{where}: a mismatch level below 0; every metric is 0 without mismatch")
    kind = df["kind"].astype(str) if "kind" in df.columns else pd.Series(["noise"] * len(df), index=df.index)
    kind = kind.where(df["mismatch"] != 0, "none")
    name = df["level"].astype(str) if "level" in df.columns else df["mismatch"].map(lambda x: f"{x:g}")
    df["_kind"] = kind
    df["_level"] = [("0" if k == "none" else f"{k}|{n}") for k, n in zip(kind, name)]
    return df


def _one_value(df, column: str, where: str, default, what: str):
    if column not in df.columns:
        return default
    names = set(df[column].astype(str))
    if len(names) != 1:
        raise FP8ProbeError(f"{where}: one {what} per table, found {sorted(names)}")
    return names.pop()


START_SPREAD = 1e-3  # quality_start may differ this much (relative) between runs: one evaluation, other arithmetic
RULER_KINDS = ("stale",)  # kinds of level that get a dose–response curve of their own beside the noise ruler
FITTED_KINDS = ("none", "noise")  # the ruler: a budget is read off random weight noise; other sources are shown beside


def design_of(df, higher: bool, paired: bool):
    """The runs table (one objective, read by _read_runs) as a design.Design: row 0 the mismatch-free twins, then
    one row per level (its kind and name), the seeds as columns (paired) or the runs numbered (unpaired); and per
    row its kind and name."""
    import numpy as np

    from .design import Design

    def dose(lv) -> float:  # a level's runs share one dose (calibrate); a table may give each run its own
        x = df[df["_level"] == lv]["mismatch"]
        return float(x.iloc[0]) if x.nunique() == 1 else float(x.mean())

    levels = sorted(set(df["_level"]) - {"0"}, key=lambda lv: (dose(lv), lv))
    order = ["0"] + levels
    if paired:
        seeds = tuple(sorted(set(df[df["mismatch"] == 0]["seed"])))
        col = {s: i for i, s in enumerate(seeds)}
        q = np.full((len(order), len(seeds)), np.nan)
        for lv, sd, quality in zip(df["_level"], df["seed"], df["quality"]):
            q[order.index(lv), col[sd]] = quality
    else:
        counts = df.groupby("_level").size()
        seeds = tuple(range(int(counts.max())))
        q = np.full((len(order), len(seeds)), np.nan)
        for i, lv in enumerate(order):
            vals = df[df["_level"] == lv]["quality"].to_numpy()
            q[i, : len(vals)] = vals
    doses = np.array([0.0] + [dose(lv) for lv in levels])
    start = None
    if "quality_start" in df.columns:
        st = df["quality_start"].astype(float)
        if st.notna().all():
            if float(st.max() - st.min()) > START_SPREAD * max(1e-12, abs(st.mean())):
                raise FP8ProbeError(
                    f"the runs' quality_start ranges {st.min():.6g} .. {st.max():.6g}: one quality "
                    "before training per table (the same student evaluated once) is what the gain "
                    "is from"
                )
            start = float(st.mean())
    kinds = ["none"] + [str(df[df["_level"] == lv]["_kind"].iloc[0]) for lv in levels]
    names = ["0"] + [lv.split("|", 1)[1] for lv in levels]
    return Design(doses, q, seeds, start, higher, paired), kinds, names


def _one_objective(df, objective: str | None, where: str):
    """(the runs of one objective, its name, the mismatch metric, whether higher quality is better)."""
    if "objective" in df.columns:
        names = sorted(set(df["objective"].astype(str)))
        if objective is None and len(names) > 1:
            raise FP8ProbeError(
                f"{where} holds runs of several objectives ({', '.join(names)}): pick one with `objective`"
            )
        if objective is not None:
            if objective not in names:
                raise FP8ProbeError(f"`objective` {objective}: {where} holds {', '.join(names)}")
            df = df[df["objective"].astype(str) == objective]
        objective = objective or names[0]
    metric = _one_value(df, "metric", where, "kl_q_p", "mismatch metric")
    direction = _one_value(df, "higher_is_better", where, "true", "quality direction").lower()
    if direction not in {"true", "false", "1", "0"}:
        raise FP8ProbeError(f"{where}: higher_is_better must be one value, true or false")
    return df, objective, metric, direction in ("true", "1")


def ruler_design(runs, fitted: dict | None = None):
    """(the design of a paired runs table of one objective, the noise ruler's rows, the baseline its fit chose):
    what dose.allocate needs. `fitted`: the noise ruler's record of the last fit (its `response.pairing`)."""
    df = _read_runs(runs, _where(runs))
    higher = str(df["higher_is_better"].iloc[0]).lower() in ("true", "1") if "higher_is_better" in df else True
    design, kinds, _ = design_of(df, higher, _is_paired(df))
    rows = [i for i, k in enumerate(kinds) if k in FITTED_KINDS and i > 0]
    pairing = ((fitted or {}).get("response") or {}).get("pairing") or ("seed" if design.paired else "mean")
    return design, rows, pairing


def fit_budget(runs, settings: BudgetSettings = BudgetSettings(), *, paired: bool | None = None) -> Budget:
    """The calibrated budget from a runs table (a pandas DataFrame or a CSV path) as `settings` say (BudgetSettings:
    the tolerance on the response, the bootstrap and its seed, the objective of a table with several, the fit: "dose"
    reads the benchmark dose, the isotonic fit where no family fits, "isotonic" the isotonic fit only; the response
    (design.RESPONSES) and the pairing: "auto" from the variance components, "seed" or "mean"); see the module
    docstring. `paired`: None decides from the table (_is_paired)."""
    import numpy as np

    from .design import check_response, losses, twins_of

    s = settings
    tolerance, bootstrap, seed, fit, response, pairing = s.tolerance, s.bootstrap, s.seed, s.fit, s.response, s.pairing
    objective = s.objective
    where = _where(runs)
    df, objective, metric, higher = _one_objective(_read_runs(runs, where), objective, where)
    if df[df["mismatch"] == 0].empty:
        raise FP8ProbeError(f"{where} has no mismatch-free run (mismatch 0): the quality loss needs that baseline")
    if paired is None:
        paired = _is_paired(df)
    elif paired and not _is_paired(df):
        raise FP8ProbeError(
            f"{where}: pairing needs a seed per run, each seed once per level and its mismatch-free "
            "twin (two seeds at least)"
        )
    design, kinds, names = design_of(df, higher, paired)
    check_response(design, response, where)
    rows = {k: [i for i, kk in enumerate(kinds) if kk == k and i > 0] for k in dict.fromkeys(kinds)}  # table order
    ruler = sorted(i for k in FITTED_KINDS for i in rows.get(k, []))
    y = losses(design, design.q, twins_of(design.q), response, "seed" if paired else "mean")
    mean = {i: float(np.nanmean(y[i])) for i in range(len(kinds))}
    dr = (
        _dose_response(
            design, kinds, names, rows, ruler, tolerance, bootstrap, seed, response, pairing if paired else "mean"
        )
        if fit == "dose"
        else None
    )
    noise = dr["rulers"]["noise"] if dr else {}
    if noise.get("response"):  # the baseline the fit chose: the level table shows the same losses
        y = losses(design, design.q, twins_of(design.q), response, noise["response"]["pairing"])
        mean = {i: float(np.nanmean(y[i])) for i in range(len(kinds))}
    doses = {i: float(design.doses[i]) for i in range(len(kinds))}
    # without noise levels there is no ruler: the threshold is read off the calibrated levels themselves, every kind
    # at its dose on the table's scale (a user's verl runs of FP8 configurations; fit_lines says so)
    fitted_rows = [0] + (ruler or sorted(i for i in range(1, len(kinds))))
    value, isotonic = _threshold(
        [doses[i] for i in fitted_rows],
        {doses[i]: mean[i] for i in fitted_rows},
        {doses[i]: int(design.counts()[i]) for i in fitted_rows},
        tolerance,
    )
    base = noise.get("response", {}).get("pairing", "seed" if paired else "mean")
    interval = _isotonic_interval(design, fitted_rows, tolerance, bootstrap, seed, response, base)
    method = "benchmark dose" if noise.get("fits") is not False and "bmd" in noise else "isotonic"
    if method == "benchmark dose":
        value, interval = noise["bmd"], tuple(noise["interval"]) if noise["interval"] else None
    level_intervals = _level_intervals(design, y, response, base, bootstrap, seed)

    def row(i):
        return {
            "mismatch": doses[i],
            "loss": mean[i] if i else 0.0,
            "runs": int(design.counts()[i]),
            "loss_interval": [0.0, 0.0] if i == 0 and paired else level_intervals[i],
        }

    curve = noise.get("fitted", {})
    table = [
        {**row(i), "fitted": curve.get(str(doses[i]), f) if method == "benchmark dose" else f, "isotonic": f}
        for i, f in zip(fitted_rows, isotonic)
        if i == 0 or i in ruler  # the noise levels: the pooled levels of a table without them are other_levels
    ]
    others = [{**row(i), "level": names[i], "kind": kinds[i]} for i in range(1, len(kinds)) if i not in ruler] or None
    q0 = design.q[0]
    spread = float((q0.max() - q0.min()) / abs(q0.mean())) if len(q0) > 1 and q0.mean() else None
    top = max(doses[i] for i in fitted_rows)
    if method == "benchmark dose":
        censored = bool(noise.get("above_range"))
        interval_censored = bool(noise.get("interval_censored"))
    else:  # no tested level's isotonic fit exceeds the tolerance: the threshold lies somewhere above the top dose
        censored = top > 0 and all(f <= tolerance for f in isotonic)
        interval_censored = bool(interval) and top > 0 and interval[1] >= top
    return Budget(
        metric,
        float(value),
        calibrated=True,
        source=f"fit to {len(df)} training runs in {where}",
        interval=interval,
        tolerance=tolerance,
        runs=df.drop(columns=["_kind", "_level"]).to_dict(orient="records"),
        paired=paired,
        levels=table,
        seed_spread=spread,
        other_levels=others,
        method=method,
        dose_response=dr,
        response=response,
        censored=censored,
        interval_censored=interval_censored,
        objective=objective,
        kinds=_kind_evidence(noise, kinds, names) if dr else None,
    )


def _dose_response(design, kinds, names, rows, ruler, tolerance, n, seed, response, pairing) -> dict:
    """budget.json's `dose_response`: the noise ruler's benchmark-dose fit (dose.py), a curve for every other kind
    of level with runs of its own (stale weights), and the noise ruler's prediction at each level of a source no
    ruler stands for (FP8, the FP8 KV cache), paired by seed with that level's measured loss."""
    from .dose import FIT_P, HORMESIS_ALPHA, LEVEL, MODELS, fit_ruler

    predict = {names[i]: i for k, rs in rows.items() if k not in (*FITTED_KINDS, *RULER_KINDS) for i in rs}
    rulers = {
        "noise": fit_ruler(
            design, ruler, tolerance, response=response, pairing=pairing, n=n, seed=seed, predict=predict
        )
    }
    for kind in RULER_KINDS:
        if rows.get(kind):
            rulers[kind] = fit_ruler(design, rows[kind], tolerance, response=response, pairing=pairing, n=n, seed=seed)
    return {
        "families": {name: f.formula for name, f in MODELS.items()},
        "averaging": "Akaike weights, AIC = χ² + 2k over the parameters off their bounds, duplicates dropped",
        "fits_when": f"lack-of-fit F test p >= {FIT_P}",
        "interval_level": LEVEL,
        "bootstrap": n,
        "hormesis_false_positive_rate": HORMESIS_ALPHA,
        "interval": f"the hull of the seed bootstrap's {LEVEL:.0%} percentiles (widened about the BMD on the log "
        "scale by core/stats.expansion of the seeds at the levels carrying it) and a parametric "
        "bootstrap with the seed as a random effect",
        "implementation": "budget/families.py (profiled grid fits), budget/design.py, budget/dose.py",
        "rulers": rulers,
    }


def _kind_evidence(noise: dict, kinds, names) -> dict | None:
    """Per kind run as a calibration level beside the ruler (FP8 weights, the FP8 KV cache): its own measured loss,
    its interval, its dose and the ruler's reading there: what `check` judges a configuration of that kind on."""
    out = {}
    for name, p in (noise.get("predictions") or {}).items():
        kind = kinds[names.index(name)]
        out.setdefault(kind, []).append(
            {
                "level": name,
                "mismatch": p["mismatch"],
                "loss": p["measured"],
                "loss_interval": p["measured_interval"],
                "seeds": p["seeds"],
                "predicted": p["predicted"],
                "reading": p["reading"],
            }
        )
    return out or None


def _level_intervals(design, y, response: str, pairing: str, n: int, seed: int) -> dict:
    """Each level's mean loss interval: the seed bootstrap's percentiles widened for the level's own seeds."""
    import numpy as np

    from .design import by_seed, level_means, losses
    from .dose import LEVEL, quantiles

    if n <= 0:
        return {i: None for i in range(len(design.doses))}
    qb, twb = by_seed(design, n, np.random.default_rng(seed + 1))
    means = level_means(losses(design, qb, twb, response, pairing))
    out = {}
    for i in range(len(design.doses)):
        k = int(design.counts()[i])
        pct = quantiles(means[:, i])
        m = float(np.nanmean(y[i]))
        e = expansion(k, LEVEL)
        out[i] = None if pct is None or not math.isfinite(e) else [m - e * (m - pct[0]), m + e * (pct[1] - m)]
    return out


def _isotonic_interval(design, rows, tolerance: float, n: int, seed: int, response: str, pairing: str):
    """The isotonic threshold's interval: its 5 % and 95 % quantiles over the seed bootstrap."""
    import numpy as np

    from .design import by_seed, level_means, losses

    if n <= 0:
        return None
    qb, twb = by_seed(design, n, np.random.default_rng(seed + 2))
    means = level_means(losses(design, qb, twb, response, pairing))
    doses = [float(design.doses[i]) for i in rows]
    counts = {d: int(design.counts()[i]) for d, i in zip(doses, rows)}
    th = [
        _threshold(doses, {d: float(m[i]) if i else 0.0 for d, i in zip(doses, rows)}, counts, tolerance)[0]
        for m in means
    ]
    return (float(np.quantile(th, 0.05)), float(np.quantile(th, 0.95))) if th else None


BMDL_FLAG = 3.0  # BMDS flags a BMD more than 3x its lower bound: the dose is not decided by the data


def budget_ratio(a: Budget, b: Budget) -> dict:
    """How much more mismatch `a`'s objective tolerates than `b`'s: the ratio of the two budgets' benchmark doses,
    each fitted on all of its own runs. Refused (ratio None, `undetermined` the reason) unless both are decided: a
    fitted benchmark dose whose curve passes its lack-of-fit test, both ends of its interval uncensored, BMD / BMDL
    within BMDS's flag (3).
    The interval combines the two intervals on the log scale, each side's half-widths in quadrature (the runs of
    two objectives are independent): a's low end with b's high end for the ratio's low end, and the other way
    round; an end of either budget censored at its highest tested dose leaves that side of the ratio open
    (`open_low`, `open_high`: "> lo" or "< hi")."""

    def refused(why: str) -> dict:
        return {"objective": a.objective, "other": b.objective, "ratio": None, "interval": None, "undetermined": why}

    for x in (a, b):
        noise = ((x.dose_response or {}).get("rulers") or {}).get("noise") or {}
        if x.method != "benchmark dose" or not x.interval:
            return refused(f"{x.objective}'s budget is not a fitted benchmark dose ({x.method})")
        if noise.get("fits") is False:
            return refused(f"{x.objective}'s dose–response curve fails its lack-of-fit test")
        if x.censored:
            return refused(f"{x.objective}'s BMD lies beyond its highest tested dose ({x.value:.3g})")
        if x.interval_censored:
            return refused(f"{x.objective}'s interval is censored at its highest tested dose ({x.interval[1]:.3g})")
        bmd_bmdl = x.value / x.interval[0] if x.interval[0] > 0 else math.inf
        if bmd_bmdl > BMDL_FLAG:
            return refused(f"{x.objective}'s BMD / BMDL is {bmd_bmdl:.3g} (> {BMDL_FLAG:g}, BMDS's flag)")
        if x.response != a.response or x.tolerance != a.tolerance:
            return refused("the two budgets are read at different responses or tolerances")
    ratio = a.value / b.value
    (alo, ahi), (blo, bhi) = a.interval, b.interval
    down = math.hypot(math.log(a.value / alo), math.log(bhi / b.value))
    up = math.hypot(math.log(ahi / a.value), math.log(b.value / blo))
    return {
        "objective": a.objective,
        "other": b.objective,
        "ratio": ratio,
        "interval": [ratio * math.exp(-down), ratio * math.exp(up)],
        "open_low": bool(b.interval_censored),
        "open_high": bool(a.interval_censored),
        "bmd": {a.objective: a.value, b.objective: b.value},
        "undetermined": None,
        "how": "log-scale half-widths of the two budgets' intervals combined in quadrature (independent runs)",
    }
