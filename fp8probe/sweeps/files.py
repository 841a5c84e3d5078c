"""The sweep directory, as files: what was run, what was measured, and the state a resume needs.

    DIR/rollouts.safetensors, DIR/rollouts.json   the rollouts (rollouts.py)
    DIR/sensitivity.csv                           one row per unit / group / KV layer / whole model (COLUMNS)
    DIR/run.json                                  schema_version, settings, timings, versions
    DIR/scales.safetensors                        each sequence's static amax, where the sweep calibrated
                                                  (measurement/scales.py SequenceAmax: the recipe's search set's scales)
    DIR/sensitivity.partial.csv                   while a sweep runs: the rows finished so far, fsync'ed
    DIR/sweep.partial.json                        while a sweep runs: the settings it must be resumed with

`write_run` writes run.json; `read_sweep` is how every consumer reads a finished sweep back, checking
that the directory was written by this schema of fp8probe and that the table has the columns and types
it must have, so a truncated, hand-edited or foreign file gets one clear line instead of a traceback.
`open_partial` and `PartialWriter` are the resume state: rows appended one at a time, durable before the next;
a killed sweep resumes where it stopped, refusing other settings or another fp8probe version.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..core.errors import FP8ProbeError
from ..core.files import atomic_write_json, atomic_write_text
from ..core.metrics import METRICS
from ..core.records import SweepRunRecord
from ..model.embedded import NAME as EMBEDDED
from .methods import ESTIMATED

# the columns of sensitivity.csv, in order. `method`: "exact" (measured against the reference), "fisher" (the
# fast estimate, fisher.py) or "path" (the path attribution, attribution.py): on an estimated row only kl_q_p holds
# a number, the estimate; the other metrics are empty; kl_fisher: the estimate wherever one was made (--method
# fisher, auto or path), empty after an exact-only sweep
COLUMNS = [
    "unit",
    "kind",
    "block",
    "group",
    "params",
    "bytes_saved",
    "kv_bytes_saved_per_token",
    "method",
    "sqnr_db",
    *METRICS,
    "kl_fisher",
]
PARTIAL = "sensitivity.partial.csv"
PARTIAL_SETTINGS = "sweep.partial.json"
_INT_COLUMNS = ("block", "params", "bytes_saved", "kv_bytes_saved_per_token")

RUN_FILE = SweepRunRecord.KIND
TABLE = "sensitivity.csv"
log = logging.getLogger(__name__)

_TEXT_COLUMNS = ("unit", "kind", "group", "method")


@dataclass(frozen=True)
class SweepRun:
    directory: Path
    run: SweepRunRecord  # run.json
    table: "object"  # pandas DataFrame with COLUMNS

    @property
    def model_source(self) -> str | None:
        """What load_student takes to load the swept model again (None: the embedded student, whose path
        is a cache that may have moved; a student fp8probe fetches by name (Gemma 3 270M), by that name for the same
        reason; the embedded student depth-pruned by its name, `pruned:K`: its path is the whole student's, which it
        is built from)."""
        from ..model.embedded import STUDENTS
        from ..model.pruning import is_pruned

        if self.run.model == EMBEDDED:
            return None
        return self.run.model if is_pruned(self.run.model) or self.run.model in STUDENTS else self.run.model_path

    def sequence_scales(self, rollouts):
        """The per-sequence static amax the sweep kept (scales.safetensors), if it kept them for these rollouts; None
        where it did not (an older sweep, FP8_DYNAMIC, other rollouts: the recipe then calibrates with a pass)."""
        from ..measurement.scales import SCALES_FILE, SequenceAmax

        path = self.directory / SCALES_FILE
        if not path.is_file():
            return None
        try:
            scales = SequenceAmax.read(path)
        except FP8ProbeError as e:
            log.warning("%s; the recipe calibrates its search set with a pass of its own", e)
            return None
        if scales.rollouts != rollouts.digest() or scales.num_sequences != rollouts.num_sequences:
            log.info("%s was kept for other rollouts than these: the recipe calibrates with a pass", path)
            return None
        return scales

    def check_student(self, student) -> None:
        """Refuse to use this sweep with a model of another architecture than the one it measured."""
        swept = self.run.model_type
        if swept is not None and swept != student.model_type:
            raise FP8ProbeError(
                f"{self.directory} measured a {swept} model, but {self.run.model_path} is now a "
                f"{student.model_type} model: was it run on another model? sweep this one"
            )


def write_run(out: str | Path, run: SweepRunRecord) -> None:
    run.write(Path(out) / RUN_FILE)


def write_table(out: str | Path, df) -> None:
    """sensitivity.csv: floats with 17 significant digits, so that reading it back gives the same numbers."""
    atomic_write_text(Path(out) / TABLE, df.to_csv(index=False, float_format="%.17g"))


def read_sweep(directory: str | Path) -> SweepRun:
    """A finished sweep directory, validated; raises FP8ProbeError naming what is wrong and what to do."""
    import pandas as pd

    d = Path(directory)
    if not d.exists():
        raise FP8ProbeError(f"no such sweep directory: {directory}; run `fp8probe sweep --out {directory}` first")
    if not d.is_dir():
        raise FP8ProbeError(f"{directory} is a file, not a sweep directory; pass the `out` of `fp8probe sweep`")
    run_file, table = d / RUN_FILE, d / TABLE
    if not run_file.is_file() or not table.is_file():
        partial = (
            " (it holds an unfinished sweep: finish it with `fp8probe sweep ... --resume`)"
            if (d / PARTIAL).exists()
            else ""
        )
        raise FP8ProbeError(
            f"{directory} is not a finished sweep (no {RUN_FILE} / {TABLE}){partial}; run `fp8probe sweep`"
        )
    run = SweepRunRecord.read(run_file, "run the sweep again with this version")
    try:
        df = pd.read_csv(table, dtype={c: str for c in _TEXT_COLUMNS})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise FP8ProbeError(f"{table} is not a readable CSV ({str(e).splitlines()[0]}); run the sweep again") from e
    if "method" not in df.columns:  # written before the fast estimate existed: every row was measured
        df["method"] = "exact"
        df["kl_fisher"] = float("nan")
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise FP8ProbeError(
            f"{table} lacks the columns {', '.join(missing[:5])}; it was not written by this "
            "fp8probe: run the sweep again"
        )
    numeric = [c for c in COLUMNS if c not in _TEXT_COLUMNS]
    bad = [c for c in numeric if not pd.api.types.is_numeric_dtype(df[c])]
    if bad:
        raise FP8ProbeError(f"{table}: column {bad[0]!r} holds values that are not numbers; run the sweep again")
    if df[list(_TEXT_COLUMNS)].isna().any().any():
        raise FP8ProbeError(f"{table} has rows without a unit, kind or group (truncated?); run the sweep again")
    bad_method = sorted(set(df["method"]) - {"exact", *ESTIMATED})
    if bad_method:
        raise FP8ProbeError(
            f"{table}: unknown method {bad_method[0]!r} (exact, {', '.join(ESTIMATED)}); run the sweep again"
        )
    # every value is a number except sqnr_db (NaN on whole-model rows by definition), kl_fisher (NaN where no
    # estimate was made) and, on rows of the fast estimate, every metric but kl_q_p
    estimated = df["method"].isin(ESTIMATED)
    for c in numeric:
        if c in ("sqnr_db", "kl_fisher"):
            continue
        holes = df[c].isna() & ~(estimated & (c in METRICS) & (c != "kl_q_p"))
        if holes.any():
            row = df.index[holes][0] + 2
            raise FP8ProbeError(f"{table}:{row} has no value in {c!r} (truncated?); run the sweep again")
    return SweepRun(d, run, df[COLUMNS])


# ---------------------------------------------------------------------------------------------------
# resume state


def sweep_settings(
    student, rollouts, scheme, granularity, include_kv, kv, batch_size, method: dict | None = None
) -> dict:
    """What a resume must match: model, scheme, granularity, KV scheme, batch size, the rollouts' bytes, and the
    method with its settings (estimator, label draws, seed, exact rows of --method auto)."""
    return {
        "fp8probe_version": __version__,
        "model": student.name,
        "scheme": scheme.name,
        "granularity": granularity,
        "include_kv": include_kv,
        "kv": {"fmt": kv.fmt, "strategy": kv.strategy, "scale": kv.scale},
        "batch_size": batch_size,
        "rollouts_sha256": rollouts.digest(),
        "dtype": str(next(student.model.parameters()).dtype),
        "method": method or {"method": "exact"},
    }


def check_resume_state(out: Path, resume: bool) -> dict | None:
    """The settings of the unfinished sweep in `out` (None when there is none), if it can be resumed by this
    fp8probe; refuses an unfinished sweep without --resume, and one written by another version."""
    part, sfile = out / PARTIAL, out / PARTIAL_SETTINGS
    if not part.exists():
        return None
    if not resume:
        raise FP8ProbeError(f"{out} holds an unfinished sweep; pass `resume` to continue it, or choose another `out`")
    try:
        old = json.loads(sfile.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FP8ProbeError(
            f"`resume`: {sfile} is missing or unreadable ({e}); start the sweep again in an empty `out`"
        ) from e
    if not isinstance(old, dict):
        raise FP8ProbeError(f"`resume`: {sfile} is not a JSON object; start the sweep again in an empty `out`")
    if old.get("fp8probe_version") != __version__:
        raise FP8ProbeError(
            f"`resume`: the saved sweep in {out} was made by fp8probe "
            f"{old.get('fp8probe_version', 'older than 0.1.1')}, this is {__version__}; "
            "start a new sweep in another `out`"
        )
    return old


@dataclass(frozen=True)
class PartialRows:
    """Where a sweep keeps its finished rows (`directory`/sensitivity.partial.csv, durable row by row), and whether it
    resumes from the rows already there (`resume`: the settings they were made with must match)."""

    directory: Path
    resume: bool = False


def open_partial(out: Path, settings: dict, resume: bool) -> dict[str, dict]:
    """Rows already finished in `out` (resume), after checking they were made with the same settings.

    Nothing is written here: the resume state appears with the first finished row (_PartialWriter), so a
    failure before that row leaves no state behind that would have to be resumed.
    """
    old = check_resume_state(out, resume)
    if old is not None:
        if old != settings:
            diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
            raise FP8ProbeError(
                f"`resume`: the saved sweep in {out} was run with other settings ({', '.join(diff)}); "
                "rerun with the same settings or without `resume`"
            )
        return _read_partial(out / PARTIAL)
    (out / PARTIAL_SETTINGS).unlink(missing_ok=True)
    return {}


def _read_partial(path: Path) -> dict[str, dict]:
    """Rows of a partial CSV; a last line cut off by a kill is dropped."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]
    done = {}
    for i, rec in enumerate(csv.DictReader(lines), 2):
        if None in rec or any(rec.get(c) is None for c in COLUMNS):
            continue
        try:
            done[rec["unit"]] = _parse(rec)
        except ValueError as e:
            raise FP8ProbeError(
                f"`resume`: {path}:{i} is not a row fp8probe wrote ({e}); start the sweep again "
                "without `resume` in an empty `out`"
            ) from e
    # rewrite without the cut-off line, so that appends start on a fresh line
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    for r in done.values():
        w.writerow(_fmt(r))
    atomic_write_text(path, buf.getvalue())
    return done


