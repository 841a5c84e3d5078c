"""The verdict (budget/admission.py): a budget belongs to its student, and each kind of source is judged on its own
evidence where the calibration ran it as a level."""

import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import older_checkpoint

from fp8probe.budget.admission import judge, verdict
from fp8probe.budget.fit import Budget
from fp8probe.sources.config import RolloutConfig


def _budget(**kw) -> Budget:
    """A calibrated noise-ruler budget, BMD 0.5 [0.3, 0.9] on kl_q_p, 2 % of the gain."""
    return Budget("kl_q_p", 0.5, True, "test", (0.3, 0.9), 0.02, method="benchmark dose", response="gain", **kw)


FP8 = {
    "level": "fp8:FP8_DYNAMIC",
    "kind": "fp8",
    "mismatch": 1.10,
    "loss": 0.60,
    "loss_interval": [0.37, 0.83],
    "runs": 3,
}
KV = {"level": "kv:fp8", "kind": "kv", "mismatch": 0.062, "loss": 0.003, "loss_interval": [-0.01, 0.015], "runs": 3}
KV_WIDE = {**KV, "loss": 0.107, "loss_interval": [-0.093, 0.307]}
STALE = {
    "level": "stale:1",
    "kind": "stale",
    "mismatch": 0.05,
    "loss": 0.094,
    "loss_interval": [0.044, 0.144],
    "runs": 3,
}
NOISE = [  # the noise ruler's levels, named by the runs table (level, kind, dose)
    {"mismatch": 0.0, "loss": 0.0, "runs": 3, "loss_interval": [0.0, 0.0]},
    {"mismatch": 0.2, "loss": 0.004, "runs": 3, "loss_interval": [-0.01, 0.018]},
    {"mismatch": 4.9, "loss": 0.128, "runs": 3, "loss_interval": [0.062, 0.207]},
]
RUNS = [
    {"level": lv, "kind": kind, "mismatch": d, "seed": 0}
    for lv, kind, d in (("0", "none", 0.0), ("0.01", "noise", 0.2), ("0.1", "noise", 4.9))
]


def _levels(*others) -> Budget:
    return _budget(levels=NOISE, runs=RUNS, other_levels=list(others))


def _hand_seeds(loss, lo, hi, k, tol=0.02) -> int:
    """Seeds at a level for its 90 % interval to clear the tolerance 9 times in 10 (the square-root law), by hand:
    the half-width on the far side without its t/z widening, (z_0.95 + z_0.9)² / z_0.95² for the power."""
    from statistics import NormalDist

    from scipy import stats

    z = NormalDist().inv_cdf(0.95)
    widen = math.sqrt(k / (k - 1)) * stats.t.ppf(0.95, k - 1) / z
    half = (hi - loss if loss < tol else loss - lo) / widen
    return math.ceil(k * (half / abs(loss - tol)) ** 2 * ((z + NormalDist().inv_cdf(0.9)) / z) ** 2)


def test_a_calibration_level_is_judged_on_its_own_loss():
    """Rule 1: the configuration is a level (equal RolloutConfigs): its own loss decides, whatever the dose measured
    (its interval straddles the level's dose by construction). Whole-model FP8 lost 60 % [37, 83]: REJECT; the KV
    cache at scale 1.0 lost 0.3 % [-1.0, +1.5]: ADMIT even above the noise ruler's BMDU; the same with +10.7 %
    [-9.3, +30.7]: UNCERTAIN, and the seeds that would decide it by hand (11). A one-step lag that lost 9.4 % [4.4,
    14.4]: REJECT, at whatever dose the check measured it. The noise level 0.1 (12.8 % [6.2, 20.7]) REJECT, level 0
    ADMIT. Seen failing with the old rule (the level's dose compared with an interval that straddles it: UNCERTAIN)."""
    b = _levels(FP8, KV, STALE)
    v = judge(1.10, (0.97, 1.24), b, 16, RolloutConfig(fp8="FP8_DYNAMIC"))
    assert (v.verdict, v.rule) == ("REJECT", "level") and "fp8:FP8_DYNAMIC" in v.judged_on
    assert judge(1.5, (1.2, 1.9), b, 16, RolloutConfig(kv="fp8")).verdict == "ADMIT"
    assert judge(0.001, (0.0005, 0.002), b, 16, RolloutConfig(stale=1)).verdict == "REJECT"
    assert judge(4.9, (4.3, 5.6), b, 16, RolloutConfig(noise=0.1)).verdict == "REJECT"
    assert judge(0.0, (0.0, 0.0), b, 16, RolloutConfig()).verdict == "ADMIT"
    wide = _levels(FP8, KV_WIDE)
    v = judge(0.24, (0.2, 0.27), wide, 16, RolloutConfig(kv="fp8"))
    assert v.verdict == "UNCERTAIN" and v.seeds_to_decide == {"level": "kv:fp8", "seeds": 11, "now": 3}
    assert _hand_seeds(0.107, -0.093, 0.307, 3) == 11
    assert "about 11 seeds at that level (now 3)" in v.undecided_because


