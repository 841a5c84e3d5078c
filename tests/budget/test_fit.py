"""The mismatch budget from training runs (budget.fit_budget): a known threshold, both directions of quality."""

import dataclasses
import json

import pandas as pd
import pytest
import torch

from fp8probe.budget.fit import fit_budget as _fit_budget
from fp8probe.budget.fit import read_budget
from fp8probe.budget.settings import BudgetSettings
from fp8probe.core.errors import FP8ProbeError


def fit_budget(runs, settings: BudgetSettings = BudgetSettings(), paired=None):
    """These tables carry no quality before training: their losses are relative (budget.json 3's response)."""
    return _fit_budget(runs, dataclasses.replace(settings, response="relative"), paired=paired)


LEVELS = (0.0, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)


def _runs(threshold_index=3, levels=LEVELS, seeds=3):
    """Synthetic training runs: quality flat (within 0.2 %) up to levels[threshold_index], then falling 5 % per
    level."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, lv in enumerate(levels):
        drop = 0.0 if i <= threshold_index else 0.05 * (i - threshold_index)
        for s in range(seeds):
            noise = float(torch.rand(1, generator=g)) * 0.002 - 0.001
            rows.append({"mismatch": lv, "quality": 0.80 * (1 - drop) * (1 + noise), "seed": s, "metric": "k3"})
    return pd.DataFrame(rows)


def test_budget_recovers_a_known_threshold():
    runs = _runs()
    b = fit_budget(runs, BudgetSettings(tolerance=0.01, bootstrap=300, fit="isotonic"))
    assert b.value == 1e-3 and b.metric == "k3" and b.calibrated
    assert b.interval[0] <= 1e-3 <= b.interval[1]
    assert fit_budget(_runs(threshold_index=1), BudgetSettings(bootstrap=50, fit="isotonic")).value == 1e-4


def test_lower_is_better_and_the_direction_decides():
    """A loss-like quality (lower is better, as `calibrate` writes its held-out reverse KL): 1 - quality is 0.2
    up to 1e-3 (within +-0.4 %), then 0.24 (+20 %) and 0.28 (+40 %). At a 5 % tolerance the budget is exactly
    1e-3. Read the other way round the rises would be improvements and every level would pass: 1e-2."""
    inv = _runs().assign(quality=lambda d: 1.0 - d.quality)
    five = BudgetSettings(tolerance=0.05, bootstrap=0, fit="isotonic")
    lower = fit_budget(inv.assign(higher_is_better="false"), five)
    assert lower.value == 1e-3
    assert fit_budget(inv.assign(higher_is_better="true"), five).value == 1e-2
    bool_column = inv.assign(higher_is_better=False)
    assert fit_budget(bool_column, five).value == 1e-3
    assert fit_budget(inv, five).value == 1e-2  # the default: higher is better


def test_calibrate_runs_table_is_read_lower_is_better_and_paired():
    """calibration_runs.runs_table's rows (quality: held-out reverse KL, lower is better) fit to the level where the
    KL starts rising; each run's paired loss is against its own seed's mismatch-free run (0 for that run)."""
    from dataclasses import replace

    from fp8probe.core.records import TrainingRunRecord
    from fp8probe.training.runs import runs_table

    def result(level, value, seed, kl):
        return TrainingRunRecord(
            objective="opd",
            level=level,
            kind="noise" if value else "none",
            value=value,
            scheme=None,
            seed=seed,
            mismatch={"kl_q_p": value, "k3": value, "tokens": 100},
            steps=30,
            seconds=1.0,
            losses=[],
            quality_start={"reverse_kl": 6.0, "teacher_logp": -3.0},
            quality_end={"reverse_kl": kl, "teacher_logp": -2.0},
            quality={"plateau": kl + 0.5, "auc": kl + 1, "final": kl, "late_improvement": 0.0},
        )

    results = [result("0", 0.0, s, 1.40 + 0.2 * s) for s in range(2)]  # seeds 14 % apart
    results += [result("0.01", 0.01, s, (1.40 + 0.2 * s) * 1.004) for s in range(2)]  # +0.4 % on each seed
    results += [result("0.1", 0.1, s, (1.40 + 0.2 * s) * 1.14) for s in range(2)]  # +14 %: worse
    df = runs_table(results, quality="final")
    assert set(df["higher_is_better"]) == {False} and list(df["quality"]) == [
        r.quality_end["reverse_kl"] for r in results
    ]
    assert list(df["paired_loss"][:2]) == [0.0, 0.0]
    assert list(df["paired_loss"][2:4]) == pytest.approx([0.004, 0.004]) and list(
        df["paired_loss"][4:]
    ) == pytest.approx([0.14, 0.14])
    b = fit_budget(df, BudgetSettings(tolerance=0.02, bootstrap=200))
    assert b.paired and b.value == 0.01 and b.interval == (0.01, 0.01)
    assert list(runs_table(results)["quality"]) == [r.quality["auc"] for r in results]  # auc by default
    assert list(runs_table(results, "plateau")["quality"]) == [r.quality["plateau"] for r in results]
    old = [replace(r, quality={k: v for k, v in r.quality.items() if k != "plateau"}) for r in results]
    assert runs_table(old)["quality_plateau"].isna().all()
    with pytest.raises(FP8ProbeError, match="no plateau quality"):
        runs_table(old, "plateau")  # run.json of an older fp8probe: one line naming the qualities it has


def test_budget_command_and_bad_tables(cli, tmp_path):
    _runs().to_csv(tmp_path / "runs.csv", index=False)
    r = cli(
        "-q",
        "budget",
        tmp_path / "runs.csv",
        "--out",
        tmp_path / "b",
        "--bootstrap",
        200,
        "--fit",
        "isotonic",
        "--response",
        "relative",
    )
    assert r.code == 0, r.err
    d = json.loads((tmp_path / "b" / "budget.json").read_text())
    assert d["value"] == 1e-3 and d["metric"] == "k3" and d["schema_version"] == 4 and d["paired"]
    assert d["method"] == "isotonic" and d["dose_response"] is None
    assert (tmp_path / "b" / "budget.png").stat().st_size > 1000
    assert read_budget(str(tmp_path / "b" / "budget.json")).value == 1e-3
    pd.DataFrame({"mismatch": [1e-3], "quality": [0.5]}).to_csv(tmp_path / "noclean.csv", index=False)
    pd.DataFrame({"mismatch": [0, "x"], "quality": [0.5, 0.4]}).to_csv(tmp_path / "typed.csv", index=False)
    pd.DataFrame({"level": [0], "quality": [0.5]}).to_csv(tmp_path / "cols.csv", index=False)
    for name, match in [
        ("noclean.csv", "no mismatch-free run"),
        ("typed.csv", "must hold finite numbers"),
        ("cols.csv", "lacks the column(s) mismatch"),
        ("none.csv", "no such runs table"),
    ]:
        r = cli("budget", tmp_path / name, "--out", tmp_path / "x")
        assert r.code == 2 and len(r.lines) == 1 and match in r.lines[0], r.err
        assert not (tmp_path / "x").exists()


def _seeded_runs(edge_index=3, levels=LEVELS, seeds=4, seed_effect=0.10, noise=0.002):
    """Runs whose seeds differ a lot (each seed's quality scaled by up to +-10 %, the same at every level, as a
    seed's data order and sampling make it) while the mismatch adds a loss of 0 up to levels[edge_index] and
    3 % per level beyond; each run has its own small noise (0.2 %)."""
    g = torch.Generator().manual_seed(1)
    base = [1.0 + seed_effect * (2 * float(torch.rand(1, generator=g)) - 1) for _ in range(seeds)]
    rows = []
    for i, lv in enumerate(levels):
        loss = 0.0 if i <= edge_index else 0.03 * (i - edge_index)
        for s in range(seeds):
            eps = noise * (2 * float(torch.rand(1, generator=g)) - 1)
            rows.append(
                {
                    "mismatch": lv,
                    "seed": s,
                    "quality": 2.0 * base[s] * (1 + loss) * (1 + eps),
                    "higher_is_better": False,
                }
            )
    return pd.DataFrame(rows)


def test_paired_bootstrap_recovers_a_known_edge_that_seed_spread_hides():
    """With seeds 10 % apart and a 2 % tolerance, pairing each run with its own seed's mismatch-free twin finds
    the edge (1e-3) with an interval of one level; the unpaired fit, whose losses carry the seeds' spread, cannot
    place it as tightly. The mismatch-free twins' paired losses are exactly 0."""
    runs = _seeded_runs()
    paired = fit_budget(runs, BudgetSettings(tolerance=0.02, bootstrap=500, fit="isotonic"))
    assert paired.paired and paired.value == 1e-3 and paired.interval == (1e-3, 1e-3)
    assert paired.levels[0]["mismatch"] == 0 and paired.levels[0]["loss"] == 0.0
    assert paired.levels[0]["loss_interval"] == [0.0, 0.0] and paired.seed_spread > 0.05
    unpaired = fit_budget(runs, BudgetSettings(tolerance=0.02, bootstrap=500, fit="isotonic"), paired=False)
    assert not unpaired.paired
    lo, hi = unpaired.interval
    assert lo < 1e-3 or hi > 1e-3 or unpaired.value != 1e-3  # the seeds' spread blurs the edge


def test_pairing_needs_twins_and_one_objective():
    runs = _seeded_runs()
    no_twin = runs[~((runs["mismatch"] == 0) & (runs["seed"] == 3))]
    # seed 3 has no mismatch-free run: unpaired
    assert not fit_budget(no_twin, BudgetSettings(bootstrap=0, fit="isotonic")).paired
    with pytest.raises(FP8ProbeError, match="pairing needs"):
        fit_budget(no_twin, BudgetSettings(bootstrap=0, fit="isotonic"), paired=True)
    two = pd.concat([runs.assign(objective="opd"), _seeded_runs(edge_index=1).assign(objective="grpo")])
    with pytest.raises(FP8ProbeError, match="several objectives"):
        fit_budget(two, BudgetSettings(bootstrap=0, fit="isotonic"))
    assert fit_budget(two, BudgetSettings(bootstrap=0, objective="opd", fit="isotonic")).value == 1e-3
    assert fit_budget(two, BudgetSettings(bootstrap=0, objective="grpo", fit="isotonic")).value == 1e-4


def test_other_sources_are_shown_beside_the_ruler_not_fitted():
    """A stale:1 level that loses 8 % at a KL below the noise levels would drag the isotonic fit to 0; the budget is
    read off the noise ruler (hand values: 0.01 loses 1 %, 0.1 loses 5 %: budget 0.01) and the stale level is
    reported beside it with its own paired loss."""
    import pandas as pd

    rows = []
    for seed in range(3):
        for level, kind, mismatch, quality in (
            ("0", "none", 0.0, 10.0),
            ("0.01", "noise", 0.01, 10.1),
            ("0.1", "noise", 0.1, 10.5),
            ("stale:1", "stale", 0.005, 10.8),
        ):
            rows.append(
                {
                    "level": level,
                    "kind": kind,
                    "seed": seed,
                    "mismatch": mismatch,
                    "quality": quality,
                    "higher_is_better": False,
                }
            )
    df = pd.DataFrame(rows)
    b = fit_budget(df, BudgetSettings(tolerance=0.02, bootstrap=50, fit="isotonic"))
    assert b.value == 0.01 and [lv["mismatch"] for lv in b.levels] == [0.0, 0.01, 0.1]
    (other,) = b.other_levels
    assert other["level"] == "stale:1" and other["kind"] == "stale" and other["loss"] == pytest.approx(0.08)
    all_fitted = fit_budget(df.drop(columns="kind"), BudgetSettings(tolerance=0.02, bootstrap=50, fit="isotonic"))
    assert all_fitted.value == 0.0  # all fitted: dragged to 0


def test_an_unpaired_table_may_hold_more_runs_at_a_level_than_twins():
    """The gain response of an unpaired table whose level has runs beyond its twin count (a level repeated, as
    the coverage test's allocation did at a tested level): the twins are what gained, not the empty cells the
    design pads that level's row with. Seen failing when the padding was checked as a twin that did not improve."""
    runs = _seeded_runs().assign(quality_start=3.0)
    top = runs[runs["mismatch"] == max(LEVELS)].assign(seed=lambda d: d["seed"] + 10)
    b = _fit_budget(pd.concat([runs, top]), BudgetSettings(bootstrap=0, fit="isotonic", response="gain"))
    assert not b.paired and b.value == 1e-3


def test_a_budgets_kinds_come_in_the_tables_order_under_any_hash_seed():
    """budget.json's per-kind evidence (and the lines `budget`, `calibrate` and `check` print from it) in one order
    whatever Python's string hashing: the runs table's, as the committed budget-opd.json holds it (kv before fp8). It
    followed a set's order, and so PYTHONHASHSEED: seeds 0-2 printed fp8 first, seed 3 kv first."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    cal = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m" / "calibration"
    want = json.loads((cal / "budget-opd.json").read_text())
    code = (
        "import json; from fp8probe.budget.fit import fit_budget; from fp8probe.budget.settings import "
        f"BudgetSettings; b = fit_budget({str(cal / 'runs.csv')!r}, BudgetSettings(objective='opd', "
        "bootstrap=20)); print(json.dumps([list(b.dose_response['rulers']['noise']['predictions']), "
        "list(b.kinds)]))"
    )
    for seed in range(4):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
        assert json.loads(out) == [list(want["dose_response"]["rulers"]["noise"]["predictions"]), list(want["kinds"])]


def _kv_only(kv_loss: float):
    """A user's verl runs: BF16 twins and the FP8 KV cache at dose 0.24 (check's scale), three seeds, the KV runs
    losing `kv_loss` of what the twins gained (hand values: gain 0.2 from 0.3)."""
    rows = []
    for seed in range(3):
        for level, kind, dose, lost in (("0", "none", 0.0, 0.0), ("kv:fp8", "kv", 0.24, kv_loss)):
            gain = 0.2 * (1 - lost) + 0.001 * seed
            rows.append(
                {"level": level, "kind": kind, "seed": seed, "mismatch": dose, "quality": 0.3 + gain}
                | {"quality_start": 0.3, "higher_is_better": True, "objective": "opd-k3"}
            )
    return pd.DataFrame(rows)


def test_without_noise_levels_the_budget_is_read_off_the_calibrated_levels():
    """No noise levels, no ruler: the budget was 0 [0, 0] (the twin alone fitted), which rejected any configuration
    with a dose above 0 on no evidence. Now the threshold is read off the calibrated levels themselves: a KV level
    losing 1 % < 2 % leaves it censored above its dose (a configuration beyond it UNCERTAIN, the level itself ADMIT on
    its own loss); losing 5 % puts it below (0)."""
    from fp8probe.budget.admission import judge
    from fp8probe.budget.words import budget_text, fit_lines
    from fp8probe.sources.sources import parse_source

    s = BudgetSettings(tolerance=0.02, bootstrap=100)
    b = _fit_budget(_kv_only(0.01), s)
    assert b.value == 0.24 and b.censored and b.interval_censored
    assert budget_text(b).startswith("> 0.24") and "no noise levels (no ruler)" in fit_lines(b)[-1]
    assert [lv["mismatch"] for lv in b.levels] == [0.0]  # no KV row among the noise levels
    assert [lv["level"] for lv in b.other_levels] == ["kv:fp8"]
    kv, fp8 = parse_source("kv:fp8").config, parse_source("fp8:FP8_DYNAMIC").config
    assert judge(0.24, (0.19, 0.29), b, 16, kv).verdict == "ADMIT"
    assert judge(1.1, (0.97, 1.24), b, 16, fp8).verdict == "UNCERTAIN"
    worse = _fit_budget(_kv_only(0.05), s)
    assert worse.value == 0.0 and not worse.censored
    assert judge(0.24, (0.19, 0.29), worse, 16, kv).verdict == "REJECT"


def test_an_isotonic_budget_no_level_of_which_exceeds_the_tolerance_is_censored():
    """Every noise level within the tolerance: the threshold lies above the top dose ("> 0.01"), not at it."""
    b = fit_budget(_runs(threshold_index=5), BudgetSettings(tolerance=0.01, bootstrap=50, fit="isotonic"))
    assert b.value == 1e-2 and b.censored and b.interval_censored
    assert not fit_budget(_runs(), BudgetSettings(tolerance=0.01, bootstrap=50, fit="isotonic")).censored
