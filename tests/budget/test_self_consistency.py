"""Every level of every shipped budget, checked as `fp8probe check` checks it on the budget's student, gets the verdict
its own measured loss implies (REJECT where the loss's lower end is above the tolerance, ADMIT where its upper end is
within it, UNCERTAIN otherwise): the calibration's evidence and the check agree (docs/admission.md's table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fp8probe.budget.admission import self_check
from fp8probe.budget.evidence import levels_of
from fp8probe.budget.fit import read_budget

ROOT = Path(__file__).resolve().parents[2] / "recipes"
BUDGETS = sorted(p for p in ROOT.glob("*/calibration*/budget-*.json"))


def implied(level, tolerance: float) -> str:
    lo, hi = level.loss_interval
    return "REJECT" if lo > tolerance else "ADMIT" if hi <= tolerance else "UNCERTAIN"


@pytest.mark.committed
@pytest.mark.parametrize("path", BUDGETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_level_gets_the_verdict_its_own_loss_implies(path):
    """Seen failing with the old own-level rule restored (a level's interval must clear its own dose: whole-model
    FP8, which lost 60 % [37, 83], came out UNCERTAIN)."""
    b = read_budget(str(path))
    doses = json.loads((path.parent / "doses.json").read_text()) if (path.parent / "doses.json").exists() else {}
    rows = self_check(b, doses)
    levels = {lv.name: lv for lv in levels_of(b)}
    assert rows, f"{path} names no levels"
    for row in rows:
        assert row["verdict"] == implied(levels[row["level"]], b.tolerance), row
