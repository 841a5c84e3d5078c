"""The library page's code blocks (docs/library.md) run as they are written, in order, on the embedded student: the
documented API is the real one. Their printed lines are checked where the page says what they print."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "library.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.slow
def test_library_page_runs(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="fp8probe")
    code = blocks()
    assert len(code) == 3
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for src in code:
            exec(compile(src, str(PAGE), "exec"), ns)
    printed = out.getvalue().splitlines()
    # run_check's verdict line: the verdict, the measured value and the budget, as check.json holds them
    check = json.loads((tmp_path / "runs/lib/check/check.json").read_text())
    code_of = {"ADMIT": 0, "REJECT": 1, "UNCERTAIN": 3}  # the check's exit codes, as core/errors.py documents them
    assert printed[0] == f"{check['verdict']} {check['measured']} {check['budget']} {code_of[check['verdict']]}"
    assert check["verdict"] in ("ADMIT", "REJECT", "UNCERTAIN")
    assert printed[1] == "`num_prompts` 0 must be >= 1"  # what the page says the error prints
    # the sweep, the recipe and its read-back
    assert (tmp_path / "runs/lib/sweep/sensitivity.csv").exists()
    assert ns["recipe"].quantized and ns["report"].ratio_kv_tokens > 1
    assert ns["x_hat"].shape == (4, 256)
    assert set(ns["run"].table["unit"]) == set(ns["df"]["unit"])
    # the kept amax stand for the recipe's calibration pass: the same recipe and held-out figure as with the pass
    assert "from the sweep's per-sequence amax (no calibration pass)" in caplog.text
    fp8probe, rollouts = ns["fp8probe"], ns["rollouts"]
    settings, fp8 = fp8probe.RecipeSettings(effective_bits=14), ns["fp8"]
    calibrated = fp8probe.make_recipe(
        ns["swept"].table,
        fp8probe.Bench(ns["student"], rollouts),
        settings,
        context=fp8probe.RecipeContext(scheme="FP8"),
    )
    assert fp8.quantized and fp8.quantized == calibrated.quantized and fp8.measured == calibrated.measured


@pytest.mark.slow
def test_readme_python_example_runs(tmp_path, monkeypatch):
    """The README's Python block runs as written (the embedded student): a recipe chosen on half the prompts and
    reported on the other half, with its interval, as `fp8probe recipe` does by default."""
    readme = (PAGE.parents[1] / "README.md").read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert len(code) == 1 and len(code[0].splitlines()) <= 6
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code[0], "README.md", "exec"), ns)
    recipe = ns["recipe"]
    assert recipe.split["heldout_prompts"] == 4 and recipe.measured_search <= 0.01
    lo, hi = recipe.measured_interval
    assert lo <= recipe.measured <= hi
    assert out.getvalue().split()[0] == str(len(recipe.quantized)) and 0 < len(recipe.quantized) < 120
