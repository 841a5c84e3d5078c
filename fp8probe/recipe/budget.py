"""The mismatch budget: the largest rollout mismatch that training runs tolerate, read off real runs.

    fp8probe budget RUNS.csv --out DIR [--tolerance 0.01]

RUNS.csv has one row per training run: `mismatch` (the run's rollout mismatch on one of our metrics, 0 for
mismatch-free runs), `quality` (its final quality), and optionally `metric` (which metric `mismatch` is;
one value for the whole table, default kl_q_p), `seed`, and `higher_is_better` (the quality's direction,
default true). The quality loss of a run is its relative shortfall against the mean of the mismatch-free
runs; a non-decreasing fit of loss against mismatch (pool-adjacent-violators, per mismatch level) gives
the budget: the largest tested level whose fitted loss stays within the tolerance (default 1 % relative).
A bootstrap over runs (resampled within each level) gives its interval. Written as DIR/budget.json.

Without runs, `default_budget()` is a published rule of thumb (NeMo-RL calls a generation KL below 1e-3
acceptable), labelled uncalibrated in every output that uses it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.artifacts import version
from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS

SCHEMA_VERSION = version("budget.json")


@dataclass(frozen=True)
class Budget:
    metric: str
    value: float
    calibrated: bool
    source: str
    interval: tuple[float, float] | None = None
    tolerance: float | None = None
    runs: list | None = None

    def __post_init__(self):
        if self.metric not in METRICS:
            raise FP8ProbeError(f"budget metric {self.metric!r} is not one of {', '.join(METRICS)}")
        if not isinstance(self.value, (int, float)) or not math.isfinite(self.value) or self.value < 0:
            raise FP8ProbeError(f"a budget must be a finite, non-negative number, got {self.value!r}")

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}


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
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FP8ProbeError(f"{text} is not valid JSON ({e}); write it with `fp8probe budget`") from e
    if not isinstance(d, dict) or d.get("schema_version") != SCHEMA_VERSION:
        raise FP8ProbeError(f"{text} is not a budget.json of schema {SCHEMA_VERSION}; write it with `fp8probe budget`")
    try:
        interval = tuple(d["interval"]) if d.get("interval") is not None else None
        return Budget(d["metric"], d["value"], bool(d.get("calibrated", False)), str(d.get("source", text)),
                      interval, d.get("tolerance"), d.get("runs"))
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


def _threshold(levels: list[float], groups: dict[float, list[float]], base: float, higher: bool,
               tolerance: float) -> float:
    losses = []
    for lv in levels:
        qs = groups[lv]
        mean_q = sum(qs) / len(qs)
        losses.append(((base - mean_q) if higher else (mean_q - base)) / abs(base))
    fitted = _isotonic(losses, [len(groups[lv]) for lv in levels])
    ok = [lv for lv, f in zip(levels, fitted) if f <= tolerance]
    return max(ok) if ok else 0.0


def fit_budget(runs, tolerance: float = 0.01, bootstrap: int = 1000, seed: int = 0) -> Budget:
    """The calibrated budget from a runs table (a pandas DataFrame or a CSV path); see the module docstring."""
    import numpy as np
    import pandas as pd

    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise FP8ProbeError(f"`tolerance` {tolerance}: must be a finite, non-negative fraction")
    where = str(runs)
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
    metric = "kl_q_p"
    if "metric" in df.columns:
        names = set(df["metric"].astype(str))
        if len(names) != 1:
            raise FP8ProbeError(f"{where}: one mismatch metric per table, found {sorted(names)}")
        metric = names.pop()
    higher = True
    if "higher_is_better" in df.columns:
        vals = set(df["higher_is_better"].astype(str).str.lower())
        if not vals <= {"true", "false", "1", "0"} or len(vals) != 1:
            raise FP8ProbeError(f"{where}: higher_is_better must be one value, true or false")
        higher = vals.pop() in ("true", "1")
    clean = df[df["mismatch"] == 0]["quality"]
    if clean.empty:
        raise FP8ProbeError(f"{where} has no mismatch-free run (mismatch 0): the quality loss needs that baseline")
    base = float(clean.mean())
    if base == 0:
        raise FP8ProbeError(f"{where}: the mismatch-free runs' mean quality is 0; a relative loss needs another scale")
    groups = {float(k): [float(x) for x in g["quality"]] for k, g in df.groupby("mismatch")}
    levels = sorted(groups)
    value = _threshold(levels, groups, base, higher, tolerance)
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(bootstrap):
        g2 = {lv: list(rng.choice(qs, size=len(qs), replace=True)) for lv, qs in groups.items()}
        b2 = sum(g2[0.0]) / len(g2[0.0])
        boot.append(_threshold(levels, g2, b2, higher, tolerance) if b2 != 0 else 0.0)
    interval = (float(np.quantile(boot, 0.05)), float(np.quantile(boot, 0.95))) if boot else None
    records = df.to_dict(orient="records")
    return Budget(metric, float(value), calibrated=True, source=f"fit to {len(df)} training runs in {where}",
                  interval=interval, tolerance=tolerance, runs=records)