def test_a_kinds_levels_decide_at_known_doses():
    """Rule 2 by hand. fp8 (a recipe's subset, not the level): measured [1.2, 1.4] wholly at or above the level's dose
    1.10 that lost 60 %: REJECT, margin 1.10 - 1.2; [1.0, 1.4] only reaches it: UNCERTAIN with the prompts that
    would place it. kv with calibrated scales (another configuration) at [0.04, 0.06] <= the level's 0.062 that lost
    [-1.0, +1.5]: ADMIT, margin 0.002; the same level with [-1.0, +3.5] (point 0.3 % within the tolerance, upper end
    not): UNCERTAIN. A small FP8 recipe at [0.10, 0.12] that the noise ruler alone would admit (<= BMDL 0.3): no fp8
    level at or above it within the tolerance, so UNCERTAIN. Each planted mutation (REJECT when the interval only
    reaches the dose; ADMIT on the level's point loss; the noise ruler deciding fp8) fails one assertion."""
    subset = RolloutConfig(fp8="FP8_DYNAMIC", fp8_units="10 of 30 units abcd1234")
    b = _levels(FP8, KV)
    v = judge(1.3, (1.2, 1.4), b, 16, subset)
    assert (v.verdict, v.rule, v.threshold) == ("REJECT", "levels", 1.10) and v.margin == pytest.approx(-0.1)
    v = judge(1.2, (1.0, 1.4), b, 16, subset)
    assert v.verdict == "UNCERTAIN" and v.prompts_to_decide > 16
    calibrated = RolloutConfig(kv="fp8", kv_scale="calibrated")
    v = judge(0.05, (0.04, 0.06), b, 16, calibrated)
    assert (v.verdict, v.rule) == ("ADMIT", "levels") and v.margin == pytest.approx(0.002)
    loose = _levels(FP8, {**KV, "loss_interval": [-0.01, 0.035]})
    assert judge(0.05, (0.04, 0.06), loose, 16, calibrated).verdict == "UNCERTAIN"
    v = judge(0.11, (0.10, 0.12), b, 16, subset)
    assert v.verdict == "UNCERTAIN" and "no level of fp8 at or above this dose" in v.undecided_because
    assert judge(0.11, (0.10, 0.12), _budget(), 16, subset).verdict == "ADMIT"  # no fp8 level: the ruler


def test_a_combination_is_judged_on_the_ruler_which_cannot_admit_a_calibrated_kind():
    """Rule 3. FP8 weights + the KV cache at [0.04, 0.06]: the KV level alone would admit it, but a combination is not
    one kind; the noise ruler admits it (<= 0.3) yet FP8 has a level and none at or above 0.06 lost within the
    tolerance: UNCERTAIN. Stale weights in a combination go to the stale ruler (BMD 0.1 [0.05, 0.15]): [0.18, 0.22]
    is REJECT there (the noise ruler would not reject it). Seen failing with `len(kinds) >= 1` for one kind (ADMIT
    on the KV level) and with the stale ruler used only for stale weights alone (UNCERTAIN)."""
    b = _levels(FP8, KV)
    v = judge(0.05, (0.04, 0.06), b, 16, RolloutConfig(fp8="FP8_DYNAMIC", fp8_units="3 units x", kv="fp8"))
    assert (v.verdict, v.rule) == ("UNCERTAIN", "ruler") and "cannot admit fp8" in v.judged_on
    stale_ruler = {"bmd": 0.1, "interval": [0.05, 0.15], "fits": True, "above_range": False}
    s = replace(_budget(), dose_response={"rulers": {"stale": stale_ruler}})
    v = judge(0.2, (0.18, 0.22), s, 16, RolloutConfig(kv="fp8", kv_scale="calibrated", stale=0))
    assert (v.verdict, v.judged_on) == ("REJECT", "the stale ruler")
    assert judge(0.2, (0.18, 0.22), s, 16, RolloutConfig(kv="fp8")).verdict == "ADMIT"  # no stale: the noise ruler


