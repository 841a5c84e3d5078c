"""The sweep-method registry: which rows each method measures exactly, and what run.json records of it."""

from __future__ import annotations

from collections import namedtuple

from fp8probe.measurement.fisher import DEFAULT_ESTIMATOR
from fp8probe.sweeps.methods import METHODS
from fp8probe.sweeps.settings import SweepSettings

R = namedtuple("R", "unit kind")


def test_each_method_measures_its_rows_exactly():
    rows = [R("model.fp8", "model")] + [R(f"u{i}", "q") for i in range(6)]
    est = {f"u{i}": v for i, v in enumerate([0.1, 0.6, 0.3, 0.5, 0.2, 0.4])}
    assert METHODS["exact"].exact(rows, {}, SweepSettings(method="exact"), 0) == {r.unit for r in rows}
    assert METHODS["fisher"].exact(rows, est, SweepSettings(method="fisher"), 0) == set()
    # auto: the top 2 estimates (u1 0.6, u3 0.5), the whole model, and 1 control drawn from the other four
    auto = SweepSettings(method="auto", top_k=2, controls=1)
    got = METHODS["auto"].exact(rows, est, auto, 3)
    assert (
        {"u1", "u3", "model.fp8"} <= got
        and len(got) == 4
        and (got - {"u1", "u3", "model.fp8"}) <= {"u0", "u2", "u4", "u5"}
    )
    assert got == METHODS["auto"].exact(rows, est, auto, 3)  # seeded


def test_run_json_records_each_methods_settings():
    # as tests/golden/tiny-llama/sweep/run.json (exact) and test_fisher's runs record them
    assert SweepSettings(method="exact").recorded(0) == {"method": "exact"}
    assert list(SweepSettings(method="fisher", fisher_samples=3).recorded(5).items()) == [
        ("method", "fisher"),
        ("samples", 3),
        ("estimator", DEFAULT_ESTIMATOR),
        ("seed", 5),
    ]
    assert list(SweepSettings(method="auto", top_k=4, controls=2).recorded(0)) == [
        "method",
        "samples",
        "estimator",
        "seed",
        "top_k",
        "controls",
    ]
    assert [m for m in METHODS if METHODS[m].reference] == ["exact", "auto"]
    assert [m for m in METHODS if METHODS[m].estimate] == ["fisher", "auto"]
