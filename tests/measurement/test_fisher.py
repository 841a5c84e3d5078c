"""The fast estimate: its quadratic form against a brute-force one, its ranking against the exact sweep, --method
auto's exact rows against the exact sweep, agreement.json, resume."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ask, tiny_student

from fp8probe.core.errors import FP8ProbeError
from fp8probe.core.schemes import Scheme
from fp8probe.core.stats import spearman, top_overlap
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.fisher import Draws, fisher_rows
from fp8probe.measurement.mismatch import response_logits
from fp8probe.measurement.quantize import quantize_units
from fp8probe.model.rollouts import make_rollouts
from fp8probe.recipe.selection import make_recipe
from fp8probe.sweeps.files import PartialRows, read_sweep
from fp8probe.sweeps.settings import SweepSettings
from fp8probe.sweeps.sweep import plan_rows, sweep


@pytest.fixture(scope="module")
def tiny():
    s = tiny_student("llama", num_hidden_layers=4)
    r = make_rollouts(s, num_prompts=8, max_new_tokens=24, seed=0)
    return s, r, sweep(Bench(s, r)).table


def _units(rows):
    return [r.unit for r in rows if r.kind != "model"]


def test_quadratic_form_matches_brute_force(tiny):
    """With many label draws, the sequence estimator converges to ½ Σ_t Δz_tᵀ (diag p_t − p_t p_tᵀ) Δz_t, the
    Fisher quadratic form computed here from two whole forwards (BF16 and that unit in FP8, through
    quantize_units, not the estimate's own code) — the second-order term of the KL the exact sweep measures."""
    s, r, _ = tiny
    rows = [
        x
        for x in plan_rows(s, Scheme.from_name("FP8_DYNAMIC"))
        if x.unit in ("model.layers.1.mlp.down_proj", "model.layers.3.self_attn.v_proj")
    ]
    est = fisher_rows(s, r, rows, Draws(256, 1)).column("sequence")
    m = s.model
    ids, am, resp = r.input_ids, r.attention_mask, r.response_mask
    for row in rows:
        with torch.no_grad():
            z, _ = response_logits(m(input_ids=ids, attention_mask=am).logits, ids, resp)
            with quantize_units(m, row.perturbation.units, Scheme.from_name("FP8_DYNAMIC")):
                zq, _ = response_logits(m(input_ids=ids, attention_mask=am).logits, ids, resp)
        p = torch.softmax(z.double(), -1)
        dz = (zq - z).double()
        quad = 0.5 * ((p * dz * dz).sum(-1) - (p * dz).sum(-1) ** 2).mean()
        # 256 draws: the Monte-Carlo error of the mean of squares is ~sqrt(2/256) ~ 9%
        assert est[row.unit] == pytest.approx(float(quad), rel=0.25), row.unit


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_head_gradients_by_hand_equal_autograd(softcap):
    """The label draws' gradients at the final hidden states, formed by hand (one shared matmul per chunk), equal
    autograd's gradient of Σ log_softmax(head(h))[ŷ] (softcapped as Gemma's head is) for the same labels, drawn here
    from a copy of the generator in the documented order (a chunk's draws before the next chunk's); 300 rows make
    three chunks, the head has a bias."""
    from fp8probe.measurement.fisher import _head_grads, _sample
    from fp8probe.measurement.mismatch import CHUNK_ROWS, log_softmax32

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=True)
    h = torch.randn(300, 16)
    got = _head_grads(head, h, 2, softcap, torch.Generator().manual_seed(5))
    gen = torch.Generator().manual_seed(5)
    labels = [[], []]
    with torch.no_grad():
        for s in range(0, 300, CHUNK_ROWS):
            cdf = log_softmax32(head(h[s : s + CHUNK_ROWS]), softcap).exp().cumsum(-1)
            for d in range(2):
                labels[d].append(_sample(cdf, gen))
    for d in range(2):
        x = h.clone().requires_grad_(True)
        log_softmax32(head(x), softcap).gather(-1, torch.cat(labels[d])).sum().backward()
        assert torch.allclose(got[d], x.grad, atol=1e-5, rtol=1e-4), d
    assert not torch.allclose(got[0], got[1])  # two draws, two label sets