def test_the_margin_is_to_the_number_the_rule_compares_with():
    """The ruler's ADMIT compares the interval's upper end with the BMDL: against 1.053 [0.3647, 6.603] a figure at
    0.2035 [0.1742, 0.2336] has margin 0.3647 - 0.2336 = 0.1311 to the BMDL (not +0.85 to the BMD); a REJECT's
    margin is to the BMDU, negative. Seen failing with the old margin (BMD - measured)."""
    b = replace(_budget(), value=1.053, interval=(0.3647, 6.603))
    v = judge(0.2035, (0.1742, 0.2336), b, 16, RolloutConfig(kv="fp8"))
    assert v.verdict == "ADMIT" and v.margin == pytest.approx(0.1311) and v.threshold == 0.3647
    assert "BMDL" in v.threshold_name
    v = judge(8.0, (7.0, 9.0), b, 16, RolloutConfig(kv="fp8"))
    assert v.verdict == "REJECT" and v.margin == pytest.approx(6.603 - 7.0) and "BMDU" in v.threshold_name


def test_a_censored_end_cannot_reject_and_says_what_censored_it():
    """Above an upper end censored at the highest tested dose the curve cannot reject: UNCERTAIN, with what censored
    it (the BMD itself beyond the levels, or only the bootstrap's end). Seen failing with `interval_censored`
    dropped from the test (REJECT)."""
    b = replace(_budget(), interval_censored=True)
    v = verdict(1.2, (1.0, 1.4), b, 16)
    assert v["verdict"] == "UNCERTAIN" and "bootstrap's redrawn tables" in v["undecided_because"]
    v = verdict(1.2, (1.0, 1.4), replace(_budget(), censored=True), 16)
    assert v["verdict"] == "UNCERTAIN" and "fitted curve stays within" in v["undecided_because"]
    assert verdict(1.2, (1.0, 1.4), _budget(), 16)["verdict"] == "REJECT"


def test_check_refuses_another_students_budget(cli, tiny_dirs, tmp_path):
    """A budget records its student's content hash: `check` of another student against it exits 2 in one line that
    names the override; with `--other-student` it judges and says so; the budget's own student passes without a
    note. Seen failing with the comparison skipped (exit 0, no note)."""
    from fp8probe.model.identity import identity
    from fp8probe.model.student import load_student

    own = identity(load_student(str(tiny_dirs["llama"])))
    path = tmp_path / "budget.json"
    path.write_text(json.dumps(_budget(student=own).to_json()))
    other = tiny_dirs["qwen3"]
    common = ["--budget", path, "--kv-cache-dtype", "fp8", "--num-prompts", 4, "--max-new-tokens", 6]
    r = cli("check", other, "--out", tmp_path / "refused", *common)
    assert r.code == 2 and len(r.lines) == 1, (r.code, r.err)
    assert "--other-student" in r.lines[0] and own["sha256"][:12] in r.lines[0], r.lines
    assert not (tmp_path / "refused").exists()
    r = cli("-q", "check", other, "--out", tmp_path / "anyway", "--other-student", *common)
    assert r.code in (0, 1, 3), r.err
    note = json.loads((tmp_path / "anyway" / "check.json").read_text())["budget_student_note"]
    assert note.startswith("judged against another student's budget")
    r = cli("-q", "check", tiny_dirs["llama"], "--out", tmp_path / "own", *common)
    assert r.code in (0, 1, 3), r.err
    assert json.loads((tmp_path / "own" / "check.json").read_text())["budget_student_note"] is None


