"""Every rollout shortcut on one scale, prefix shift, the OPD signal, the budget from runs and the admission check."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from conftest import tiny_model, tiny_student, tiny_tokenizer

from fp8probe.budget.fit import Budget
from fp8probe.core.errors import FP8ProbeError
from fp8probe.core.metrics import METRICS
from fp8probe.core.schemes import KVCacheScheme
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.measure import measure
from fp8probe.measurement.mismatch import mismatch, response_logits
from fp8probe.measurement.opd import OPDSignal
from fp8probe.measurement.perturbation import Perturbation
from fp8probe.measurement.perturbed import apply_perturbation
from fp8probe.measurement.prefix import PrefixShift, divergence, prompt_ids, sample_crn
from fp8probe.model.rollouts import Rollouts, make_rollouts
from fp8probe.recipe.recipe import Recipe
from fp8probe.sources import sources
from fp8probe.sources.ladder import ladder


@pytest.fixture(scope="module")
def setup():
    st = tiny_student("llama")
    r = make_rollouts(st, num_prompts=6, max_new_tokens=10, seed=2)
    return st, r, Bench(st, r)


def test_ladder_on_one_scale(setup):
    st, r, bench = setup
    rec = sources.recipe(st, Recipe.whole_model(st.units, "FP8_DYNAMIC"))
    kv = sources.kv_cache(st, "fp8")
    steps = [sources.noise(st, s) for s in sources.NOISE_RULER] + [rec, kv, sources.combine([rec, kv])]
    df = ladder(bench, steps)  # the library's default: no prefix shift
    noise = df[df.kind == "noise"]
    assert list(noise.sigma) == list(sources.NOISE_RULER)
    assert (noise.kl_q_p.diff().dropna() > 0).all()  # the ruler: more noise, more mismatch
    by = df.set_index("source")
    combo = by.loc[f"{rec.name} + {kv.name}"]
    assert combo.sum_of_parts == pytest.approx(by.loc[rec.name].kl_q_p + by.loc[kv.name].kl_q_p, rel=1e-12)
    # measured together, not summed: the combination is its own measurement
    from fp8probe import measure_scheme

    together = measure_scheme(bench, "FP8_DYNAMIC", kv=KVCacheScheme(scale="unit"))  # kv's scale 1.0
    assert combo.kl_q_p == pytest.approx(together["kl_q_p"], rel=1e-9)


def test_prefix_shift_zero_when_identical_and_grows_with_sigma(setup):
    st, r, bench = setup
    shift = PrefixShift(st, bench.reference(), prompt_ids(st, r), max_new_tokens=10, seed=4)
    same = {n: p.detach().clone() for n, p in st.model.named_parameters()}
    for p in (Perturbation(), Perturbation(stale=same)):
        got = shift.measure(p)
        assert got["diverged"] == 0 and got["kl_q_p_own"] == 0 and got["k3_own"] == 0
    div = [shift.measure(sources.noise(st, s).perturbation)["diverged"] for s in (1e-4, 3e-2, 3e-1)]
    assert div == sorted(div) and div[-1] > 0


def test_prefix_divergence_by_hand():
    """Four continuations of the same prompts: the third token differs; identical; one continues past the other's
    end (differs where the shorter stopped, 2); the first token differs. 3 of 4 diverge, first at 2, 2, 0."""
    ref = [[1, 2, 3, 4], [5, 6, 7], [8, 9], [1, 1, 1, 1]]
    cand = [[1, 2, 9, 4], [5, 6, 7], [8, 9, 10], [2, 1, 1, 1]]
    assert divergence(ref, cand) == {"diverged": 0.75, "first_div_mean": pytest.approx(4 / 3), "first_div_p50": 2}
    same = divergence(ref, ref)
    assert same["diverged"] == 0 and math.isnan(same["first_div_mean"]) and math.isnan(same["first_div_p50"])


def test_prefix_shift_measures_the_candidates_own_samples(setup):
    """With noise the candidate writes other text: what it reports equals a hand count over its continuations
    (sampled here with the same common random numbers), and kl_q_p_own equals a naive full forward of both
    policies over those continuations."""
    st, r, bench = setup
    prompts = prompt_ids(st, r)
    shift = PrefixShift(st, bench.reference(), prompts, max_new_tokens=10, seed=4)
    p = sources.noise(st, 3e-2).perturbation
    got = shift.measure(p)
    with apply_perturbation(st, p, many_forwards=True):
        cand = sample_crn(st, prompts, max_new_tokens=10, seed=4, batch_size=64)
    firsts = []
    for a, b in zip(shift.reference_samples, cand):
        same = 0
        while same < min(len(a), len(b)) and a[same] == b[same]:
            same += 1
        firsts.append(None if a == b else same)
    div = [f for f in firsts if f is not None]
    assert 0 < len(div) < len(firsts), "the noise should move some continuations, not all"
    assert got["diverged"] == len(div) / len(firsts) and got["first_div_mean"] == pytest.approx(sum(div) / len(div))
    own = Rollouts.from_sequences(prompts, cand, st.tokenizer.pad_token_id)
    ids, am, resp = own.input_ids, own.attention_mask, own.response_mask
    with torch.no_grad():
        ref_logits, tokens = response_logits(st.model(input_ids=ids, attention_mask=am).logits, ids, resp)
        with apply_perturbation(st, p):
            cand_logits, _ = response_logits(st.model(input_ids=ids, attention_mask=am).logits, ids, resp)
    naive = mismatch(ref_logits, cand_logits, tokens)
    assert got["kl_q_p_own"] > 0 and got["kl_q_p_own"] == pytest.approx(naive["kl_q_p"], rel=1e-4)
    assert got["k3_own"] == pytest.approx(naive["k3"], rel=1e-3)
    # verl's metrics of the candidate's samples, by hand from the naive forwards: q (the candidate, verl's
    # rollout_log_probs) against p (the trainer's old_log_probs), on the tokens q wrote
    lp = torch.log_softmax(ref_logits.double(), -1).gather(-1, tokens[:, None]).squeeze(-1)
    lq = torch.log_softmax(cand_logits.double(), -1).gather(-1, tokens[:, None]).squeeze(-1)
    r = lp - lq
    assert got["rollout_corr/kl"] == pytest.approx(float((lq - lp).mean()), rel=1e-3)
    assert got["rollout_corr/k3_kl"] == pytest.approx(float((r.exp() - r - 1).mean()), rel=1e-3)
    assert got["rollout_corr/chi2_token"] == pytest.approx(float((2 * r).exp().mean() - 1), rel=1e-3)
    assert got["training/rollout_probs_diff_max"] == pytest.approx(float((lp.exp() - lq.exp()).abs().max()), rel=1e-3)
    # (a token on the clip's edge may round to either side on another machine)
    assert got["ppo_clip_share"] == pytest.approx(float(((r.exp() - 1).abs() > 0.2).double().mean()), abs=1.5 / len(r))


def test_stale_in_one_tensor_is_noise_on_that_tensor(setup, tmp_path):
    """A checkpoint that differs from the student in exactly one weight, by the noise that add_noise draws for it,
    measures what that noise measures: the stale path (every weight swapped, the whole model from its embeddings)
    and the noise path (one unit noised, from its block on) agree on every metric."""
    from fp8probe.measurement.weights import add_noise

    st, r, bench = setup
    unit, sigma, seed = "model.layers.1.mlp.down_proj", 0.05, 7
    with add_noise(st.model, [unit], sigma, seed):
        noised = st.model.get_submodule(unit).weight.detach().clone()
    m = tiny_model("llama")  # the student's weights (same seed)
    with torch.no_grad():
        m.get_submodule(unit).weight.copy_(noised)
    m.save_pretrained(tmp_path / "step")
    tiny_tokenizer().save_pretrained(tmp_path / "step")
    src = sources.stale(st, str(tmp_path / "step"))
    differs = [n for n, w in st.model.named_parameters() if not torch.equal(w, src.perturbation.stale[n])]
    assert differs == [f"{unit}.weight"]
    stale = measure(bench, src.perturbation).metrics
    noise = measure(bench, Perturbation(noise=sigma, noise_units=(unit,), noise_seed=seed)).metrics
    assert stale["kl_q_p"] > 1e-5
    for k in METRICS:
        assert stale[k] == pytest.approx(noise[k], rel=1e-4, abs=1e-9), k


def test_stale_checkpoint(setup, tmp_path, tiny_dirs):
    st, r, bench = setup
    m = tiny_model("llama")
    g = torch.Generator().manual_seed(3)  # its own stream: the values do not depend on which tests ran before
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.003)
    m.save_pretrained(tmp_path / "step")
    tiny_tokenizer().save_pretrained(tmp_path / "step")
    src = sources.stale(st, str(tmp_path / "step"))
    got = ladder(bench, [src]).iloc[0]
    assert got.kl_q_p > 0 and got.kind == "stale"
    with pytest.raises(FP8ProbeError, match="is a qwen3 model, the student a llama"):
        sources.stale(st, str(tiny_dirs["qwen3"]))


def test_opd_signal(setup, tiny_dirs):
    from fp8probe.model.student import load_student

    st, r, bench = setup
    teacher = load_student(str(tiny_dirs["qwen3"]))  # another architecture, the same tokenizer
    opd = OPDSignal(st, teacher, bench.reference())
    zero = opd.measure(Perturbation())
    assert zero["mean_abs_reward_delta"] == 0 and zero["seq_rkl_delta"] == 0
    assert zero["ratio_out_verl"] == 0 and zero["ratio_out_openrlhf"] == 0
    p = sources.noise(st, 0.05).perturbation
    got = opd.measure(p)
    # the teacher term cancels token by token: |Δ reward| is the sampled-token |Δ log p| of the same source
    assert got["mean_abs_reward_delta"] == pytest.approx(measure(bench, p).metrics["abs_dlogp_mean"], rel=1e-5)
    assert 0 < got["reward_corr"] < 1
    other = tiny_student("llama")
    other.tokenizer = tiny_tokenizer()
    other.tokenizer.add_tokens(["zzz-extra"])
    with pytest.raises(FP8ProbeError, match="shared tokenizer"):
        OPDSignal(st, other, bench.reference())


def test_check_admits_and_rejects(cli, tmp_path, tiny_dirs):
    model = tiny_dirs["llama"]
    r = cli("-q", "sweep", model, "--out", tmp_path / "s", "--num-prompts", 4, "--max-new-tokens", 8, "--no-kv")
    assert r.code == 0, r.err
    r = cli("-q", "recipe", tmp_path / "s", "--budget", 1e9, "--out", tmp_path / "r", "--holdout", 0)  # all rollouts
    assert r.code == 0, r.err
    recipe = tmp_path / "r" / "recipe.yaml"
    measured = json.loads((tmp_path / "r" / "recipe.json").read_text())["measured"]
    common = ["--rollouts", tmp_path / "s", "--recipe", recipe, "--max-new-tokens", 8]
    r = cli("-q", "check", model, "--budget", measured * 10, "--out", tmp_path / "c1", *common)
    assert r.code == 0 and r.out.startswith("ADMIT"), (r.code, r.out, r.err)
    rep = json.loads((tmp_path / "c1" / "check.json").read_text())
    assert rep["verdict"] == "ADMIT" and rep["measured"] == pytest.approx(measured, rel=1e-9)
    # verl's screens the exports write, on the candidate's own samples: the K3 rejection preset and token TIS
    rs, tis = rep["verl_screens"]
    assert rs["screen"] == "rollout_rs seq_mean_k3 <= 0.01" and 0 <= rs["rollout_rs_seq_masked_fraction"] <= 1
    assert rs["rollout_rs_masked_fraction"] <= rs["rollout_rs_seq_masked_fraction"] + 1e-12  # tokens of masked seqs
    assert tis["rollout_is_mean"] > 0 and tis["screen"] == "rollout_is token at 2.0"
    # the margin is to the number the rule compares the interval's upper end with: the budget itself (a number)
    margin = 10 * measured - rep["measured_interval"][1]
    assert rep["margin"] == pytest.approx(margin, rel=1e-9) and not rep["budget_calibrated"]
    lo, hi = rep["measured_interval"]
    assert lo < measured < hi < measured * 10 and rep["interval_level"] == 0.9
    assert set(rep["prefix_shift"]) >= {"diverged", "first_div_mean", "kl_q_p_own"}
    r = cli("-q", "check", model, "--budget", measured / 10, "--out", tmp_path / "c2", *common)
    assert r.code == 1 and r.out.startswith("REJECT"), (r.code, r.out, r.err)
    for bad, match in [
        ("-1", "finite, non-negative"),
        ("nan", "finite, non-negative"),
        (tmp_path / "nope.json", "neither a number nor a budget.json"),
    ]:
        r = cli("check", model, "--budget", bad, "--out", tmp_path / "c3", *common)
        assert r.code == 2 and len(r.lines) == 1 and match in r.lines[0], r.err
        assert not (tmp_path / "c3").exists()
    r = cli("check", model, "--budget", 1, "--out", tmp_path / "c3")
    assert r.code == 2 and "nothing to check" in r.lines[0]
    assert math.isfinite(rep["measured"])


def test_ladder_command(cli, tmp_path, tiny_dirs):
    out = tmp_path / "l"
    r = cli(
        "-q",
        "ladder",
        tiny_dirs["llama"],
        "--out",
        out,
        "--num-prompts",
        3,
        "--max-new-tokens",
        6,
        "--noise",
        1e-3,
        1e-2,
        "--kv-cache-dtype",
        "fp8",
        "--teacher",
        tiny_dirs["qwen3"],
    )
    assert r.code == 0, r.err
    df = pd.read_csv(out / "ladder.csv")
    assert list(df.source) == ["noise 0.001", "noise 0.01", "kv fp8"]
    for col in ("kl_q_p", "diverged", "kl_q_p_own", "mean_abs_reward_delta", "ratio_out_openrlhf"):
        assert col in df.columns and df[col].notna().all(), col
    # each row is its source measured on the saved rollouts (re-measured here), the teacher cancels per token
    from fp8probe.model.rollouts import load_rollouts
    from fp8probe.model.student import load_student

    st = load_student(str(tiny_dirs["llama"]))
    r = load_rollouts(out)
    bench = Bench(st, r)
    again = [
        measure(bench, s.perturbation).metrics
        for s in (sources.noise(st, 1e-3), sources.noise(st, 1e-2), sources.kv_cache(st, "fp8"))
    ]
    assert list(df.kl_q_p) == pytest.approx([m["kl_q_p"] for m in again], rel=1e-6)
    assert list(df.k3) == pytest.approx([m["k3"] for m in again], rel=1e-5, abs=1e-12)
    assert df.kl_q_p.iloc[0] < df.kl_q_p.iloc[1]
    assert list(df.mean_abs_reward_delta) == pytest.approx(list(df.abs_dlogp_mean), rel=1e-4)
    meta = json.loads((out / "ladder.json").read_text())
    assert [s["kind"] for s in meta["sources"]] == ["noise", "noise", "kv"] and meta["schema_version"] == 1


def test_check_with_a_teacher_end_to_end(cli, tmp_path, tiny_dirs):
    """`fp8probe check --teacher`: the OPD signal lands in check.json and in the printed verdict; its reward change
    is the sampled-token |dlog p| of the same check (the teacher cancels token by token), its shares are shares."""
    model = tiny_dirs["llama"]
    out = tmp_path / "c"
    r = cli(
        "-q",
        "check",
        model,
        "--budget",
        1.0,
        "--kv-cache-dtype",
        "fp8",
        "--teacher",
        tiny_dirs["qwen3"],
        "--num-prompts",
        3,
        "--max-new-tokens",
        6,
        "--out",
        out,
    )
    assert r.code == 0 and r.out.startswith("ADMIT"), (r.code, r.out, r.err)
    rep = json.loads((out / "check.json").read_text())
    o = rep["opd_signal"]
    assert set(o) == {"mean_abs_reward_delta", "reward_corr", "seq_rkl_delta", "ratio_out_verl", "ratio_out_openrlhf"}
    assert o["mean_abs_reward_delta"] > 0
    assert o["mean_abs_reward_delta"] == pytest.approx(rep["metrics"]["abs_dlogp_mean"], rel=1e-4)
    assert 0 <= o["ratio_out_verl"] <= 1 and 0 <= o["ratio_out_openrlhf"] <= 1 and -1 <= o["reward_corr"] <= 1
    line = next(ln for ln in r.out.splitlines() if ln.startswith("OPD signal:"))
    assert f"{o['mean_abs_reward_delta']:.4g}" in line and f"{o['seq_rkl_delta']:+.4g}" in line


def test_verdict_by_hand():
    """ADMIT / REJECT only when the measured interval lies on one side of the budget's; UNCERTAIN otherwise, with
    the prompts that would decide it: n x (half-width / expansion(n) / distance to the budget)^2 x
    ((1.645 + 1.282) / 1.645)^2, or none when the measured value lies inside the budget's own interval."""
    from fp8probe.budget.admission import decide_factor, verdict

    assert decide_factor() == pytest.approx(((1.6448536 + 1.2815516) / 1.6448536) ** 2, rel=1e-6)  # 3.1655
    point = Budget("kl_q_p", 0.01, calibrated=False, source="hand")
    assert verdict(0.005, (0.004, 0.006), point, 16)["verdict"] == "ADMIT"
    assert verdict(0.005, (0.004, 0.01), point, 16)["verdict"] == "ADMIT"  # at the budget is within it
    assert verdict(0.02, (0.015, 0.025), point, 16)["verdict"] == "REJECT"
    v = verdict(0.008, (0.006, 0.012), point, 16)
    # expansion(16) = sqrt(16 / 15) x t(0.95, 15) / z(0.95) = 1.03280 x 1.75305 / 1.64485 = 1.10073
    # 16 x (0.004/1.10073/0.002)^2 x 3.1655 = 167.2
    assert v["verdict"] == "UNCERTAIN" and v["prompts_to_decide"] == 168
    v = verdict(0.012, (0.009, 0.015), point, 16)
    assert v["verdict"] == "UNCERTAIN" and v["prompts_to_decide"] == 95  # 16 x (0.003/1.10073/0.002)^2 x 3.1655 = 94.1
    fitted = Budget("kl_q_p", 0.01, calibrated=True, source="hand", interval=(0.008, 0.03))
    assert verdict(0.005, (0.004, 0.0079), fitted, 16)["verdict"] == "ADMIT"
    assert verdict(0.005, (0.004, 0.0081), fitted, 16)["verdict"] == "UNCERTAIN"
    assert verdict(0.04, (0.031, 0.05), fitted, 16)["verdict"] == "REJECT"
    assert verdict(0.04, (0.029, 0.05), fitted, 16)["verdict"] == "UNCERTAIN"
    inside = verdict(0.009, (0.0085, 0.0095), fitted, 16)
    assert inside["verdict"] == "UNCERTAIN" and inside["prompts_to_decide"] is None
    assert "calibration runs" in inside["undecided_because"]


