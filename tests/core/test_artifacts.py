"""The versioned-file reader every reader goes through: what it reads, and the one line it refuses the rest with."""

from __future__ import annotations

import json

import pytest

from fp8probe.core.artifacts import SCHEMAS, read_artifact
from fp8probe.core.errors import FP8ProbeError


def test_reads_the_current_version_and_the_older_ones_a_reader_takes(tmp_path):
    p = tmp_path / "budget.json"
    for v in (1, 2, 3):
        p.write_text(json.dumps({"schema_version": v, "value": 0.5}))
        assert read_artifact("budget.json", p, "redo")["value"] == 0.5
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"schema_version": SCHEMAS["plan.json"], "rows": []}))
    assert read_artifact("plan.json", p, "redo") == {"schema_version": 1, "rows": []}


@pytest.mark.parametrize("text,match", [
    (None, "no plan.json at"),
    ("{", "is not a readable plan.json"),
    ("[1, 2]", "has schema_version None; this fp8probe reads plan.json 1: run it again"),
    (json.dumps({"schema_version": 2}), "has schema_version 2; this fp8probe reads plan.json 1: run it again"),
    (json.dumps({"rows": []}), "has schema_version None"),
])
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
    (tmp_path / "budget.json").write_text(json.dumps({"schema_version": 3, "value": 0.2}))
    assert _budget_beside(lad) == 0.2
    (tmp_path / "check.json").write_text(json.dumps({"schema_version": SCHEMAS["check.json"], "budget": 0.3}))
    assert _budget_beside(lad) == 0.3