@pytest.mark.parametrize("text, reason", [("0.001", None), ("v3", "does not record the student")])
def test_a_budget_without_a_student_is_labelled(cli, tiny_dirs, tmp_path, text, reason):
    """A number, or a budget.json older than 4: nothing to compare; a calibrated one says it may belong to another."""
    budget = text
    if text == "v3":
        d = _budget().to_json()
        d["schema_version"] = 3
        (tmp_path / "b3.json").write_text(json.dumps(d))
        budget = tmp_path / "b3.json"
    r = cli(
        "-q",
        "check",
        tiny_dirs["llama"],
        "--budget",
        budget,
        "--kv-cache-dtype",
        "fp8",
        "--num-prompts",
        4,
        "--max-new-tokens",
        6,
        "--out",
        tmp_path / "c",
    )
    assert r.code in (0, 1, 3), r.err
    note = json.loads((tmp_path / "c" / "check.json").read_text())["budget_student_note"]
    assert (note is None) if reason is None else (reason in note)


def test_check_says_when_the_budget_was_calibrated_under_another_objective(cli, tiny_dirs, tmp_path):
    """A budget of opd-k3 (verl's supervised k3) judged for a user who trains opd-pg: the verdict carries a note naming
    both losses and the calibration that would measure the user's; the budget's own objective, or none named, says
    nothing; an unknown objective is one line, exit 2, before any output. Seen failing with the comparison skipped
    (no note)."""
    from fp8probe.model.identity import identity
    from fp8probe.model.student import load_student

    own = identity(load_student(str(tiny_dirs["llama"])))
    path = tmp_path / "budget.json"
    path.write_text(json.dumps(_budget(student=own, objective="opd-k3").to_json()))
    common = [tiny_dirs["llama"], "--budget", path, "--kv-cache-dtype", "fp8", "--num-prompts", 4]
    r = cli("check", *common, "--max-new-tokens", 6, "--out", tmp_path / "pg", "--objective", "opd-pg")
    assert r.code in (0, 1, 3), r.err
    note = json.loads((tmp_path / "pg" / "check.json").read_text())["budget_objective_note"]
    assert note.startswith("the budget was calibrated under opd-k3 (verl's supervised OPD: the k3"), note
    assert "not opd-pg (verl's policy-gradient OPD" in note and "--objectives opd-pg" in note
    assert f"note: {note}" in r.out
    r = cli("-q", "check", *common, "--max-new-tokens", 6, "--out", tmp_path / "k3", "--objective", "opd-k3")
    assert "budget_objective_note" not in json.loads((tmp_path / "k3" / "check.json").read_text())
    r = cli("check", *common, "--out", tmp_path / "bad", "--objective", "opd-k9")
    assert r.code == 2 and len(r.lines) == 1 and "opd-k9" in r.err and not (tmp_path / "bad").exists()


