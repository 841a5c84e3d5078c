"""A user's own verl runs as a runs table: `fp8probe budget --from-verl RUN.jsonl:level=L,seed=S,objective=O,...`.

verl's file logger (verl/utils/tracking.py, FileLogger: `trainer.logger=['file']`) writes one JSON object per step,
`{"step": N, "data": {metric: value, ...}}`. A run is one such file; what it trained (its level: "0" for the
mismatch-free twin, e.g. BF16 rollouts; any other name for a rollout configuration), its seed and its objective are
given after the path, since the file does not hold them (the objective is required: verl's OPD losses and GRPO budget
differently). Per run:

    quality        the validation key (`verl_quality`, default the one `val-core/...` key the files share; verl's
                   val-core metrics are higher-is-better accuracies), its mean over the run's validations (auc) or
                   its last value (final); quality_start its first validation (verl validates before training by
                   default, trainer.val_before_train)
    mismatch       with each level's rollout configuration given (`config=`, sources/config.py's names: fp8:SCHEME,
                   kv:fp8, a noise sigma; and `--student`): the level's dose on `check`'s scale, measured on the
                   user's student before training as `calibrate` measures it (training/doses.py), so `check` judges
                   against the budget; 0 for the level-0 runs. The logged figure stays beside it (mismatch_run: the
                   mean over the run's steps of `verl_mismatch`, default rollout_corr/kl, the twin's BF16 baseline
                   included, not zeroed). Without configurations the dose is that logged mean (a budget on verl's
                   metric, which `check` cannot judge: it says so)

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
        "verl file-logger JSONL runs, one file per run: PATH:level=L,seed=S,objective=O[,config=C] (level 0: the "
        "mismatch-free twin; C the level's rollout configuration, e.g. kv:fp8 or fp8:FP8_BLOCK, dosed on check's "
        "scale on `student`)",
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
    config: str | None = None  # the level's rollout configuration (sources/config.py's text), when given


FORM = "PATH:level=L,seed=S,objective=O[,config=C]"


def parse_run(spec: str) -> VerlRun:
    """`PATH:level=L,seed=S,objective=O[,config=C]` (C: a rollout configuration, sources/config.py's text)."""
    from .runs import parse_objective

    path, _, attrs = spec.partition(":level=")
    attrs = "level=" + attrs if attrs else ""
    fields = {}
    for part in filter(None, attrs.split(",")):
        key, eq, value = part.partition("=")
        if not eq or key not in ("level", "seed", "objective", "config"):
            raise FP8ProbeError(f"`from_verl` {spec}: give {FORM} (not {part!r})")
        fields[key] = value
    if "level" not in fields or "seed" not in fields:
        raise FP8ProbeError(
            f"`from_verl` {spec}: a verl log does not say what it trained; give {FORM} (level 0 for the "
            "mismatch-free twin)"
        )
    if "objective" not in fields:
        raise FP8ProbeError(
            f"`from_verl` {spec}: a verl log does not say its loss; give objective=O (opd-k3: verl's supervised k3, "
            "opd-topk, opd-pg: policy-gradient OPD, grpo, grpo-is, grpo-bypass)"
        )
    parse_objective(fields["objective"])  # an unknown objective fails here
    try:
        seed = int(fields["seed"])
    except ValueError as e:
        raise FP8ProbeError(f"`from_verl` {spec}: seed must be an integer") from e
    config = fields.get("config")
    if config is not None:
        from ..sources.sources import parse_source

        level = parse_source(config)  # an unknown configuration fails here
        if level.kind == "stale":
            raise FP8ProbeError(
                f"`from_verl` {spec}: a stale lag's dose on check's scale needs checkpoints of the run; give the "
                "FP8 or KV configuration of a level, or fit the lag's budget with `fp8probe calibrate`"
            )
    return VerlRun(Path(path), fields["level"], seed, fields["objective"], config)


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


def verl_runs(settings: VerlRunsSettings) -> list[VerlRun]:
    """The runs `from_verl` names, parsed and checked: every level but 0 with a configuration, or none."""
    runs = [parse_run(s) for s in settings.from_verl]
    if not runs:
        raise FP8ProbeError("`from_verl`: give the JSONL files of the runs")
    configured = {r.config is not None for r in runs if r.level != "0"}
    if len(configured) > 1:
        raise FP8ProbeError("`from_verl`: give every level's config= or none (a budget on one scale)")
    for r in runs:
        same = {x.config for x in runs if x.level == r.level}
        if len(same) > 1:
            raise FP8ProbeError(
                f"`from_verl`: level {r.level} is given two configurations ({', '.join(map(str, same))})"
            )
    return runs


def verl_runs_table(settings: VerlRunsSettings, dose=None):
    """(the runs table of `settings.from_verl`, the keys used in words); each run read and checked first. `dose`
    (a level's configuration text -> its dose on check's scale, training/doses.py) for runs given their
    configuration."""
    import pandas as pd

    runs = verl_runs(settings)
    logs = {r.path: read_log(r.path) for r in runs}
    quality = quality_key(logs, settings.verl_quality)
    rows = []
    dosed = dose is not None and any(r.config for r in runs)  # the table's scale: check's, or verl's logged one
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
        logged = sum(m) / len(m) if m else float("nan")
        measured = r.config is not None and dose is not None
        rows.append(
            {
                "objective": r.objective,
                # a configured level is named by its configuration, so `check` finds it as one (the user's name kept)
                "level": _level_name(r) if measured else r.level,
                "label": r.level,
                "kind": _kind(r),
                "seed": r.seed,
                "metric": "kl_q_p" if dosed else settings.verl_mismatch,
                "mismatch": 0.0 if r.level == "0" else dose(r.config) if measured else logged,
                "mismatch_run": logged,  # the logged figure, the twin's BF16 baseline kept
                "quality": value,
                "quality_start": q[0],
                "higher_is_better": True,
                "source": str(r.path),
            }
        )
    how = (
        "each level's dose kl_q_p on check's scale, measured on the student from its configuration (the logged "
        f"{settings.verl_mismatch} kept beside it as mismatch_run, the twin's BF16 baseline included)"
        if dosed
        else f"{settings.verl_mismatch} (mean over each run's steps; 0 for the level-0 runs, the baseline)"
    )
    stat = settings.verl_quality_stat
    words = f"quality {quality} ({stat} over each run's validations, higher is better), mismatch {how}"
    return pd.DataFrame(rows), words


def _level_name(r: VerlRun) -> str:
    from ..sources.sources import parse_source

    return "0" if r.level == "0" else parse_source(r.config).name


def _kind(r: VerlRun) -> str:
    """The level's kind for the fit: none (the twin), the configuration's kind, or noise when none is given."""
    if r.level == "0":
        return "none"
    if r.config is None:
        return "noise"
    from ..sources.sources import parse_source

    return parse_source(r.config).kind
