"""Every versioned file fp8probe writes, in one table: the schema version each is written and read with.

    file                  version  record (core/records.py unless named)   read back by
    rollouts.json         1        RolloutsRecord (+ .safetensors)          load_rollouts
    run.json              1        SweepRunRecord (a sweep)                 read_sweep
    recipe.json           3        RecipeRecord (Recipe.record)             read_recipe (beside recipe.yaml; also 1, 2)
    budget.json           4        budget.fit.Budget                        read_budget (also 1, 2, 3)
    agreement.json        1        AgreementRecord                          plots
    capacity.json         1        CapacityRecord                           plots
    mismatch.json         1        MismatchRecord (measure)                 -
    ladder.json           1        LadderRecord (beside ladder.csv)         -
    check.json            3        CheckRecord (check)                      plots
    calibrate.json        3        CalibrationRecord (Experiment.record)    calibrate --resume / --refit, plan's curves
    calibration run.json  3        TrainingRunRecord (runs/*/run.json)      a resumed calibration (also 2)
    plan.json             1        PlanRecord (plan.csv beside it)          plots
    audit.json            1        AuditRecord (Audit.record)               -
    series.json           1        SeriesRecord (check --checkpoints)       -
    student.json          1        StudentRecord (beside an export)         audit (the student to audit against)

recipe.json is at 2: form, target, kv_scale, memory_target, fp8_share, effective_bits and the search's moves; at 3
`measured` is the held-out prompts' value (measured_search the search set's, measured_interval, split), and a move
of the search has an `outcome` (taken, not better, noise, probe).
budget.json is at 2: paired, levels (each level's loss, interval and fit), seed_spread; at 3 the value and interval
are the benchmark dose of a dose–response fit (`method`, `dose_response`: families, fits, curves, predictions), or
the isotonic fit where no family fits; a level holds both fits (`fitted`, `isotonic`). At 4 the loss is `response`
(gain: the share of the training gain lost; relative before), the seed a random effect in the interval, and the
budget names its `student` and `teacher` (name, sha256), `objective` and `dose` (what `mismatch` measured), its
`censored` and `interval_censored` ends and the `kinds` run as levels with their own loss.
calibrate.json is at 2: objectives, tolerance, quality, bracket, max_added, added_levels; runs under runs/<objective>/.
At 3: `response`, the levels' `dose` on check's scale (`dose_mapping` beside the run-mean KL), no target_ratio
(the allocation's stop rule is its preset budget); a resume reads 2.
check.json is at 2: the verdict may be UNCERTAIN; measured_interval, interval_level, prompts_to_decide, num_prompts.
At 3: `config` (the configuration as budget levels name it), `judged_engine` (the budget's scale the verdict's figure
was measured on), `decided_by` (the rule, the number it compared with, the seeds that would decide a level) and a
`margin` to that number (null where a level's own loss decided).
Every file is a `Record` (below): a frozen dataclass per kind, its fields the file's keys in the file's order, its
version on the type (`VERSION`, from this table), one `write` and one `read`; no other module spells the version
key. Readers go through Record.read (read_artifact), which refuses a version not listed here or in ALSO_READ, and a
key whose JSON type is not its field's (Record.check_types: the records' annotations are the one type table). An
optional field that readers default may be added within a version (rollouts.json's sampling.samples_per_prompt,
default 1; the `arithmetic` record). Changing what a file holds otherwise means a new version here, and a reader that
refuses the old one in one line (or reads it, as read_recipe reads version 1).
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from .errors import FP8ProbeError
from .files import atomic_write_json

# the key every versioned file starts with
SCHEMA_KEY = "schema_version"

SCHEMAS = {
    "rollouts.json": 1,
    "run.json": 1,
    "recipe.json": 3,
    "audit.json": 1,
    "series.json": 1,
    "budget.json": 4,
    "agreement.json": 1,
    "capacity.json": 1,
    "mismatch.json": 1,
    "ladder.json": 1,
    "check.json": 3,
    "calibrate.json": 3,
    "calibration run.json": 3,  # a calibration run's run.json: versioned with calibrate.json
    "plan.json": 1,
    "student.json": 1,
}


# the older versions each reader still takes (read_recipe reads 1 and 2; read_budget 1, 2 and 3)
ALSO_READ = {"recipe.json": (1, 2), "budget.json": (1, 2, 3), "calibrate.json": (2,), "calibration run.json": (2,)}


def version(kind: str) -> int:
    """The schema version `kind` (a file name of SCHEMAS) is written with."""
    if kind not in SCHEMAS:
        raise FP8ProbeError(f"internal: {kind} is not a versioned artifact")
    return SCHEMAS[kind]


def schema_of(doc) -> object:
    """The schema version a file's parsed JSON (or a safetensors header's metadata) says it has; None if none."""
    return doc.get(SCHEMA_KEY) if isinstance(doc, dict) else None


class _Absent:
    """The value of a field whose key a file lacks (written before the field was added within its version)."""

    def __bool__(self):
        return False

    def __repr__(self):
        return "ABSENT"


ABSENT = _Absent()


def optional(default=None):
    """A record's field that the file leaves out while it is None (a key written only when it has a value)."""
    return field(default=default, metadata={"omit_none": True})


def added():
    """A record's field added within its file's version: ABSENT (and left out) where an older file lacks its key;
    None is written as null."""
    return field(default=ABSENT)


