"""A user's own verl runs as a runs table: `fp8probe budget --from-verl RUN.jsonl[:level=L,seed=S,objective=O] ...`.

verl's file logger (verl/utils/tracking.py, FileLogger: `trainer.logger=['file']`) writes one JSON object per step,
`{"step": N, "data": {metric: value, ...}}`. A run is one such file; what it trained (its level: "0" for the
mismatch-free twin, e.g. BF16 rollouts; any other name for a rollout configuration), its seed and its objective are
given after the path, since the file does not hold them. Per run:

    quality        the validation key (`verl_quality`, default the one `val-core/...` key the files share; verl's
                   val-core metrics are higher-is-better accuracies), its mean over the run's validations (auc) or
                   its last value (final); quality_start its first validation (verl validates before training by
                   default, trainer.val_before_train)
    mismatch       the mean over the run's steps of `verl_mismatch` (default rollout_corr/kl: verl's k1 estimate of
                   KL(rollout || trainer) on the rollout's own samples); 0 for the level-0 runs, whose rollouts are
                   the baseline the others are compared with

The table has the columns `fp8probe budget` reads (objective, level, seed, metric, mismatch, quality, quality_start,
higher_is_better) and says which keys it used.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.settings import Settings, opt

QUALITY_PREFIX = "val-core/"
STATS = ("auc", "final")


@dataclass(frozen=True)
class VerlRunsSettings(Settings):
    """Which verl runs become the runs table, and which of their keys are the quality and the mismatch."""

    from_verl: tuple[str, ...] = opt(
        (),
        "verl file-logger JSONL runs, one file per run: PATH:level=L,seed=S[,objective=O] (level 0: the "
        "mismatch-free twin)",
    )
    verl_quality: str | None = opt(None, "the quality key (default: the one val-core/* key; higher is better)")
    verl_mismatch: str = opt("rollout_corr/kl", "the mismatch key, averaged over a run's steps")
    verl_quality_stat: str = opt(
        "auc", "a run's quality: the mean of its validations (auc) or the last (final)", choices=STATS
    )


@dataclass(frozen=True)
class VerlRun:
    path: Path
    level: str
    seed: int
    objective: str


def parse_run(spec: str) -> VerlRun:
    """`PATH:level=L,seed=S[,objective=O]`."""
    head, _, tail = spec.rpartition(":")
    path, attrs = (head, tail) if head and "=" in tail else (spec, "")
    fields = {}
    for part in filter(None, attrs.split(",")):
        key, eq, value = part.partition("=")
        if not eq or key not in ("level", "seed", "objective"):
            raise FP8ProbeError(f"`from_verl` {spec}: give PATH:level=L,seed=S[,objective=O] (not {part!r})")
        fields[key] = value
    if "level" not in fields or "seed" not in fields:
        raise FP8ProbeError(
            f"`from_verl` {spec}: a verl log does not say what it trained; give PATH:level=L,seed=S (level 0 for the "
            "mismatch-free twin)"
        )
    try:
        seed = int(fields["seed"])
    except ValueError as e:
        raise FP8ProbeError(f"`from_verl` {spec}: seed must be an integer") from e
    return VerlRun(Path(path), fields["level"], seed, fields.get("objective", "opd"))


def read_log(path: Path) -> list[tuple[int, dict]]:
    """(step, data) of every line of a verl file-logger JSONL, in file order."""
    if not path.is_file():
        raise FP8ProbeError(f"no such verl log: {path}")
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise FP8ProbeError(f"{path}:{i} is not JSON ({e.msg}): give verl's file-logger output") from e
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or not isinstance(rec.get("data"), dict):
            raise FP8ProbeError(f'{path}:{i} is not a verl file-logger line ({{"step": N, "data": {{...}}}})')
        out.append((rec["step"], rec["data"]))
    if not out:
        raise FP8ProbeError(f"{path} holds no logged step")
    return out


def _values(log, key: str) -> list[float]:
    return [float(d[key]) for _, d in sorted(log, key=lambda x: x[0]) if isinstance(d.get(key), (int, float))]


def quality_key(logs: dict, given: str | None) -> str:
    """The quality key: `given`, or the one val-core/* key every run logs."""
    if given is not None:
        return given
    shared = set.intersection(
        *({k for _, d in log for k in d if k.startswith(QUALITY_PREFIX)} for log in logs.values())
    )
    if len(shared) != 1:
        found = ", ".join(sorted(shared)) or "none"
        raise FP8ProbeError(
            f"the runs share {len(shared)} val-core/* keys ({found}): name the quality with `verl_quality`"
        )
    return shared.pop()


def verl_runs_table(settings: VerlRunsSettings):
    """(the runs table of `settings.from_verl`, the keys used in words); each run read and checked first."""
    import pandas as pd

    runs = [parse_run(s) for s in settings.from_verl]
    if not runs:
        raise FP8ProbeError("`from_verl`: give the JSONL files of the runs")
    logs = {r.path: read_log(r.path) for r in runs}
    quality = quality_key(logs, settings.verl_quality)
    rows = []
    for r in runs:
        q, m = _values(logs[r.path], quality), _values(logs[r.path], settings.verl_mismatch)
        if not q:
            raise FP8ProbeError(f"{r.path} logs no {quality!r}: name the quality with `verl_quality`")
        if not m and r.level != "0":
            raise FP8ProbeError(
                f"{r.path} logs no {settings.verl_mismatch!r}: turn on verl's rollout correction metrics "
                "(algorithm.rollout_correction) or name the mismatch with `verl_mismatch`"
            )
        if not all(math.isfinite(x) for x in q + m):
            raise FP8ProbeError(f"{r.path}: {quality} or {settings.verl_mismatch} holds a value that is not finite")
        value = sum(q) / len(q) if settings.verl_quality_stat == "auc" else q[-1]
        rows.append(
            {
                "objective": r.objective,
                "level": r.level,
                "seed": r.seed,
                "metric": settings.verl_mismatch,
                "mismatch": 0.0 if r.level == "0" else sum(m) / len(m),
                "mismatch_run": sum(m) / len(m) if m else float("nan"),
                "quality": value,
                "quality_start": q[0],
                "higher_is_better": True,
                "source": str(r.path),
            }
        )
    words = (
        f"quality {quality} ({settings.verl_quality_stat} over each run's validations, higher is better), mismatch "
        f"{settings.verl_mismatch} (mean over each run's steps; 0 for the level-0 runs, the baseline)"
    )
    return pd.DataFrame(rows), words