def test_uncertain_check_is_decided_by_the_prompts_it_asks_for(cli, tmp_path, tiny_dirs):
    """A budget inside the measured interval: UNCERTAIN (exit 3) with a prompt count; run with that many prompts,
    the check decides (exit 0 or 1). The count is sized for 90 % power, so it is tried on five draws (sampling seeds)
    and must decide at least three (a 1 % chance to fail were the power exactly 90 %)."""
    from conftest import tiny_tokenizer

    model = tiny_dirs["llama"]
    words = sorted(w for w in tiny_tokenizer().get_vocab() if w.isalpha() and w not in ("user", "assistant"))[:12]
    prompts = tmp_path / "prompts.txt"  # 132 distinct prompts of words the tiny tokenizer knows
    prompts.write_text("\n".join(f"{a} {b}" for a in words for b in words if a != b) + "\n")
    decided = []
    for seed in range(5):
        common = ["--kv-cache-dtype", "fp8", "--max-new-tokens", 8, "--prompts", prompts, "--seed", seed]
        r = cli("-q", "check", model, "--budget", 1.0, "--out", tmp_path / f"p{seed}", "--num-prompts", 10, *common)
        assert r.code == 0, r.err
        probe = json.loads((tmp_path / f"p{seed}" / "check.json").read_text())
        lo, hi = probe["measured_interval"]
        budget = probe["measured"] + 0.6 * (hi - probe["measured"])  # above the value, inside its interval
        r = cli("-q", "check", model, "--budget", budget, "--out", tmp_path / f"u{seed}", "--num-prompts", 10, *common)
        assert r.code == 3 and r.out.startswith("UNCERTAIN"), (r.code, r.out, r.err)
        rep = json.loads((tmp_path / f"u{seed}" / "check.json").read_text())
        n = rep["prompts_to_decide"]
        assert rep["verdict"] == "UNCERTAIN" and 10 < n <= 132 and f"about {n} prompts" in r.out
        r = cli("-q", "check", model, "--budget", budget, "--out", tmp_path / f"d{seed}", "--num-prompts", n, *common)
        rep = json.loads((tmp_path / f"d{seed}" / "check.json").read_text())
        assert rep["num_prompts"] == n and r.code in (0, 1, 3)
        decided.append(rep["verdict"] in ("ADMIT", "REJECT"))
    assert sum(decided) >= 3, decided  # P(fewer) = 0.9 % at 90 % power


