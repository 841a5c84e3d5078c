"""The sweep directory, as files: `run.json` (what was run) beside `sensitivity.csv` (what was measured).

    DIR/rollouts.safetensors, DIR/rollouts.json   the rollouts (rollouts.py)
    DIR/sensitivity.csv                           one row per unit / group / KV layer / whole model
    DIR/run.json                                  schema_version, settings, timings, versions

`write_run` writes run.json; `read_sweep` is how every consumer reads a finished sweep back, checking
that the directory was written by this schema of fp8probe and that the table has the columns and types
it must have, so a truncated, hand-edited or foreign file gets one clear line instead of a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import FP8ProbeError

RUN_SCHEMA_VERSION = 1
RUN_FILE = "run.json"
TABLE = "sensitivity.csv"

# run.json keys a consumer relies on, with their JSON types
_RUN_KEYS = {"schema_version": int, "model": str, "model_path": str, "scheme": str, "batch_size": int}
_TEXT_COLUMNS = ("unit", "kind", "group")


@dataclass(frozen=True)
class SweepRun:
    directory: Path
    run: dict  # run.json
    table: "object"  # pandas DataFrame with sweep.COLUMNS

    @property
    def model_source(self) -> str | None:
        """What load_student takes to load the swept model again (None: the embedded student, whose path
        is a cache that may have moved)."""
        from .embedded import NAME

        return None if self.run["model"] == NAME else self.run["model_path"]


    def check_student(self, student) -> None:
        """Refuse to use this sweep with a model of another architecture than the one it measured."""
        swept = self.run.get("model_type")
        if swept is not None and swept != student.model_type:
            raise FP8ProbeError(f"{self.directory} measured a {swept} model, but {self.run['model_path']} is now a "
                                f"{student.model_type} model: was it run on another model? sweep this one")


def write_run(out: str | Path, run: dict) -> None:
    from ._files import atomic_write_json

    atomic_write_json(Path(out) / RUN_FILE, {"schema_version": RUN_SCHEMA_VERSION, **run})


def read_sweep(directory: str | Path) -> SweepRun:
    """A finished sweep directory, validated; raises FP8ProbeError naming what is wrong and what to do."""
    import pandas as pd

    from .sweep import COLUMNS

    d = Path(directory)
    if not d.exists():
        raise FP8ProbeError(f"no such sweep directory: {directory}; run `fp8probe sweep --out {directory}` first")
    if not d.is_dir():
        raise FP8ProbeError(f"{directory} is a file, not a sweep directory; pass the --out of `fp8probe sweep`")
    run_file, table = d / RUN_FILE, d / TABLE
    if not run_file.is_file() or not table.is_file():
        partial = " (it holds an unfinished sweep: finish it with `fp8probe sweep ... --resume`)" if (
            d / "sensitivity.partial.csv").exists() else ""
        raise FP8ProbeError(f"{directory} is not a finished sweep (no {RUN_FILE} / {TABLE}){partial}; "
                            "run `fp8probe sweep`")
    try:
        run = json.loads(run_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FP8ProbeError(f"{run_file} is not valid JSON ({e}); run the sweep again") from e
    if not isinstance(run, dict):
        raise FP8ProbeError(f"{run_file} is not a JSON object; run the sweep again")
    version = run.get("schema_version")
    if version != RUN_SCHEMA_VERSION:
        raise FP8ProbeError(f"{run_file} has schema_version {version!r}; this fp8probe reads {RUN_SCHEMA_VERSION} "
                            f"(written by fp8probe {run.get('versions', {}).get('fp8probe', '?')}): run the sweep "
                            "again with this version")
    for key, typ in _RUN_KEYS.items():
        if not isinstance(run.get(key), typ) or isinstance(run.get(key), bool):
            raise FP8ProbeError(f"{run_file}: {key!r} must be a {typ.__name__}, got {run.get(key)!r}; "
                                "run the sweep again")
    try:
        df = pd.read_csv(table, dtype={c: str for c in _TEXT_COLUMNS})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise FP8ProbeError(f"{table} is not a readable CSV ({str(e).splitlines()[0]}); run the sweep again") from e
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise FP8ProbeError(f"{table} lacks the columns {', '.join(missing[:5])}; it was not written by this "
                            "fp8probe: run the sweep again")
    numeric = [c for c in COLUMNS if c not in _TEXT_COLUMNS]
    bad = [c for c in numeric if not pd.api.types.is_numeric_dtype(df[c])]
    if bad:
        raise FP8ProbeError(f"{table}: column {bad[0]!r} holds values that are not numbers; run the sweep again")
    if df[list(_TEXT_COLUMNS)].isna().any().any():
        raise FP8ProbeError(f"{table} has rows without a unit, kind or group (truncated?); run the sweep again")
    # every value is a number except sqnr_db, which is NaN on whole-model rows by definition
    holes = [c for c in numeric if c != "sqnr_db" and df[c].isna().any()]
    if holes:
        row = df.index[df[holes[0]].isna()][0] + 2
        raise FP8ProbeError(f"{table}:{row} has no value in {holes[0]!r} (truncated?); run the sweep again")
    return SweepRun(d, run, df[COLUMNS])