def test_estimate_ranks_like_the_exact_sweep(tiny):
    s, r, exact = tiny
    rows = plan_rows(s, Scheme.from_name("FP8_DYNAMIC"))
    fr = fisher_rows(s, r, rows)
    ex = dict(zip(exact.unit, exact.kl_q_p))
    est = fr.column()
    units = _units(rows)
    assert spearman([est[u] for u in units], [ex[u] for u in units]) >= 0.9
    assert top_overlap({u: est[u] for u in units}, {u: ex[u] for u in units}) >= 7
    # the same scale as kl_q_p, not just the same order
    ratio = np.median([est[u] / ex[u] for u in units])
    assert 0.6 < ratio < 1.4
    # the perturbed outputs' SQNR is the exact sweep's (which takes it with its own observer)
    sq = dict(zip(exact.unit, exact.sqnr_db))
    for u in units:
        assert fr.sqnr_db[u] == pytest.approx(sq[u], abs=1e-3)


@pytest.mark.parametrize("fused", [True, False])
def test_static_fp8_perturbs_as_the_exact_sweep(tiny, fused):
    """Under FP8 with static input scales (the peer table's sweep) the estimate's perturbed outputs are the exact
    sweep's, whose forward swaps FP8 weights into the model (quantize_units, not fp8_forwards): the same SQNR per
    fused group (its units with their shared weight and input scales) and per unit alone (each its own weight
    scale; q/k/v's input quantized once per scale, as both are equal)."""
    s, r, _ = tiny
    settings = SweepSettings(method="exact", scheme="FP8", granularity="group" if fused else "unit", include_kv=False)
    exact = sweep(Bench(s, r), settings).table
    rows = [x for x in plan_rows(s, Scheme.from_name("FP8"), settings.granularity, False) if x.kind != "model"]
    fr = fisher_rows(s, r, rows, fused=fused)
    sq = dict(zip(exact.unit, exact.sqnr_db))
    assert len(rows) == (16 if fused else 28)
    for x in rows:
        assert fr.sqnr_db[x.unit] == pytest.approx(sq[x.unit], abs=1e-3), x.unit


def test_estimate_is_seeded_and_draws_matter(tiny):
    s, r, _ = tiny
    rows = plan_rows(s, Scheme.from_name("FP8_DYNAMIC"))[:6]
    a = fisher_rows(s, r, rows, Draws(seed=3)).column()
    b = fisher_rows(s, r, rows, Draws(seed=3)).column()
    c = fisher_rows(s, r, rows, Draws(seed=4)).column()
    assert a == b
    assert a != c


@pytest.mark.parametrize("arch", ["qwen3_moe", "gemma2"])
def test_estimate_other_architectures(arch):
    """Experts (one unit holding every expert) and a logit softcap."""
    s = tiny_student(arch, num_hidden_layers=2)
    r = make_rollouts(s, num_prompts=6, max_new_tokens=16, seed=0)
    df = sweep(Bench(s, r), SweepSettings(method="fisher")).table
    assert (df["method"] == "fisher").all()
    units = df[df["kind"] != "model"]
    assert (units["kl_q_p"] > 0).all() and units["kl_q_p"].notna().all()
    exact = sweep(Bench(s, r)).table
    rho = spearman(units["kl_q_p"], exact[exact["kind"] != "model"]["kl_q_p"])
    assert rho >= 0.8, rho


