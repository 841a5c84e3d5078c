"""The calibration's own configurations, checked as a user checks them against the shipped pair-A OPD budget, get the
verdict their runs measured: whole-model FP8 (lost 60 % [37, 83] of the gain) and a one-step stale lag (lost 9.4 %
[4.4, 14.4]) are rejected (exit 1), end to end through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
CALIBRATION = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m" / "calibration"
BUDGET = CALIBRATION / "budget-opd.json"


def test_whole_model_fp8_and_a_one_step_lag_are_rejected_as_their_runs_say(cli, tmp_path):
    """Whole-model FP8 (`--fp8 FP8_DYNAMIC`: every unit of pruned:3) is the calibration level fp8:FP8_DYNAMIC,
    judged on its own loss: REJECT. A one-step lag: pruned:3 trained one OPD step exactly as the calibration's runs
    train (its seed 0), checked with pruned:3 as the stale checkpoint one step older (`--stale-steps 1`), the start
    named (`--descends-from`): the level stale:1, REJECT. Both exited 3 (UNCERTAIN) and 0 (ADMIT) before the verdicts
    read the calibration's own evidence."""
    from safetensors.torch import load_file

    from fp8probe.training.experiment import read_experiment
    from fp8probe.training.runs import load_pair, states_along

    teacher, student = load_pair(None, "pruned:3")
    r = cli("check", "pruned:3", "--budget", BUDGET, "--fp8", "FP8_DYNAMIC", "--out", tmp_path / "c1")
    assert r.code == 1 and r.out.startswith("REJECT"), (r.code, r.out, r.err)
    assert "its own calibration level fp8:FP8_DYNAMIC" in r.out
    cal = read_experiment(CALIBRATION, "gain")
    files = states_along(teacher, student, "opd", 0, cal, [1], tmp_path / "along")
    student.model.load_state_dict(load_file(str(files[1])), strict=False)
    student.model.save_pretrained(tmp_path / "step1")
    student.tokenizer.save_pretrained(tmp_path / "step1")
    r = cli(
        "check",
        tmp_path / "step1",
        "--budget",
        BUDGET,
        "--stale",
        "pruned:3",
        "--stale-steps",
        1,
        "--descends-from",
        "pruned:3",
        "--out",
        tmp_path / "c2",
    )
    assert r.code == 1 and r.out.startswith("REJECT"), (r.code, r.out, r.err)
    assert "its own calibration level stale:1" in r.out and "a descendant of the budget's student" in r.out