def _parse(rec: dict) -> dict:
    out = {}
    for c in COLUMNS:
        v = rec[c]
        out[c] = v if c in _TEXT_COLUMNS else (int(v) if c in _INT_COLUMNS else float(v or "nan"))
    return out


def _fmt(r: dict) -> dict:
    return {c: (repr(float(r[c])) if isinstance(r[c], float) else r[c]) for c in COLUMNS}


class PartialWriter:
    """Appends one CSV row at a time and makes it durable (fsync) before the next row starts.

    The file (and the settings it must be resumed with) is created with the first row.
    """

    def __init__(self, out: Path, settings: dict):
        self.path, self.settings_path, self.settings = out / PARTIAL, out / PARTIAL_SETTINGS, settings
        self.f = None

    def append(self, row: dict):
        if self.f is None:
            new = not self.path.exists() or self.path.stat().st_size == 0
            if new:
                atomic_write_json(self.settings_path, self.settings)
            self.f = open(self.path, "a", newline="")
            self.w = csv.DictWriter(self.f, fieldnames=COLUMNS)
            if new:
                self.w.writeheader()
        self.w.writerow(_fmt(row))
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self):
        if self.f is not None:
            self.f.close()


def finish_sweep(out: str | Path) -> None:
    """Drop the resume state once sensitivity.csv and run.json are written."""
    for f in (PARTIAL, PARTIAL_SETTINGS):
        (Path(out) / f).unlink(missing_ok=True)
