"""The mismatch budget: the largest rollout mismatch that training runs tolerate, read off real runs.

    fp8probe budget RUNS.csv --out DIR [--tolerance 0.02] [--objective opd]

RUNS.csv has one row per training run: `mismatch` (the run's rollout mismatch on one of our metrics, 0 for
mismatch-free runs), `quality` (its quality), and optionally `metric` (which metric `mismatch` is; one value for
the whole table, default kl_q_p), `seed`, `objective` (pick one with `objective` when there are several) and
`higher_is_better` (the quality's direction, default true).

Paired design (when every run has a seed and every seed has its mismatch-free twin, as `fp8probe calibrate`
runs them: the same seeds for data order, generation and evaluation): a run's quality loss is its relative
shortfall against *its own seed's* mismatch-free run, so what the seeds do alike cancels; the interval comes from
a paired bootstrap that resamples seeds, one draw for every level. Otherwise (unpaired) a run's loss is its
shortfall against the mean of the mismatch-free runs, and runs are resampled within each level.

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
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.artifacts import read_artifact, version
from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS

SCHEMA_VERSION = version("budget.json")


DEFAULT_TOLERANCE = 0.02  # the relative quality loss a budget allows unless told otherwise (a user's choice)


@dataclass(frozen=True)
class Budget:
    metric: str
    value: float
    calibrated: bool
    source: str
    interval: tuple[float, float] | None = None
    tolerance: float | None = None
    runs: list | None = None
    paired: bool = False  # losses against each seed's mismatch-free twin (True) or the mean of those runs
    levels: list | None = None  # per tested level: mismatch, mean loss, its interval, the isotonic fit, runs
    seed_spread: float | None = None  # relative range of the mismatch-free runs' quality (seeds alone)
    other_levels: list | None = None  # levels of other sources (stale:K, fp8, kv): their loss, not fitted
    method: str = "isotonic"  # "benchmark dose" (dose.py's averaged curve) or "isotonic" (no family fits; schema <3)
    dose_response: dict | None = None  # per ruler: families, fits, the BMD and its interval, the curve; predictions

    def __post_init__(self):
        if self.metric not in METRICS:
            raise FP8ProbeError(f"budget metric {self.metric!r} is not one of {', '.join(METRICS)}")
        if not isinstance(self.value, (int, float)) or not math.isfinite(self.value) or self.value < 0:
            raise FP8ProbeError(f"a budget must be a finite, non-negative number, got {self.value!r}")

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    def for_kind(self, kind: str) -> Budget:
        """The budget a configuration of this kind of mismatch is judged against: the kind's own dose–response
        curve where the calibration fitted one (stale weights: the demo's stale:1 cost 7 % at a KL where noise
        cost 1 %), else this (the noise ruler's)."""
        from dataclasses import replace

        r = ((self.dose_response or {}).get("rulers") or {}).get(kind)
        if self.method != "benchmark dose" or not r or "bmd" not in r or r.get("fits") is False:
            return self
        return replace(self, value=float(r["bmd"]), interval=tuple(r["interval"]) if r.get("interval") else None,
                       source=f"{self.source} ({kind} ruler)")


def default_budget() -> Budget:
    return Budget("kl_q_p", 1e-3, calibrated=False,
                  source="uncalibrated default: NeMo-RL calls a generation KL below 1e-3 acceptable")


def read_budget(text: str, metric: str = "kl_q_p") -> Budget:
    """A budget from the command line: a number (on `metric`), or a budget.json written by `fp8probe budget`."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        return Budget(metric, value, calibrated=False, source="given on the command line")
    p = Path(text)
    if not p.is_file():
        raise FP8ProbeError(f"`budget` {text}: neither a number nor a budget.json file")
    d = read_artifact("budget.json", p, "write it with `fp8probe budget`")
    try:
        interval = tuple(d["interval"]) if d.get("interval") is not None else None
        return Budget(d["metric"], d["value"], bool(d.get("calibrated", False)), str(d.get("source", text)),
                      interval, d.get("tolerance"), d.get("runs"), bool(d.get("paired", False)), d.get("levels"),
                      d.get("seed_spread"), d.get("other_levels"), str(d.get("method", "isotonic")),
                      d.get("dose_response"))
    except KeyError as e:
        raise FP8ProbeError(f"{text} lacks {e}; write it with `fp8probe budget`") from e


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


def paired_losses(df, higher: bool, paired: bool) -> dict[float, dict]:
    """mismatch level -> {seed: relative quality loss}: against the same seed's mismatch-free run (paired), or
    against the mean of every mismatch-free run (unpaired; the rows are numbered instead of seeded)."""
    clean = df[df["mismatch"] == 0]
    base_all = float(clean["quality"].mean())
    base = dict(zip(clean["seed"], clean["quality"])) if paired else {}
    out: dict[float, dict] = {}
    for i, r in enumerate(df.itertuples(index=False)):
        b = base[r.seed] if paired else base_all
        loss = ((b - r.quality) if higher else (r.quality - b)) / abs(b)
        out.setdefault(float(r.mismatch), {})[r.seed if paired else i] = loss
    return out


def _threshold(levels: list[float], means: dict[float, float], weights: dict[float, int],
               tolerance: float) -> tuple[float, list[float]]:
    """The largest level whose isotonic (non-decreasing) fit of the mean loss stays within the tolerance, and the
    fit itself."""
    present = [lv for lv in levels if lv in means]
    fitted = _isotonic([means[lv] for lv in present], [weights[lv] for lv in present])
    ok = [lv for lv, f in zip(present, fitted) if f <= tolerance]
    return (max(ok) if ok else 0.0), fitted


def _is_paired(df) -> bool:
    """Every run has a seed, each seed runs once per level, and every seed of a level has its mismatch-free twin."""
    if "seed" not in df.columns or df["seed"].isna().any() or df.duplicated(["mismatch", "seed"]).any():
        return False
    clean = set(df[df["mismatch"] == 0]["seed"])
    return len(clean) >= 2 and set(df["seed"]) <= clean


def _read_runs(runs, where: str):
    import numpy as np
    import pandas as pd

    if not isinstance(runs, pd.DataFrame):
        p = Path(runs)
        if not p.is_file():
            raise FP8ProbeError(f"no such runs table: {runs}")
        try:
            runs = pd.read_csv(p)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise FP8ProbeError(f"{where} is not a readable CSV ({str(e).splitlines()[0]})") from e
    missing = {"mismatch", "quality"} - set(runs.columns)
    if missing:
        raise FP8ProbeError(f"{where} lacks the column(s) {', '.join(sorted(missing))}: one row per training run "
                            "with its rollout mismatch and its final quality")
    df = runs.copy()
    for c in ("mismatch", "quality"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
        if df[c].isna().any() or not np.isfinite(df[c]).all():
            raise FP8ProbeError(f"{where}: column {c!r} must hold finite numbers on every row")
    if (df["mismatch"] < 0).any():
        raise FP8ProbeError(f"{where}: a mismatch level below 0; every metric is 0 without mismatch")
    return df


def _one_value(df, column: str, where: str, default, what: str):
    if column not in df.columns:
        return default
    names = set(df[column].astype(str))
    if len(names) != 1:
        raise FP8ProbeError(f"{where}: one {what} per table, found {sorted(names)}")
    return names.pop()


FITS = ("dose", "isotonic")  # how the budget is read off the runs: the benchmark dose, or the isotonic fit alone


def fit_budget(runs, tolerance: float = DEFAULT_TOLERANCE, bootstrap: int = 1000, seed: int = 0,
               paired: bool | None = None, objective: str | None = None, fit: str = "dose") -> Budget:
    """The calibrated budget from a runs table (a pandas DataFrame or a CSV path); see the module docstring.
    `paired`: None decides from the table (_is_paired); `objective` picks one objective of a table with several;
    `fit` "dose" reads the benchmark dose (the isotonic fit where no family fits), "isotonic" the isotonic fit only."""
    import numpy as np

    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise FP8ProbeError(f"`tolerance` {tolerance}: must be a finite, non-negative fraction")
    if fit not in FITS:
        raise FP8ProbeError(f"`fit` {fit}: one of {', '.join(FITS)}")
    where = str(runs)
    df = _read_runs(runs, where)
    if "objective" in df.columns:
        names = sorted(set(df["objective"].astype(str)))
        if objective is None and len(names) > 1:
            raise FP8ProbeError(f"{where} holds runs of several objectives ({', '.join(names)}): pick one with "
                                "`objective`")
        if objective is not None:
            if objective not in names:
                raise FP8ProbeError(f"`objective` {objective}: {where} holds {', '.join(names)}")
            df = df[df["objective"].astype(str) == objective]
    metric = _one_value(df, "metric", where, "kl_q_p", "mismatch metric")
    direction = _one_value(df, "higher_is_better", where, "true", "quality direction").lower()
    if direction not in {"true", "false", "1", "0"}:
        raise FP8ProbeError(f"{where}: higher_is_better must be one value, true or false")
    higher = direction in ("true", "1")
    clean = df[df["mismatch"] == 0]["quality"]
    if clean.empty:
        raise FP8ProbeError(f"{where} has no mismatch-free run (mismatch 0): the quality loss needs that baseline")
    if (clean == 0).any() if _is_paired(df) else float(clean.mean()) == 0:
        raise FP8ProbeError(f"{where}: a mismatch-free run's quality is 0; a relative loss needs another scale")
    if paired is None:
        paired = _is_paired(df)
    elif paired and not _is_paired(df):
        raise FP8ProbeError(f"{where}: pairing needs a seed per run, each seed once per level and its mismatch-free "
                            "twin (two seeds at least)")
    losses = paired_losses(df, higher, paired)
    ruler = ruler_levels(df)
    levels = sorted(lv for lv in losses if lv in ruler)
    mean = {lv: float(np.mean(list(d.values()))) for lv, d in losses.items()}
    value, fitted = _threshold(levels, mean, {lv: len(losses[lv]) for lv in levels}, tolerance)
    boot, level_boot = _bootstrap(losses, levels, paired, tolerance, bootstrap, seed)
    interval = (float(np.quantile(boot, 0.05)), float(np.quantile(boot, 0.95))) if boot else None
    dose_response = _dose_response(df, losses, levels, paired, tolerance, bootstrap, seed) if fit == "dose" else None
    noise = dose_response["rulers"]["noise"] if dose_response else {}
    method = "benchmark dose" if noise.get("fits") is not False and "bmd" in noise else "isotonic"
    if method == "benchmark dose":
        value, interval = noise["bmd"], tuple(noise["interval"]) if noise["interval"] else None

    def row(lv):
        return {"mismatch": lv, "loss": mean[lv], "runs": len(losses[lv]),
                "loss_interval": ([float(np.quantile(level_boot[lv], q)) for q in (0.05, 0.95)]
                                  if level_boot.get(lv) else None)}

    curve = noise.get("fitted", {})
    table = [{**row(lv), "fitted": curve.get(str(lv), f) if method == "benchmark dose" else f, "isotonic": f}
             for lv, f in zip(levels, fitted)]
    others = [{**row(lv), "level": ruler_name, "kind": kind}
              for lv, (ruler_name, kind) in sorted(_others(df).items()) if lv in losses] or None
    q0 = df[df["mismatch"] == 0]["quality"]
    spread = float((q0.max() - q0.min()) / abs(q0.mean())) if len(q0) > 1 and q0.mean() else None
    return Budget(metric, float(value), calibrated=True, source=f"fit to {len(df)} training runs in {where}",
                  interval=interval, tolerance=tolerance, runs=df.to_dict(orient="records"), paired=paired,
                  levels=table, seed_spread=spread, other_levels=others, method=method,
                  dose_response=dose_response)


def _dose_response(df, losses: dict, ruler: list[float], paired: bool, tolerance: float, n: int,
                   seed: int) -> dict:
    """budget.json's `dose_response`: the noise ruler's benchmark-dose fit (dose.py), a curve for every other kind
    of level with runs of its own (stale weights), and the noise ruler's prediction at each level of a source no
    ruler stands for (FP8, the FP8 KV cache), paired with that level's measured loss."""
    from .dose import FIT_P, LEVEL, MODELS, draws, fit_ruler

    boot = draws(losses, paired, n, seed)
    groups = len(losses[0.0]) if paired else min(len(d) for d in losses.values())
    others = _others(df)
    kinds: dict[str, list[float]] = {}
    for lv, (_, kind) in others.items():
        kinds.setdefault(kind, []).append(lv)
    predict = {name: lv for lv, (name, kind) in others.items() if kind not in RULER_KINDS and lv in losses}
    rulers = {"noise": fit_ruler(losses, ruler, tolerance, boot, predict, groups)}
    for kind in RULER_KINDS:
        if kinds.get(kind):
            rulers[kind] = fit_ruler(losses, kinds[kind], tolerance, boot, groups=groups)
    for r in rulers.values():
        r.pop("draws", None)
    return {"families": {name: f.formula for name, f in MODELS.items()}, "averaging": "Akaike weights, AIC = χ² + 2k",
            "fits_when": f"lack-of-fit F test p >= {FIT_P}", "interval_level": LEVEL, "bootstrap": n,
            "interval": f"the {LEVEL:.0%} bootstrap percentiles over {'seeds' if paired else 'runs'}, widened about "
                        f"the BMD on the log scale by core/stats.expansion({groups})",
            "implementation": "scipy.optimize.least_squares (budget/dose.py)", "rulers": rulers}


RULER_KINDS = ("stale",)  # kinds of level that get a dose–response curve of their own beside the noise ruler


FITTED_KINDS = ("none", "noise")  # the ruler: a budget is read off random weight noise; other sources are shown beside


def ruler_levels(df) -> set[float]:
    """The mismatch levels the budget is fitted to: every level of a table without a `kind` column, else those of
    the noise ruler (and the mismatch-free runs). Stale weights, FP8 or an FP8 KV cache as calibration levels are
    reported beside it (other_levels), not fitted: the demo's stale:1 runs lost 7 % at a KL where noise lost 1 %,
    so a KL from one source does not cost what the same KL from another does."""
    if "kind" not in df.columns:
        return set(df["mismatch"].astype(float))
    return set(df[df["kind"].astype(str).isin(FITTED_KINDS)]["mismatch"].astype(float))


def _others(df) -> dict[float, tuple[str, str]]:
    if "kind" not in df.columns:
        return {}
    rest = df[~df["kind"].astype(str).isin(FITTED_KINDS)]
    name = rest["level"].astype(str) if "level" in rest.columns else rest["kind"].astype(str)
    return {float(m): (n, str(k)) for m, n, k in zip(rest["mismatch"], name, rest["kind"])}


def _bootstrap(losses: dict, levels: list[float], paired: bool, tolerance: float, n: int, seed: int):
    """Thresholds of resampled tables, and each level's resampled mean loss. Paired: the seeds are resampled, the
    same draw for every level (a seed's runs stay together). Unpaired: runs are resampled within each level."""
    import numpy as np

    rng = np.random.default_rng(seed)
    seeds = sorted(losses[0.0]) if paired else None
    boot, level_boot = [], {lv: [] for lv in losses}
    for _ in range(n):
        if paired:
            draw = rng.choice(seeds, size=len(seeds), replace=True)
            means = {lv: float(np.mean([d[s] for s in draw if s in d])) for lv, d in losses.items()
                     if any(s in d for s in draw)}
        else:
            means = {lv: float(np.mean(rng.choice(list(d.values()), size=len(d), replace=True)))
                     for lv, d in losses.items()}
        for lv, m in means.items():
            level_boot[lv].append(m)
        boot.append(_threshold(levels, means, {lv: len(losses[lv]) for lv in levels}, tolerance)[0])
    return boot, level_boot


def bmd_ratio(runs, objective: str, other: str, tolerance: float = DEFAULT_TOLERANCE, bootstrap: int = 1000,
              seed: int = 0) -> dict:
    """How much more mismatch `objective` tolerates than `other`: the ratio of their noise rulers' benchmark doses,
    its interval from one paired bootstrap over the seeds both ran (the same seeds drawn for both objectives, as a
    calibration runs them with the same data order and generation seeds), widened for few seeds as the budget's."""
    import numpy as np

    from .dose import LEVEL, draws, expanded, fit_ruler

    where = str(runs)
    df = _read_runs(runs, where)
    if "objective" not in df.columns:
        raise FP8ProbeError(f"{where} has no `objective` column: a ratio needs the runs of two objectives")
    fits, seeds = {}, None
    tables = {o: df[df["objective"].astype(str) == o] for o in (objective, other)}
    for o, d in tables.items():
        if d.empty or not _is_paired(d):
            raise FP8ProbeError(f"{where}: the {o} runs are missing or not paired by seed")
        s = set(d[d["mismatch"] == 0]["seed"])
        seeds = s if seeds is None else seeds & s
    for o, d in tables.items():
        d = d[d["seed"].isin(seeds)]
        higher = str(d["higher_is_better"].iloc[0]).lower() in ("true", "1") if "higher_is_better" in d else True
        losses = paired_losses(d, higher, True)
        fits[o] = fit_ruler(losses, sorted(lv for lv in ruler_levels(d) if lv > 0), tolerance,
                            draws(losses, True, bootstrap, seed), groups=len(seeds))
    a, b = fits[objective], fits[other]
    if "bmd" not in a or "bmd" not in b or b["bmd"] <= 0:
        return {"objective": objective, "other": other, "ratio": None, "interval": None, "seeds": len(seeds)}
    pairs = [x / y for x, y in zip(a["draws"], b["draws"]) if math.isfinite(x) and math.isfinite(y) and y > 0]
    q = [float(np.quantile(pairs, (1 - LEVEL) / 2)), float(np.quantile(pairs, (1 + LEVEL) / 2))] if pairs else None
    ratio = a["bmd"] / b["bmd"]
    censored = [o for o, f in fits.items() if f.get("above_range") or f.get("interval_censored")]
    return {"objective": objective, "other": other, "ratio": ratio, "percentile_interval": q,
            "interval": expanded(ratio, q, len(seeds), math.inf), "seeds": len(seeds),
            "bmd": {objective: a["bmd"], other: b["bmd"]}, "fits": {objective: a["fits"], other: b["fits"]},
            "censored": censored}
