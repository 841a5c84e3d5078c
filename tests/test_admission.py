"""Every rollout shortcut on one scale, prefix shift, the OPD signal, the budget from runs and the admission check."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from fp8probe import sources
from fp8probe.budget import fit_budget, read_budget
from fp8probe.errors import FP8ProbeError
from fp8probe.measure import Perturbation
from fp8probe.opd import OPDSignal
from fp8probe.prefix import PrefixShift, prompt_ids
from fp8probe.recipe import Recipe
from fp8probe.reference import Reference
from fp8probe.rollouts import make_rollouts

from conftest import tiny_model, tiny_student, tiny_tokenizer


@pytest.fixture(scope="module")
def setup():
    st = tiny_student("llama")
    r = make_rollouts(st, num_prompts=6, max_new_tokens=10, seed=2)
    return st, r, Reference(st, r)


def test_ladder_on_one_scale(setup):
    st, r, ref = setup
    rec = sources.recipe(st, Recipe.whole_model(st.units, "FP8_DYNAMIC"))
    kv = sources.kv_cache(st, "fp8")
    ladder = [sources.noise(st, s) for s in sources.DEFAULT_SIGMAS] + [rec, kv, sources.combine([rec, kv])]
    df = sources.ladder(st, r, ladder, reference=ref)
    noise = df[df.kind == "noise"]
    assert list(noise.sigma) == list(sources.DEFAULT_SIGMAS)
    assert (noise.kl_q_p.diff().dropna() > 0).all()  # the ruler: more noise, more mismatch
    by = df.set_index("source")
    combo = by.loc[f"{rec.name} + {kv.name}"]
    assert combo.sum_of_parts == pytest.approx(by.loc[rec.name].kl_q_p + by.loc[kv.name].kl_q_p, rel=1e-12)
    # measured together, not summed: the combination is its own measurement
    from fp8probe import measure

    together = measure(st, r, "FP8_DYNAMIC", kv="fp8", reference=ref)
    assert combo.kl_q_p == pytest.approx(together["kl_q_p"], rel=1e-9)


def test_prefix_shift_zero_when_identical_and_grows_with_sigma(setup):
    st, r, ref = setup
    shift = PrefixShift(st, ref, prompt_ids(st, r), max_new_tokens=10, seed=4)
    same = {n: p.detach().clone() for n, p in st.model.named_parameters()}
    for p in (Perturbation(), Perturbation(stale=same)):
        got = shift.measure(p)
        assert got["diverged"] == 0 and got["kl_q_p_own"] == 0 and got["k3_own"] == 0
    div = [shift.measure(sources.noise(st, s).perturbation)["diverged"] for s in (1e-4, 3e-2, 3e-1)]
    assert div == sorted(div) and div[-1] > 0


def test_stale_checkpoint(setup, tmp_path, tiny_dirs):
    st, r, ref = setup
    m = tiny_model("llama")
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.003)
    m.save_pretrained(tmp_path / "step")
    tiny_tokenizer().save_pretrained(tmp_path / "step")
    src = sources.stale(st, str(tmp_path / "step"))
    got = sources.ladder(st, r, [src], reference=ref).iloc[0]
    assert got.kl_q_p > 0 and got.kind == "stale"
    with pytest.raises(FP8ProbeError, match="is a qwen3 model, the student a llama"):
        sources.stale(st, str(tiny_dirs["qwen3"]))


def test_opd_signal(setup, tiny_dirs):
    from fp8probe.student import load_student

    st, r, ref = setup
    teacher = load_student(str(tiny_dirs["qwen3"]))  # another architecture, the same tokenizer
    opd = OPDSignal(st, teacher, ref)
    zero = opd.measure(Perturbation())
    assert zero["mean_abs_reward_delta"] == 0 and zero["seq_rkl_delta"] == 0
    assert zero["ratio_out_verl"] == 0 and zero["ratio_out_openrlhf"] == 0
    p = sources.noise(st, 0.05).perturbation
    got = opd.measure(p)
    from fp8probe.measure import measure_perturbation

    # the teacher term cancels token by token: |Δ reward| is the sampled-token |Δ log p| of the same source
    assert got["mean_abs_reward_delta"] == pytest.approx(measure_perturbation(ref, st, p)["abs_dlogp_mean"], rel=1e-5)
    assert 0 < got["reward_corr"] < 1
    other = tiny_student("llama")
    other.tokenizer = tiny_tokenizer()
    other.tokenizer.add_tokens(["zzz-extra"])
    with pytest.raises(FP8ProbeError, match="shared tokenizer"):
        OPDSignal(st, other, ref)


def _runs(threshold_index=3, levels=(0.0, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2), seeds=3):
    """Synthetic training runs: quality flat (within 0.2 %) up to levels[threshold_index], then falling."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, lv in enumerate(levels):
        drop = 0.0 if i <= threshold_index else 0.05 * (i - threshold_index)
        for s in range(seeds):
            noise = float(torch.rand(1, generator=g)) * 0.002 - 0.001
            rows.append({"mismatch": lv, "quality": 0.80 * (1 - drop) * (1 + noise), "seed": s, "metric": "k3"})
    return pd.DataFrame(rows)