@dataclass(frozen=True, kw_only=True)
class Record:
    """A versioned JSON file as a typed value: a frozen dataclass whose fields are the file's keys, in the file's order,
    after its schema version. A subclass names its file (`KIND`, a SCHEMAS name) and gets its `VERSION` from SCHEMAS,
    the one table of versions. `to_json` is the file's content (override `body` where a field is stored in another
    form), `write` writes it atomically, `read` reads and checks one (read_artifact) and builds the record
    (`from_json`; override it to read an older version). Field values are what JSON holds (numbers, strings, lists,
    dicts) unless `body` and `from_json` say otherwise. Fields are keywords (`kw_only`), so a field with a default may
    stand before one without, in the file's order."""

    KIND: ClassVar[str] = ""
    VERSION: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("KIND"):
            cls.VERSION = version(cls.KIND)

    def body(self) -> dict:
        """The file's keys after the version, in field order; a field made with `optional()` is left out while None."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is ABSENT or (value is None and f.metadata.get("omit_none")):
                continue
            out[f.name] = value
        return out

    def to_json(self) -> dict:
        return {SCHEMA_KEY: self.VERSION, **self.body()}

    def write(self, path: str | Path) -> None:
        atomic_write_json(path, self.to_json())

    @classmethod
    def from_json(cls, doc: dict):
        """The record of a parsed file of this kind (its version already checked): the keys that are fields; a key
        the file lacks takes the field's default (a file written before an optional field existed)."""
        names = {f.name for f in fields(cls) if f.init}
        try:
            return cls(**{k: v for k, v in doc.items() if k in names})
        except TypeError as e:  # a required key missing
            raise FP8ProbeError(f"a {cls.KIND} lacks a key ({e}): write it again with this fp8probe") from e

    @classmethod
    def read(cls, path: str | Path, redo: str):
        """The record of the file at `path`: checked as read_artifact checks, every key's JSON type checked against
        its field's (check_types), then `from_json`."""
        doc = read_artifact(cls.KIND, path, redo)
        cls.check_types(doc, path, redo)
        return cls.from_json(doc)

    @classmethod
    def check_types(cls, doc: dict, where, redo: str) -> None:
        """Every key of `doc` whose field is annotated with one JSON kind (str, int, float, bool, list, dict; `| None`
        admits null) holds that kind, or one line names the key, what it must be and what to do (`redo`). A bool is
        no number, an int is a float; keys the file lacks take their defaults (from_json)."""
        for f in fields(cls):
            kind = json_kind(f.type) if f.name in doc else None
            if kind is None:
                continue
            base, nullable, value = kind[0], kind[1], doc[f.name]
            if value is None and nullable:
                continue
            if not isinstance(value, JSON_KINDS[base][0]) or (isinstance(value, bool) and base != "bool"):
                either = " or null" if nullable else ""
                raise FP8ProbeError(f"{where}: {f.name!r} must be {JSON_KINDS[base][1]}{either}, got {value!r}: {redo}")


# a field annotation's JSON kind -> (the Python types that hold it, its words)
JSON_KINDS = {
    "str": ((str,), "a string"),
    "int": ((int,), "a whole number"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "true or false"),
    "list": ((list,), "a list"),
    "dict": ((dict,), "an object"),
}


def json_kind(annotation) -> tuple[str, bool] | None:
    """(the JSON kind a field's annotation names, whether it admits null): "int | None" -> ("int", True),
    "list[str]" -> ("list", False); None for any other annotation (a union of kinds, a nested record)."""
    parts = [p.strip() for p in str(annotation).split("|")]
    kinds = [p.split("[")[0] for p in parts if p != "None"]
    if len(kinds) != 1 or kinds[0] not in JSON_KINDS:
        return None
    return kinds[0], "None" in parts


def read_artifact(kind: str, path, redo: str) -> dict:
    """The versioned JSON file of `kind` at `path`, read and checked: one that is missing, not JSON, not an object, or
    of a schema version this fp8probe does not read (SCHEMAS, ALSO_READ) fails in one line that says what to do
    (`redo`). The readers the module's docstring names go through here."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise FP8ProbeError(f"no {kind} at {p}: {redo}") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FP8ProbeError(f"{p} is not a readable {kind} ({type(e).__name__}: {e}): {redo}") from e
    got = schema_of(doc)
    if got != version(kind) and got not in ALSO_READ.get(kind, ()):
        raise FP8ProbeError(f"{p} has schema_version {got!r}; this fp8probe reads {kind} {version(kind)}: {redo}")
    return doc


def versions() -> dict:
    """The versions a run was made with (run.json, mismatch.json, ladder.json)."""
    import torch
    import transformers

    from .. import __version__

    return {
        "fp8probe": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


# how every measurement lays out its arithmetic (Rollouts.batches); the words stored beside the batch size
BATCHING = "batch_size sequences at a time in rollout order, each batch cut to its longest sequence"


def arithmetic(batch_size: int) -> dict:
    """The arithmetic a measurement ran in, stated beside its figures (run.json, mismatch.json, ladder.json,
    check.json, plan.json). Another batch composition pads to other lengths and moves the GEMMs' last fp32 bits, and
    an FP8 code on a rounding boundary flips: the figure moves within its interval (docs/numerics.md, "The arithmetic
    a measurement ran in"). The thread count is recorded too (measured: it did not move any figure on this CPU)."""
    import torch

    return {"batch_size": int(batch_size), "batching": BATCHING, "torch_threads": torch.get_num_threads()}