def test_auto_measures_the_top_rows_exactly(tiny, tmp_path):
    s, r, exact = tiny
    df = sweep(Bench(s, r), SweepSettings(method="auto", top_k=6, controls=3), partial=PartialRows(tmp_path)).table
    units = df[df["kind"] != "model"]
    measured = units[units["method"] == "exact"]
    assert len(measured) == 9
    assert (df[df["kind"] == "model"]["method"] == "exact").all()
    # the six highest estimates are among the exact rows, with the exact sweep's numbers to the bit
    top = units.sort_values("kl_fisher", ascending=False).head(6)["unit"]
    assert set(top) <= set(measured["unit"])
    ex = exact.set_index("unit")
    for _, row in measured.iterrows():
        assert row["kl_q_p"] == ex.loc[row["unit"], "kl_q_p"]
        assert row["k3"] == ex.loc[row["unit"], "k3"]
    est = units[units["method"] == "fisher"]
    assert est["k3"].isna().all() and est["kl_q_p"].notna().all()
    assert (est["kl_q_p"] == est["kl_fisher"]).all()
    assert units["kl_fisher"].notna().all()
    # a recipe reads it; a metric the estimate does not give is refused
    recipe = make_recipe(df, Bench(s, r), ask(float(ex.loc["model.fp8_all", "kl_q_p"]) / 2, refine=0))
    assert recipe.quantized
    with pytest.raises(FP8ProbeError, match="only kl_q_p"):
        make_recipe(df, Bench(s, r), ask(1.0, metric="k3"))


def test_cli_fisher_writes_agreement(cli, deep_tiny_dir, tmp_path, caplog):
    exact = tmp_path / "exact"
    common = ["--num-prompts", "4", "--max-new-tokens", "10"]
    assert cli("sweep", deep_tiny_dir, "--out", exact, "--method", "exact", *common).code == 0
    fast = tmp_path / "fast"
    res = cli("sweep", deep_tiny_dir, "--out", fast, "--rollouts", exact, "--method", "fisher")
    assert res.code == 0, res.err
    assert "agreement with the exact sweep" in res.out
    a = json.loads((fast / "agreement.json").read_text())
    t_exact = read_sweep(exact).table
    t_fast = read_sweep(fast).table
    units = t_fast["kind"] != "model"
    assert a["spearman"] == pytest.approx(spearman(t_fast[units]["kl_q_p"], t_exact[units]["kl_q_p"]))
    assert a["rows"] == int(units.sum())
    for side in ("exact", "fast"):
        assert a["recipes"][side]["measured_kl_q_p"] <= a["budget"]["value"]
    assert a["recipes"]["same"] == (a["recipes"]["exact"]["quantized"] == a["recipes"]["fast"]["quantized"])
    run = json.loads((fast / "run.json").read_text())
    assert run["method"]["method"] == "fisher" and run["exact_rows"] == 0 and run["seconds"]["fisher"] > 0
    # the library's error names fields (`metric`, and the sweep's `method`); the CLI shows each as its flag, also
    # the flag of another command
    res = cli("recipe", fast, "--budget", "1", "--metric", "k3", "--out", tmp_path / "r")
    assert res.code == 2 and "use --metric kl_q_p, or a sweep run with --method exact" in res.err, res.err
    # ... and in its log lines: a fast sweep reusing a fast sweep's rollouts is not compared with it
    caplog.clear()
    assert cli("sweep", deep_tiny_dir, "--out", tmp_path / "f2", "--rollouts", fast, "--method", "fisher").code == 0
    assert "that sweep is not exact (run with --method exact)" in caplog.text, caplog.text
    # reusing an exact sweep's rollouts with other settings only reuses them; --compare refuses it
    grouped = tmp_path / "grouped"
    res = cli(
        "sweep", deep_tiny_dir, "--out", grouped, "--rollouts", exact, "--method", "fisher", "--granularity", "group"
    )
    assert res.code == 0, res.err
    assert not (grouped / "agreement.json").exists() and "agreement" not in res.out
    res = cli(
        "sweep",
        deep_tiny_dir,
        "--out",
        tmp_path / "g2",
        "--compare",
        exact,
        "--rollouts",
        exact,
        "--method",
        "fisher",
        "--granularity",
        "group",
    )
    assert res.code == 2 and "same settings" in res.err
    # other rollouts cannot be compared
    other = tmp_path / "other"
    res = cli("sweep", deep_tiny_dir, "--out", other, "--compare", exact, "--method", "fisher", "--seed", "7", *common)
    assert res.code == 2 and "rollouts differ" in res.err
    assert not other.exists() or not any(other.iterdir())