def test_budget_recovers_a_known_threshold(tmp_path):
    runs = _runs()
    b = fit_budget(runs, tolerance=0.01, bootstrap=300)
    assert b.value == 1e-3 and b.metric == "k3" and b.calibrated
    assert b.interval[0] <= 1e-3 <= b.interval[1]
    assert fit_budget(_runs(threshold_index=1), bootstrap=50).value == 1e-4
    # lower is better: the same runs with quality turned into a loss
    inv = runs.assign(quality=1.0 - runs.quality, higher_is_better="false")
    assert fit_budget(inv, tolerance=0.05, bootstrap=0).value >= 1e-3


def test_budget_command_and_bad_tables(cli, tmp_path):
    _runs().to_csv(tmp_path / "runs.csv", index=False)
    r = cli("-q", "budget", tmp_path / "runs.csv", "--out", tmp_path / "b", "--bootstrap", 200)
    assert r.code == 0, r.err
    d = json.loads((tmp_path / "b" / "budget.json").read_text())
    assert d["value"] == 1e-3 and d["metric"] == "k3" and d["schema_version"] == 1
    assert (tmp_path / "b" / "budget.png").stat().st_size > 1000
    assert read_budget(str(tmp_path / "b" / "budget.json")).value == 1e-3
    pd.DataFrame({"mismatch": [1e-3], "quality": [0.5]}).to_csv(tmp_path / "noclean.csv", index=False)
    pd.DataFrame({"mismatch": [0, "x"], "quality": [0.5, 0.4]}).to_csv(tmp_path / "typed.csv", index=False)
    pd.DataFrame({"level": [0], "quality": [0.5]}).to_csv(tmp_path / "cols.csv", index=False)
    for name, match in [("noclean.csv", "no mismatch-free run"), ("typed.csv", "must hold finite numbers"),
                        ("cols.csv", "lacks the column(s) mismatch"), ("none.csv", "no such runs table")]:
        r = cli("budget", tmp_path / name, "--out", tmp_path / "x")
        assert r.code == 2 and len(r.lines) == 1 and match in r.lines[0], r.err
        assert not (tmp_path / "x").exists()


def test_check_admits_and_rejects(cli, tmp_path, tiny_dirs):
    model = tiny_dirs["llama"]
    r = cli("-q", "sweep", model, "--out", tmp_path / "s", "--num-prompts", 4, "--max-new-tokens", 8, "--no-kv")
    assert r.code == 0, r.err
    r = cli("-q", "recipe", tmp_path / "s", "--budget", 1e9, "--out", tmp_path / "r")
    assert r.code == 0, r.err
    recipe = tmp_path / "r" / "recipe.yaml"
    measured = json.loads((tmp_path / "r" / "recipe.json").read_text())["measured"]
    common = ["--rollouts", tmp_path / "s", "--recipe", recipe, "--max-new-tokens", 8]
    r = cli("-q", "check", model, "--budget", measured * 2, "--out", tmp_path / "c1", *common)
    assert r.code == 0 and r.out.startswith("ADMIT"), (r.code, r.out, r.err)
    rep = json.loads((tmp_path / "c1" / "check.json").read_text())
    assert rep["verdict"] == "ADMIT" and rep["measured"] == pytest.approx(measured, rel=1e-9)
    assert rep["margin"] == pytest.approx(measured, rel=1e-9) and not rep["budget_calibrated"]
    assert set(rep["prefix_shift"]) >= {"diverged", "first_div_mean", "kl_q_p_own"}
    r = cli("-q", "check", model, "--budget", measured / 2, "--out", tmp_path / "c2", *common)
    assert r.code == 1 and r.out.startswith("REJECT"), (r.code, r.out, r.err)
    for bad, match in [("-1", "finite, non-negative"), ("nan", "finite, non-negative"),
                       (tmp_path / "nope.json", "neither a number nor a budget.json")]:
        r = cli("check", model, "--budget", bad, "--out", tmp_path / "c3", *common)
        assert r.code == 2 and len(r.lines) == 1 and match in r.lines[0], r.err
        assert not (tmp_path / "c3").exists()
    r = cli("check", model, "--budget", 1, "--out", tmp_path / "c3")
    assert r.code == 2 and "nothing to check" in r.lines[0]
    assert math.isfinite(rep["measured"])


def test_ladder_command(cli, tmp_path, tiny_dirs):
    out = tmp_path / "l"
    r = cli("-q", "ladder", tiny_dirs["llama"], "--out", out, "--num-prompts", 3, "--max-new-tokens", 6,
            "--noise", 1e-3, 1e-2, "--kv-cache-dtype", "fp8", "--teacher", tiny_dirs["qwen3"])
    assert r.code == 0, r.err
    df = pd.read_csv(out / "ladder.csv")
    assert list(df.source) == ["noise 0.001", "noise 0.01", "kv fp8"]
    for col in ("kl_q_p", "diverged", "kl_q_p_own", "mean_abs_reward_delta", "ratio_out_openrlhf"):
        assert col in df.columns and df[col].notna().all(), col
    meta = json.loads((out / "ladder.json").read_text())
    assert [s["kind"] for s in meta["sources"]] == ["noise", "noise", "kv"] and meta["schema_version"] == 1