def test_check_gives_the_other_engines_figure(setup):
    """Beside the verdict, the same figure as the other engine computes it: the vllm-cuda profile beside the
    simulation (equal to fp8probe.measure with that engine) and the simulation beside the profile; an engine that
    does not cover the configuration says why."""
    from fp8probe import measure_scheme
    from fp8probe.budget.admission import check
    from fp8probe.budget.check_words import format_check

    st, r, bench = setup
    units = tuple(st.unit_names[:4])
    cfg = sources.Source("four units", "recipe", Perturbation(units=units))
    point = Budget("kl_q_p", 1.0, calibrated=False, source="hand")
    rep = check(bench, cfg, point)
    a = rep.also_measured
    want = measure_scheme(bench, "FP8_DYNAMIC", units=list(units), engine="vllm-cuda")["kl_q_p"]
    assert a["engine"] == "vllm-cuda" and a["measured"] == pytest.approx(want, rel=1e-6)
    assert a["interval"][0] < a["measured"] < a["interval"][1] and a["measured"] != pytest.approx(rep.measured)
    assert f"as vllm-cuda computes it: kl_q_p {a['measured']:.4g}" in format_check(rep)
    back = check(bench, cfg, point, engine="vllm-cuda")
    assert back.also_measured["engine"] == "sim"
    assert back.also_measured["measured"] == pytest.approx(rep.measured, rel=1e-9)
    kv = sources.Source(
        "kv e5m2", "kv", Perturbation(kv_layers=tuple(st.layers), kv=KVCacheScheme.from_name("fp8_e5m2"))
    )
    rep = check(bench, kv, point)
    assert rep.also_measured["measured"] is None and "FlashAttention 3" in rep.also_measured["not_covered"]
    assert "not measured as vllm-cuda computes it" in format_check(rep)
