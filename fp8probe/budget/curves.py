"""Learning curves of a calibration (`fp8probe calibrate`), read back to say how many steps a rollout configuration
needs to reach a target quality.

A calibration directory holds, per objective, level and seed, the held-out quality every `eval_every` steps
(runs/OBJECTIVE/LEVEL-seedS/eval.csv: reverse KL(student || teacher), lower is better) and the level's measured
mismatch (runs.csv). For a configuration whose mismatch m (on the calibration's metric) was measured elsewhere:

- a configuration that *is* a calibrated level (e.g. `stale:1` for asynchronous rollouts one step behind) takes
  that level's own curves;
- otherwise its curve is interpolated, seed by seed (the seeds are paired: one data order, one generation seed),
  between the two levels of the noise ruler that bracket m, linearly in m: (1 - w) x lower + w x upper;
- beyond the last calibrated level nothing is extrapolated: the configuration is refused (and so is one the check
  rejects, in apps/plan.py).

steps_to(curve, target) is the first step at which the seed-averaged curve reaches the target, linear between
evaluations; None when it never does within the calibrated steps. Its interval is a bootstrap over seeds (paired:
every configuration and BF16 resample the same seeds), widened for few seeds (core/stats.expansion).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.records import CalibrationRecord
from ..core.stats import LEVEL, expansion

QUALITY_COLUMN = "reverse_kl"  # what training/runs.py evaluates; lower is better


@dataclass(frozen=True)
class Curves:
    """One objective's learning curves: `steps` (the evaluation steps), per level name the [seeds x steps] quality
    and the level's mean measured mismatch; `seeds` shared by every level (the paired design)."""

    objective: str
    metric: str
    steps: tuple[int, ...]
    seeds: tuple[int, ...]
    curves: dict  # level name -> numpy [len(seeds), len(steps)]
    mismatch: dict  # level name -> mean measured mismatch over seeds
    seed_mismatch: dict  # level name -> numpy [len(seeds)]: each seed's measured mismatch
    kinds: dict  # level name -> kind (none, noise, stale, fp8, kv)
    tolerance: float
    source: str

    @property
    def ruler(self) -> list[str]:
        """The levels a measured mismatch is interpolated on: mismatch-free and noise, by mismatch."""
        return sorted((n for n, k in self.kinds.items() if k in ("none", "noise")), key=lambda n: self.mismatch[n])

    def stale_runs(self, level: str):
        """Each seed's measured mismatch of a calibrated level (e.g. stale:1), or one line saying it is missing."""
        if level not in self.seed_mismatch:
            raise FP8ProbeError(
                f"the calibration {self.source} has no {level} level for {self.objective}: calibrate "
                f"with `levels` ... {level}, or give a `stale` checkpoint"
            )
        return self.seed_mismatch[level]

    def clean_final(self) -> float:
        return float(self.curves[self.ruler[0]][:, -1].mean())

    def default_target(self) -> float:
        """The mismatch-free runs' final quality, within the calibration's tolerance (lower is better)."""
        return self.clean_final() * (1 + self.tolerance)

    def curve_at(self, mismatch: float, level: str | None = None):
        """[seeds x steps] for a configuration: a calibrated `level`'s own curves, or those interpolated at
        `mismatch` on the ruler. Raises FP8ProbeError beyond the ruler's last level."""
        if level is not None:
            if level not in self.curves:
                raise FP8ProbeError(
                    f"the calibration {self.source} has no level {level!r} for {self.objective}; "
                    f"it has {', '.join(self.curves)}"
                )
            return self.curves[level]
        ruler = self.ruler
        ms = [self.mismatch[n] for n in ruler]
        if mismatch <= ms[0]:
            return self.curves[ruler[0]]
        for (a, ma), (b, mb) in zip(zip(ruler, ms), zip(ruler[1:], ms[1:])):
            if mismatch <= mb:
                w = (mismatch - ma) / (mb - ma) if mb > ma else 1.0
                return (1 - w) * self.curves[a] + w * self.curves[b]
        raise FP8ProbeError(
            f"mismatch {mismatch:.4g} lies beyond the calibration's last level ({ms[-1]:.4g}): not extrapolated"
        )


def steps_to(curve, steps, target: float) -> float | None:
    """First step at which `curve` (one value per evaluation step) is at or below `target`, linear between
    evaluations; None if it never is."""
    prev_s, prev_q = None, None
    for s, q in zip(steps, curve):
        if q <= target:
            if prev_q is None or prev_q == q:
                return float(s)
            return float(prev_s + (s - prev_s) * (prev_q - target) / (prev_q - q))
        prev_s, prev_q = s, q
    return None


def steps_with_interval(curves: Curves, seed_curves, baseline, target: float, n: int = 1000, seed: int = 0):
    """Steps to `target` of the seed-mean of `seed_curves` [seeds x steps], its interval, and the ratio of the
    `baseline`'s steps to it (a speed-up in steps) with its interval, from one paired bootstrap over seeds.
    Returns (steps, (lo, hi), ratio, (lo, hi)); None where the target is not reached (an upper end of None: not
    reached in some resamples, so no upper bound)."""
    import numpy as np

    steps = curves.steps
    point = steps_to(seed_curves.mean(0), steps, target)
    base = steps_to(baseline.mean(0), steps, target)
    ratio = base / point if point and base else None
    k = seed_curves.shape[0]
    if k < 2:
        return point, (point, point), ratio, (ratio, ratio)
    rng = np.random.default_rng(seed)
    got, rat = [], []
    for _ in range(n):
        pick = rng.integers(0, k, k)
        s = steps_to(seed_curves[pick].mean(0), steps, target)
        b = steps_to(baseline[pick].mean(0), steps, target)
        got.append(math.inf if s is None else s)
        rat.append(0.0 if s is None or b is None else b / s)
    f = expansion(k)

    return point, _widen(got, point, f), ratio, _widen(rat, ratio, f)