def test_auto_resumes_after_kill(deep_tiny_dir, tmp_path):
    """Killed while measuring its exact rows, --method auto resumes to the table of an uninterrupted run."""
    import os
    import signal
    import time

    from conftest import cli_process, same_arithmetic

    common = [
        "-q",
        "sweep",
        deep_tiny_dir,
        "--num-prompts",
        "6",
        "--max-new-tokens",
        "12",
        "--method",
        "auto",
        "--top-k",
        "30",
        "--controls",
        "4",
    ]
    full = tmp_path / "full"
    assert cli_process(*common, "--out", full).wait(timeout=600) == 0
    n_rows = len(pd.read_csv(full / "sensitivity.csv"))
    n_fisher = int((pd.read_csv(full / "sensitivity.csv")["method"] == "fisher").sum())
    killed = tmp_path / "killed"
    p = cli_process(*common, "--out", killed)
    partial = killed / "sensitivity.partial.csv"
    deadline = time.time() + 300
    while time.time() < deadline:
        if partial.exists() and partial.read_text().count("\n") >= n_fisher + 6:
            break
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait() == -signal.SIGKILL
    n_done = partial.read_text().count("\n") - 1
    assert n_fisher < n_done < n_rows, "the sweep finished before it could be killed"
    p = cli_process(*common, "--out", killed, "--resume")
    assert p.wait(timeout=600) == 0, p.stderr.read()
    assert same_arithmetic(killed, full)  # the condition of a byte-for-byte comparison (conftest.cli_process)
    assert (killed / "sensitivity.csv").read_bytes() == (full / "sensitivity.csv").read_bytes()


@pytest.mark.parametrize("scheme", ["FP8_DYNAMIC", "FP8"])
def test_big_model_paths_give_the_same_numbers(tiny, monkeypatch, scheme):
    """Above the memory thresholds (a big student on one GPU) weights are requantized per call instead of kept:
    the estimate and the whole-model rows must not change by a bit."""
    import fp8probe.measurement.quantize as hooks
    from fp8probe.measurement.measure import measure_scheme

    s, r, _ = tiny
    rows = plan_rows(s, Scheme.from_name(scheme))
    kept = fisher_rows(s, r, rows, fused=True)
    whole = measure_scheme(Bench(s, r), scheme)
    monkeypatch.setattr(hooks, "DEQUANTIZED_CACHE_BYTES", 0)
    monkeypatch.setattr(hooks, "LAZY_CODES_BYTES", 0)
    lazy = fisher_rows(s, r, rows, fused=True)
    assert lazy.estimates == kept.estimates
    assert str(lazy.sqnr_db) == str(kept.sqnr_db)  # NaN on the whole-model rows
    assert measure_scheme(Bench(s, r), scheme) == whole


def test_moe_big_model_path(monkeypatch):
    import fp8probe.measurement.quantize as hooks

    s = tiny_student("qwen3_moe", num_hidden_layers=2)
    r = make_rollouts(s, num_prompts=4, max_new_tokens=8, seed=0)
    rows = plan_rows(s, Scheme.from_name("FP8_DYNAMIC"))
    kept = fisher_rows(s, r, rows)
    monkeypatch.setattr(hooks, "DEQUANTIZED_CACHE_BYTES", 0)
    assert fisher_rows(s, r, rows).estimates == kept.estimates