def test_verl_async_judges_the_mixture_of_lags(cli, tiny_dirs, tmp_path):
    """trigger 2, staleness 0.5 with a checkpoint 2 steps old: trainer-bound lags 1 and 2 (half each), rollout-bound
    0 and 1. Lag 2 is the checkpoint itself, so its figure must be a plain `check --stale` of it; lag 0 is the trainer
    (0); the verdict's figure is half of lags 1 and 2, the rollout-bound one half of lag 1, by hand. Seen failing
    with the interpolation's sign flipped (lag 2 another figure than the checkpoint's)."""
    older_checkpoint(tiny_dirs["llama"], tmp_path / "old")
    common = [tiny_dirs["llama"], "--budget", "0.5", "--stale", tmp_path / "old", "--num-prompts", 6]
    common += ["--max-new-tokens", 6]
    r = cli("check", *common, "--out", tmp_path / "plain")
    assert r.code in (0, 1, 3), r.err
    plain = json.loads((tmp_path / "plain" / "check.json").read_text())["measured"]
    r = cli(
        "check", *common, "--out", tmp_path / "async", "--verl-async", "trigger=2,staleness=0.5", "--stale-steps", 2
    )
    assert r.code in (0, 1, 3), r.err
    rep = json.loads((tmp_path / "async" / "check.json").read_text())
    lag = {k: v["measured"] for k, v in rep["verl_async"]["lags"].items()}
    assert set(lag) == {"0", "1", "2"} and lag["0"] == 0
    assert lag["2"] == pytest.approx(plain, rel=1e-5) and 0 < lag["1"] < lag["2"]
    regimes = rep["verl_async"]["regimes"]
    assert regimes["trainer-bound"]["lags"] == {"1": 0.5, "2": 0.5} and regimes["rollout-bound"]["max"] == 1
    assert rep["measured"] == pytest.approx(0.5 * (lag["1"] + lag["2"]), rel=1e-9)
    assert regimes["rollout-bound"]["measured"] == pytest.approx(0.5 * lag["1"], rel=1e-9)
    lo, hi = rep["measured_interval"]
    assert lo <= rep["measured"] <= hi and "lags 1 modelled on the straight line" in r.out
    assert "at lag 2, as vllm-cuda computes it" in r.out and "at lag 2, prefix shift" in r.out  # the p90 lag's
    # partial rollouts: a straddling response at each trainer-bound lag (its prefix 2 steps older), mixed by hand
    r = cli("-q", "check", *common, "--out", tmp_path / "partial", "--verl-async", "trigger=2,staleness=0.5,partial")
    assert r.code == 2  # still needs --stale-steps
    args = ["--verl-async", "trigger=2,staleness=0.5,partial", "--stale-steps", 2]
    r = cli("check", *common, "--out", tmp_path / "partial", *args)
    straddle = json.loads((tmp_path / "partial" / "check.json").read_text())["verl_async"]["straddle"]
    assert set(straddle["lags"]) == {"1", "2"} and straddle["lags"]["1"] > lag["1"]  # its prefix lags 3
    assert straddle["measured"] == pytest.approx(0.5 * (straddle["lags"]["1"] + straddle["lags"]["2"]), rel=1e-9)
    assert "a response straddling a sync (resumed after it)" in r.out
    for extra, says in (
        (["--verl-async", "trigger=2,staleness=0.5"], "stale_steps"),
        (["--verl-async", "trigger=2,staleness=0.5", "--stale-steps", 2, "--metric", "kl_max"], "mean over tokens"),
    ):
        r = cli("check", *common, "--out", tmp_path / "bad", *extra)
        assert r.code == 2 and len(r.lines) == 1 and says.replace("_", "-") in r.err.replace("_", "-"), r.err
        assert not (tmp_path / "bad").exists()


def test_verl_v1_separate_async_judges_its_lags(cli, tiny_dirs, tmp_path):
    """verl's v1 separate_async, parameter_sync_step 2 and one warmup batch, with a checkpoint 2 updates old:
    trainer-bound lags 2 and 3 updates (half each), rollout-bound 0 and 1; lag 2 is the checkpoint itself (a plain
    `check --stale` of it), the verdict's figure half of lags 2 and 3; its syncs re-prefill a resumed response with
    the new weights, so a resumed response's earlier tokens carry a plain lag + 2 and its later ones the lag (at lag
    2: lag 4's per-token figure before the split, lag 2's after it), reported beside the verdict at both
    trainer-bound lags and mixed by their shares."""
    older_checkpoint(tiny_dirs["llama"], tmp_path / "old")
    common = [tiny_dirs["llama"], "--budget", "0.5", "--stale", tmp_path / "old", "--num-prompts", 6]
    common += ["--max-new-tokens", 6]
    r = cli("-q", "check", *common, "--out", tmp_path / "plain")
    plain = json.loads((tmp_path / "plain" / "check.json").read_text())["measured"]
    r = cli("check", *common, "--out", tmp_path / "v1", "--verl-async", "v1:sync=2,warmup=1", "--stale-steps", 2)
    assert r.code in (0, 1, 3), r.err
    rep = json.loads((tmp_path / "v1" / "check.json").read_text())["verl_async"]
    lag = {k: v["measured"] for k, v in rep["lags"].items()}
    assert set(lag) == {"0", "1", "2", "3"} and lag["2"] == pytest.approx(plain, rel=1e-5)
    assert rep["regimes"]["trainer-bound"]["lags"] == {"2": 0.5, "3": 0.5}
    assert rep["regimes"]["rollout-bound"]["lags"] == {"0": 0.5, "1": 0.5}
    assert rep["regimes"]["trainer-bound"]["measured"] == pytest.approx(0.5 * (lag["2"] + lag["3"]), rel=1e-9)
    assert "v1 separate_async" in rep["keys"] and set(rep["straddle"]["lags"]) == {"2", "3"}
    st = rep["straddle"]
    assert st["measured"] == pytest.approx(0.5 * (st["lags"]["2"] + st["lags"]["3"]), rel=1e-9)


