"""benchmarks/budget_coverage.py runs at HEAD: one simulated calibration end to end through the package's own Ladder
at a toy size (so a refactor of the records it builds cannot break it unseen again), and its report's rates by hand."""

import json
import math

import pytest
from conftest import benchmark


def test_one_simulated_calibration_runs_and_is_judged():
    """A whole calibration on synthetic runs (the demo's ladder, one adaptive level, one allocated run, 20 bootstrap
    draws): a budget with an interval, the true BMD of the linear truth (0.02·d: 1.0), which end missed it, and the
    verdicts at half and twice the truth. Seen failing at HEAD before the fix (`'dict' object has no attribute
    'quality'`: the synthetic run was a dict where the Ladder reads a TrainingRunRecord), and once in 24 hash seeds
    while a toy scenario's random streams were keyed by Python's salted hash() (PYTHONHASHSEED=16: a lower end of
    0.0 against `0 < lo`)."""
    cov = benchmark("budget_coverage")
    sc = cov.Scenario("toy", "linear", 0.05, 0.5, 0.45, max_runs=1, dose_error=0.1, tails=True)
    r = cov.one_draw((sc, 0, 20, "budget", 0.14))
    assert r["truth"] == 1.0 or abs(r["truth"] - 1.0) < 1e-9
    lo, hi = r["interval"]
    assert 0 <= lo <= r["bmd"] and (hi >= r["bmd"] or math.isnan(hi))  # a lower end of 0: no dose shown safe
    assert [_draw_in_a_process(h) for h in (1, 16)] == [r["interval"]] * 2  # the same draw whatever the hash salt
    assert r["covered"] == (not r["missed_low"] and not r["missed_high"])
    assert isinstance(r["admit_at_half"], bool) and isinstance(r["reject_at_twice"], bool)
    assert r["runs"] >= 3 * 4 + 1  # the ladder's 4 levels x 3 seeds, and the adaptive level or the allocated run


def _draw_in_a_process(hash_seed: int) -> list:
    """The toy scenario's draw 0 in a fresh Python process with PYTHONHASHSEED=`hash_seed`."""
    import os
    import subprocess
    import sys

    from conftest import BENCHMARKS

    code = (
        f"import json, sys; sys.path.append({str(BENCHMARKS)!r}); import budget_coverage as c; "
        "sc = c.Scenario('toy', 'linear', 0.05, 0.5, 0.45, max_runs=1, dose_error=0.1, tails=True); "
        "print(json.dumps(c.one_draw((sc, 0, 20, 'budget', 0.14))['interval']))"
    )
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_report_counts_each_end_and_the_power_by_hand(tmp_path):
    """Four draws of the first scenario written by hand: covered 2 of 4, the lower end above the truth once (a
    too-permissive BMDL: what ADMIT rests on), the upper end below it once, ADMIT at half the truth 3 of 4, REJECT at
    twice it 1 of 4; the Clopper-Pearson interval of 2/4 at 90 % is Beta(2, 3)'s 5 % and Beta(3, 2)'s 95 % quantile
    (0.098, 0.902)."""
    from scipy.stats import beta

    cov = benchmark("budget_coverage")
    name = cov.SCENARIOS[0].name
    rows = [
        dict(covered=True, missed_low=False, missed_high=False, admit_at_half=True, reject_at_twice=True),
        dict(covered=True, missed_low=False, missed_high=False, admit_at_half=True, reject_at_twice=False),
        dict(covered=False, missed_low=True, missed_high=False, admit_at_half=True, reject_at_twice=False),
        dict(covered=False, missed_low=False, missed_high=True, admit_at_half=False, reject_at_twice=False),
    ]
    base = dict(scenario=name, interval=[0.5, 2.0], open_high=False, bmd=1.0, truth=1.0, seconds=1.0)
    log = tmp_path / "draws.jsonl"
    log.write_text("".join(json.dumps({**base, **r, "draw": i}) + "\n" for i, r in enumerate(rows)))
    cov.report(log, tmp_path / "coverage.json", 20, "budget")
    (t,) = json.loads((tmp_path / "coverage.json").read_text())["scenarios"]
    assert (t["coverage"], t["missed_low_rate"], t["missed_high_rate"]) == (0.5, 0.25, 0.25)
    assert (t["admit_at_half_rate"], t["reject_at_twice_rate"]) == (0.75, 0.25)
    assert t["clopper_pearson_90"] == pytest.approx([beta.ppf(0.05, 2, 3), beta.ppf(0.95, 3, 2)], rel=1e-12)
    assert [round(x, 3) for x in t["clopper_pearson_90"]] == [0.098, 0.902]
