"""Every level of every shipped budget, checked as `fp8probe check` checks it on the budget's student, gets the verdict
its own measured loss implies (REJECT where the loss's lower end is above the tolerance, ADMIT where its upper end is
within it, UNCERTAIN otherwise): the calibration's evidence and the check agree (docs/admission.md's table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fp8probe.budget.admission import judge
from fp8probe.budget.evidence import levels_of
from fp8probe.budget.fit import read_budget

ROOT = Path(__file__).resolve().parents[2] / "recipes"
BUDGETS = sorted(p for p in ROOT.glob("*/calibration*/budget-*.json"))


def implied(level, tolerance: float) -> str:
    lo, hi = level.loss_interval
    return "REJECT" if lo > tolerance else "ADMIT" if hi <= tolerance else "UNCERTAIN"


def checked(path: Path, level):
    """The level's configuration measured as check measures it: its dose and its interval (doses.json), judged."""
    doses = json.loads((path.parent / "doses.json").read_text()) if (path.parent / "doses.json").exists() else {}
    b = read_budget(str(path))
    key = f"{b.objective}/{level.name}" if level.kind == "stale" else level.name
    interval = (doses.get(key) or {}).get("interval") or [level.dose, level.dose]
    return judge(level.dose, tuple(interval), b, 16, level.config)


@pytest.mark.committed
@pytest.mark.parametrize("path", BUDGETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_level_gets_the_verdict_its_own_loss_implies(path):
    """Seen failing with the old own-level rule restored (a level's interval must clear its own dose: whole-model
    FP8, which lost 60 % [37, 83], came out UNCERTAIN)."""
    b = read_budget(str(path))
    levels = [lv for lv in levels_of(b) if lv.loss_interval is not None and lv.config is not None]
    assert levels, f"{path} names no levels"
    for lv in levels:
        v = checked(path, lv)
        assert v.verdict == implied(lv, b.tolerance), (lv.name, lv.loss_text(), v.verdict, v.judged_on)