def test_verl_v1_colocate_async_judges_the_lags_its_schedule_gives_the_rollouts(cli, tiny_dirs, tmp_path):
    """verl's v1 colocate_async (one warmup batch, two prompt groups a batch) with a checkpoint 1 step old: the lags
    are the schedule's on the check's own rollouts (their response lengths, VerlV1Colocate.on), one regime, no
    separate straddle figure (a resumed response's earlier tokens are at their own lags); lag 1 is the checkpoint (a
    plain `check --stale` of it) and the verdict's figure the lags' figures weighted by their token shares, by hand.
    Seen failing with the schedule made on responses alike (on() skipped)."""
    from fp8probe.core.verl_lags import VerlV1Colocate
    from fp8probe.model.rollouts import load_rollouts

    older_checkpoint(tiny_dirs["llama"], tmp_path / "old")
    common = [tiny_dirs["llama"], "--budget", "0.5", "--stale", tmp_path / "old", "--num-prompts", 6]
    common += ["--max-new-tokens", 24, "--samples-per-prompt", 2]
    r = cli("-q", "check", *common, "--out", tmp_path / "plain")
    plain = json.loads((tmp_path / "plain" / "check.json").read_text())["measured"]
    args = ["--verl-async", "v1-colocate:warmup=1,batch=2", "--stale-steps", 1]
    r = cli("check", *common, "--out", tmp_path / "colocate", *args)
    assert r.code in (0, 1, 3), r.err
    rep = json.loads((tmp_path / "colocate" / "check.json").read_text())
    a = rep["verl_async"]
    rollouts = load_rollouts(tmp_path / "colocate")
    want = VerlV1Colocate(1.0, 8, 2).on(rollouts)
    assert len(set(want.lengths)) > 1  # the responses differ, so the schedule is not the one of responses alike
    assert set(a["regimes"]) == {"scheduled"} and a["judged"] == "scheduled" and "straddle" not in a
    shares = {int(k): v for k, v in a["regimes"]["scheduled"]["lags"].items()}
    assert shares == pytest.approx(want.lags()) and shares != pytest.approx(VerlV1Colocate(1.0, 8, 2).lags())
    lag = {int(k): v["measured"] for k, v in a["lags"].items()}
    assert lag[0] == 0 and lag[1] == pytest.approx(plain, rel=1e-5)
    assert rep["measured"] == pytest.approx(sum(w * lag[k] for k, w in shares.items()), rel=1e-9)
    assert "v1 colocate_async" in a["keys"] and "6 prompt groups' response lengths" in a["keys"]
    assert a["dropped"] == want.dropped and "verl async (v1 colocate_async" in r.out


def test_identity_follows_what_the_model_computes():
    """The version-2 hash: a trainer's save with `use_cache: false`, another `_name_or_path` or `return_dict` is the
    same student; one changed weight, another rms_norm_eps or one more token in the vocabulary is not. Version 1 (what
    budget.json files before it recorded) still hashes the runtime flag, and a recorded version-1 hash is compared
    in version 1. Seen failing with the runtime keys hashed in version 2."""
    from conftest import tiny_student

    from fp8probe.model.identity import HASH, content_hash, identity, same_student

    st = tiny_student("llama")
    first = identity(st)
    assert first["hash"] == HASH == 2
    st.model.config.use_cache = False
    st.model.config._name_or_path = "/elsewhere/checkpoint-1000"
    st.model.config.return_dict = False
    assert same_student(first, st)
    v1 = {"name": "old", "sha256": content_hash(st.model, version=1)}  # a budget.json from before version 2
    assert same_student(v1, st)
    st.model.config.use_cache = True
    assert not same_student(v1, st) and same_student(first, st)  # version 1 saw the runtime flag
    eps = st.model.config.rms_norm_eps
    st.model.config.rms_norm_eps = eps * 2
    assert not same_student(first, st)
    st.model.config.rms_norm_eps = eps
    with torch.no_grad():
        next(st.model.parameters()).view(-1)[0] += 1e-3
    assert not same_student(first, st)
    with torch.no_grad():
        next(st.model.parameters()).view(-1)[0] -= 1e-3
    assert same_student(first, st)
    st.tokenizer.add_tokens(["<new-token>"])
    assert not same_student(first, st)