def _widen(values, centre: float | None, f: float) -> tuple[float | None, float | None]:
    """The bootstrap's percentile interval of `values` (inf: a resample that never reached the target) widened about
    `centre` by `f`; the low end kept within [0, centre], the high end None where it is never reached."""
    import numpy as np

    if centre is None:
        return None, None
    # a percentile between two resamples that never reach the target is itself never reached (numpy's interpolation
    # makes it inf - inf = nan, and a nan low end read as 0 steps)
    with np.errstate(invalid="ignore"):
        q = np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    lo, hi = np.nan_to_num(q, nan=math.inf, posinf=math.inf)
    lo = min(centre, max(0.0, centre - f * (centre - lo)))  # too few resamples reach it for a lower end below it
    hi = None if not math.isfinite(hi) else centre + f * (hi - centre)
    return float(lo), hi if hi is None else float(hi)


def _seed_doses(d: Path, objective: str, level: str, rows, n: int):
    """Each seed's own dose of a level: its draws in doses.json where the calibration measured doses on the check's
    scale (a stale level: one per seed), else the mismatch each run measured while it trained (runs.csv before
    doses: `mismatch` was that run-mean KL too)."""
    import numpy as np

    f = d / "doses.json"
    if f.is_file():
        known = json.loads(f.read_text(encoding="utf-8"))
        draws = (known.get(f"{objective}/{level}") or known.get(level) or {}).get("draws") or []
        if level.startswith("stale") and len(draws) >= n:
            return np.asarray(draws[:n], dtype=float)
        return np.full(n, float(rows["mismatch"].mean()))
    own = "mismatch_run" if "mismatch_run" in rows.columns and rows["mismatch_run"].notna().all() else "mismatch"
    return rows.sort_values("seed")[own].to_numpy(dtype=float)


def read_curves(directory: str | Path, objective: str | None = None) -> Curves:
    """The learning curves of one objective in a calibration directory (the only one, or `objective`)."""

    import numpy as np
    import pandas as pd

    from ..sources.sources import parse_source

    d = Path(directory)
    if not (d / "runs.csv").is_file() or not (d / "calibrate.json").is_file():
        raise FP8ProbeError(
            f"`calibration` {directory}: not a directory written by `fp8probe calibrate` (no runs.csv "
            "and calibrate.json)"
        )
    meta = CalibrationRecord.read(d / CalibrationRecord.KIND, "run `fp8probe calibrate` again")
    df = pd.read_csv(d / "runs.csv", dtype={"level": str})
    objectives = sorted(df["objective"].unique())
    if objective is None:
        if len(objectives) > 1:
            raise FP8ProbeError(
                f"`calibration` {directory} holds several objectives ({', '.join(objectives)}); pick "
                "one with `objective`"
            )
        objective = objectives[0]
    if objective not in objectives:
        raise FP8ProbeError(f"`objective` {objective}: the calibration {directory} ran {', '.join(objectives)}")
    df = df[df["objective"] == objective]
    seeds = sorted(int(s) for s in df["seed"].unique())
    if isinstance(meta.seeds, int):  # the ladder's seeds; seeds added at a few levels (--max-runs) are not
        seeds = [s for s in seeds if s < meta.seeds]  # every level's, so the curves pair on the ladder's
    curves, mismatch, seed_mismatch, kinds, steps = {}, {}, {}, {}, None
    for level, rows in df.groupby("level", sort=False):
        rows = rows[rows["seed"].astype(int).isin(seeds)]
        if sorted(int(s) for s in rows["seed"]) != seeds:
            continue  # an unfinished level: not every seed
        slug = parse_source(level).slug
        per_seed = []
        for s in seeds:
            ev = pd.read_csv(d / "runs" / objective / f"{slug}-seed{s}" / "eval.csv")
            if steps is None:
                steps = tuple(int(x) for x in ev["step"])
            if tuple(int(x) for x in ev["step"]) != steps:
                raise FP8ProbeError(
                    f"the calibration {directory} evaluated {level} seed {s} at other steps than the "
                    "rest; rerun it with one --eval-every"
                )
            per_seed.append(ev[QUALITY_COLUMN].to_numpy(dtype=float))
        curves[level] = np.stack(per_seed)
        mismatch[level] = float(rows["mismatch"].mean())
        seed_mismatch[level] = _seed_doses(d, objective, level, rows, len(seeds))
        kinds[level] = str(rows["kind"].iloc[0])
    if not any(k == "none" for k in kinds.values()):
        raise FP8ProbeError(f"the calibration {directory} has no finished mismatch-free level for {objective}")
    return Curves(
        objective,
        str(df["metric"].iloc[0]),
        steps,
        tuple(seeds),
        curves,
        mismatch,
        seed_mismatch,
        kinds,
        float(meta.tolerance),
        str(d),
    )
