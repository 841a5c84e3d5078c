"""The versioned-file reader every reader goes through: what it reads, and the one line it refuses the rest with."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from fp8probe.core.artifacts import SCHEMAS, json_kind, read_artifact
from fp8probe.core.errors import FP8ProbeError
from fp8probe.core.records import CheckRecord


def test_reads_the_current_version_and_the_older_ones_a_reader_takes(tmp_path):
    p = tmp_path / "budget.json"
    for v in (1, 2, 3):
        p.write_text(json.dumps({"schema_version": v, "value": 0.5}))
        assert read_artifact("budget.json", p, "redo")["value"] == 0.5
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"schema_version": SCHEMAS["plan.json"], "rows": []}))
    assert read_artifact("plan.json", p, "redo") == {"schema_version": 1, "rows": []}


@pytest.mark.parametrize(
    "text,match",
    [
        (None, "no plan.json at"),
        ("{", "is not a readable plan.json"),
        ("[1, 2]", "has schema_version None; this fp8probe reads plan.json 1: run it again"),
        (json.dumps({"schema_version": 2}), "has schema_version 2; this fp8probe reads plan.json 1: run it again"),
        (json.dumps({"rows": []}), "has schema_version None"),
    ],
)
def test_refuses_in_one_line_that_says_what_to_do(tmp_path, text, match):
    p = tmp_path / "plan.json"
    if text is not None:
        p.write_text(text)
    with pytest.raises(FP8ProbeError, match=match) as e:
        read_artifact("plan.json", p, "run it again")
    assert "\n" not in str(e.value) and str(e.value).endswith("run it again")


def test_a_plot_reads_through_it_and_skips_a_budget_it_cannot_read(tmp_path):
    """plots read capacity.json / plan.json / recipe.json through read_artifact: another version is refused there
    (a line that says what to do), while a ladder's budget line is only drawn where its file reads."""
    from fp8probe.plots.figures import _budget_beside

    lad = tmp_path / "ladder.csv"
    (tmp_path / "check.json").write_text(json.dumps({"schema_version": 1, "budget": 0.3}))  # an old check
    (tmp_path / "budget.json").write_text(json.dumps({"schema_version": 3, "metric": "kl_q_p", "value": 0.2}))
    assert _budget_beside(lad) == 0.2
    (tmp_path / "check.json").write_text(json.dumps({"schema_version": SCHEMAS["check.json"], "budget": 0.3}))
    assert _budget_beside(lad) == 0.2  # a check.json without a verdict is not a check.json: the budget's line
    plain = {"str": "x", "int": 0, "float": 0.0, "bool": False, "list": [], "dict": {}}  # a check.json's JSON types
    typed = {f.name: None if (k := json_kind(f.type)) is None or k[1] else plain[k[0]] for f in fields(CheckRecord)}
    check = CheckRecord(**typed | {"budget": 0.3})
    check.write(tmp_path / "check.json")
    assert _budget_beside(lad) == 0.3


def _record_of(path):
    """The record type of a committed file, by its name (and, for run.json, by where it lies)."""
    from fp8probe.budget.fit import Budget
    from fp8probe.core import records

    name = path.name
    if name == "run.json":
        return records.TrainingRunRecord if "runs" in path.parts else records.SweepRunRecord
    if name.startswith("budget"):
        return Budget
    by_kind = {r.KIND: r for r in vars(records).values() if isinstance(r, type) and getattr(r, "KIND", "")}
    return by_kind.get(name)


def test_every_committed_file_reads_through_its_record_and_writes_back_the_same_bytes():
    """Every versioned JSON file in the repository (shipped recipes and calibrations, golden files) reads through its
    record type; one at the current version is written back by the record byte for byte (the record is the file:
    its keys, their order and values), one at an older version reads (its missing keys defaulted)."""
    import subprocess
    from pathlib import Path

    from fp8probe.core.artifacts import SCHEMA_KEY

    root = Path(__file__).resolve().parents[2]
    listed = subprocess.run(["git", "ls-files", "*.json"], cwd=root, capture_output=True, text=True).stdout.split()
    seen = {}
    for rel in listed:
        path = root / rel
        record = _record_of(path)
        doc = json.loads(path.read_text(encoding="utf-8"))
        if record is None or not isinstance(doc, dict) or SCHEMA_KEY not in doc:
            continue
        got = record.read(path, "redo")
        seen[record.__name__] = seen.get(record.__name__, 0) + 1
        if doc[SCHEMA_KEY] == record.VERSION:
            assert json.dumps(got.to_json(), indent=2) + "\n" == path.read_text(encoding="utf-8"), rel
    assert {
        "Budget",
        "CalibrationRecord",
        "TrainingRunRecord",
        "SweepRunRecord",
        "RecipeRecord",
        "PlanRecord",
        "CapacityRecord",
        "RolloutsRecord",
    } <= set(seen), seen


@pytest.mark.parametrize(
    "annotation,want",
    [
        ("int", ("int", False)),
        ("float | None", ("float", True)),
        ("list[str] | None", ("list", True)),
        ("dict[str, list[str]]", ("dict", False)),
        ("str | int", None),  # two kinds: not checked
        ("list[int | None]", None),
        ("SourceSpec", None),
    ],
)
def test_a_fields_json_kind_is_read_off_its_annotation(annotation, want):
    assert json_kind(annotation) == want


@pytest.mark.parametrize(
    "change,match",
    [
        ({"batch_size": "8"}, "'batch_size' must be a whole number, got '8'"),
        ({"batch_size": True}, "'batch_size' must be a whole number, got True"),  # a bool is no number
        ({"batch_size": 8.0}, "'batch_size' must be a whole number, got 8.0"),
        ({"include_kv": 1}, "'include_kv' must be true or false or null, got 1"),
        ({"model": None}, "'model' must be a string, got None"),
        ({"seed": "0"}, "'seed' must be a whole number or null"),
        ({"method": []}, "'method' must be an object or null, got \\[\\]"),
    ],
)
def test_a_key_of_the_wrong_json_type_is_refused_in_one_line(tmp_path, change, match):
    """Record.read checks every key against its field's annotation (the one type table): a string, a bool or a float
    where a whole number belongs, a number where true/false belongs, null where the field admits none; the line names
    the file and the key and ends with what to do. A whole number where a number belongs, and null where the field
    admits it, read."""
    from fp8probe.core.records import SweepRunRecord

    good = {"schema_version": 1, "model": "m", "model_path": "p", "scheme": "FP8", "batch_size": 8, "seed": None}
    p = tmp_path / "run.json"
    p.write_text(json.dumps(good))
    assert SweepRunRecord.read(p, "redo").batch_size == 8
    p.write_text(json.dumps(good | change))
    with pytest.raises(FP8ProbeError, match=match) as e:
        SweepRunRecord.read(p, "run the sweep again")
    assert "\n" not in str(e.value) and str(e.value).startswith(str(p)) and str(e.value).endswith("run the sweep again")


def test_a_whole_number_reads_where_a_number_belongs(tmp_path):
    from fp8probe.core.records import TrainingRunRecord

    assert TrainingRunRecord.check_types({"value": 3, "seconds": 2}, "run.json", "redo") is None
    assert TrainingRunRecord.check_types({"value": None}, "run.json", "redo") is None
    with pytest.raises(FP8ProbeError, match="'seconds' must be a number, got None"):
        TrainingRunRecord.check_types({"seconds": None}, "run.json", "redo")