def test_a_checkpoint_descending_from_the_budgets_student_is_its_own(cli, tiny_dirs, tmp_path):
    """A later checkpoint of the budget's own student is refused as another student (exit 2, naming
    `--descends-from`), judged as its own with `--descends-from` the budget's student (a note in check.json saying
    so), refused when the named start is not the budget's student; a teacher other than the budget's is refused
    and judged with `--other-student`. Seen failing with the start's hash unchecked (the wrong start accepted)."""
    from fp8probe.model.identity import identity
    from fp8probe.model.student import load_student

    own = identity(load_student(str(tiny_dirs["llama"])))
    teacher = identity(load_student(str(tiny_dirs["llama"])))
    path = tmp_path / "budget.json"
    path.write_text(json.dumps(_budget(student=own, teacher=teacher).to_json()))
    later = older_checkpoint(tiny_dirs["llama"], tmp_path / "later", scale=0.01)
    common = ["--budget", path, "--kv-cache-dtype", "fp8", "--num-prompts", 4, "--max-new-tokens", 6]
    r = cli("check", later, "--out", tmp_path / "refused", *common)
    assert r.code == 2 and "--descends-from" in r.err and not (tmp_path / "refused").exists()
    r = cli("-q", "check", later, "--out", tmp_path / "own", "--descends-from", tiny_dirs["llama"], *common)
    assert r.code in (0, 1, 3), r.err
    note = json.loads((tmp_path / "own" / "check.json").read_text())["budget_student_note"]
    assert note.startswith("a descendant of the budget's student")
    r = cli("check", later, "--out", tmp_path / "wrong", "--descends-from", tmp_path / "later", *common)
    assert r.code == 2 and "is not the student" in r.err
    r = cli("check", tiny_dirs["llama"], "--out", tmp_path / "t", "--teacher", later, *common)
    assert r.code == 2 and "teacher" in r.err and "--other-student" in r.err
    r = cli("-q", "check", tiny_dirs["llama"], "--out", tmp_path / "t2", "--teacher", later, "--other-student", *common)
    assert r.code in (0, 1, 3), r.err
    note = json.loads((tmp_path / "t2" / "check.json").read_text())["budget_student_note"]
    assert "another teacher" in note


def test_a_combination_holding_a_rejected_level_is_rejected():
    """Whole-model FP8 lost 60 % on its own; FP8 + a one-step lag holds it: REJECT on that part's level, whatever the
    ruler reads at the combination's dose (1.15, inside the ruler's own interval). A combination whose parts were not
    rejected on their own (a subset recipe + the KV cache that lost 0.3 %) stays on the ruler. Seen failing without
    the part rule (UNCERTAIN)."""
    b = _levels(FP8, KV, STALE)
    v = judge(1.15, (1.0, 1.3), b, 16, RolloutConfig(fp8="FP8_DYNAMIC", stale=1))
    assert (v.verdict, v.rule) == ("REJECT", "level") and "fp8:FP8_DYNAMIC" in v.judged_on
    v = judge(0.4, (0.35, 0.45), b, 16, RolloutConfig(fp8="FP8_DYNAMIC", fp8_units="3 units x", kv="fp8"))
    assert v.rule == "ruler"


def test_a_verdict_is_written_and_printed_as_its_name():
    """check.json, plan.csv and the printed tables hold a verdict's bare name (Verdict is a str enum): json, an
    f-string with a width (plan's table) and pandas' CSV all give "ADMIT", never "Verdict.ADMIT"."""
    import json

    import pandas as pd

    from fp8probe.budget.evidence import Verdict

    v = Verdict.UNCERTAIN
    assert json.dumps({"verdict": v}) == '{"verdict": "UNCERTAIN"}'
    assert f"{v}|{v:>11}|{str(v)}" == "UNCERTAIN|  UNCERTAIN|UNCERTAIN"
    assert pd.DataFrame([{"verdict": v}]).to_csv(index=False) == "verdict\nUNCERTAIN\n"
    assert v == "UNCERTAIN" and {"UNCERTAIN": 3}[v] == 3  # compared and looked up as its name
