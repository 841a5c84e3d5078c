"""`fp8probe plan`: time to quality read off a calibration's learning curves (hand values), the step-time rules, and
the command end to end on a tiny model with a synthetic calibration whose curves are known."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from conftest import older_checkpoint

from fp8probe.budget.curves import read_curves, steps_to, steps_with_interval
from fp8probe.core.errors import FP8ProbeError

STEPS = [0, 5, 10, 15, 20]
# level -> (kind, value, per-seed mismatch, per-seed curves)
LEVELS = {
    "0": ("none", "", [0.0, 0.0, 0.0], [[10, 6, 4, 3.0, 3.0], [10, 6, 4, 3.0, 3.0], [10, 6, 4, 3.0, 3.0]]),
    "0.1": ("noise", 0.1, [1.0, 1.0, 1.0], [[10, 6, 4, 3.2, 3.1]] * 3),
    "0.3": ("noise", 0.3, [4.0, 4.0, 4.0], [[10, 9, 8, 7, 6]] * 3),
    "stale:1": ("stale", 1, [0.2, 0.3, 0.4], [[10, 5, 3.5, 3.0, 3.0]] * 3),
}


def write_calibration(d, levels=LEVELS, tolerance=0.02):
    """A calibration directory as `fp8probe calibrate` writes one (the files plan reads), with known curves."""
    from fp8probe.sources.sources import parse_source

    rows = []
    for level, (kind, value, mism, curves) in levels.items():
        for seed, (m, c) in enumerate(zip(mism, curves)):
            run = d / "runs" / "opd" / f"{parse_source(level).slug}-seed{seed}"
            run.mkdir(parents=True)
            pd.DataFrame({"step": STEPS, "reverse_kl": c}).to_csv(run / "eval.csv", index=False)
            rows.append(
                {
                    "objective": "opd",
                    "level": level,
                    "kind": kind,
                    "value": value,
                    "seed": seed,
                    "metric": "kl_q_p",
                    "mismatch": m,
                    "quality": float(np.mean(c)),
                }
            )
    pd.DataFrame(rows).to_csv(d / "runs.csv", index=False)
    (d / "calibrate.json").write_text(json.dumps({"schema_version": 2, "tolerance": tolerance}))
    return d


def test_steps_to_by_hand():
    assert steps_to([10, 6, 4, 3.0, 3.0], STEPS, 3.06) == pytest.approx(10 + 5 * (4 - 3.06) / (4 - 3.0))
    assert steps_to([10, 6, 4, 3.0, 3.0], STEPS, 11) == 0.0
    assert steps_to([10, 9, 8, 7, 6], STEPS, 3.06) is None


def test_curves_interpolate_and_refuse(tmp_path):
    c = read_curves(write_calibration(tmp_path))
    assert c.ruler == ["0", "0.1", "0.3"] and c.default_target() == pytest.approx(3.06)
    half = c.curve_at(0.5)  # halfway between level 0 (mismatch 0) and 0.1 (mismatch 1.0), seed by seed
    assert half[0].tolist() == pytest.approx([10, 6, 4, 3.1, 3.05])
    s, _, ratio, _ = steps_with_interval(c, half, c.curve_at(0.0), c.default_target())
    assert s == pytest.approx(15 + 5 * (3.1 - 3.06) / (3.1 - 3.05))  # 19.0
    assert ratio == pytest.approx(14.7 / 19.0)
    assert c.curve_at(0.0, "stale:1")[0].tolist() == [10, 5, 3.5, 3.0, 3.0]  # a calibrated level: its own curves
    assert c.stale_runs("stale:1").tolist() == [0.2, 0.3, 0.4]
    with pytest.raises(FP8ProbeError, match="beyond the calibration's last level"):
        c.curve_at(5.0)
    with pytest.raises(FP8ProbeError, match="no stale:2 level"):
        c.stale_runs("stale:2")


def test_seeds_added_at_a_few_levels_leave_the_ladders_curves(tmp_path):
    """`calibrate --max-runs` adds seeds 3 and 4 at level 0.1 (and their mismatch-free twins): the curves keep every
    level on the ladder's three seeds (calibrate.json's `seeds`) instead of dropping the levels that lack the new
    ones."""
    levels = dict(LEVELS)
    for level in ("0", "0.1"):
        kind, value, mism, curves = levels[level]
        levels[level] = (kind, value, list(mism) + [mism[0]] * 2, list(curves) + [curves[0]] * 2)
    d = write_calibration(tmp_path, levels)
    meta = json.loads((d / "calibrate.json").read_text())
    (d / "calibrate.json").write_text(json.dumps({**meta, "seeds": 3}))
    c = read_curves(d)
    assert c.seeds == (0, 1, 2) and c.ruler == ["0", "0.1", "0.3"] and "stale:1" in c.curves


def test_paired_interval_of_steps(tmp_path):
    """Seeds that disagree widen the interval; identical seeds give a zero-width one."""
    levels = dict(LEVELS)
    levels["0"] = ("none", "", [0.0] * 3, [[10, 6, 4, 3.0, 3.0], [10, 5, 3.5, 3.0, 3.0], [10, 7, 5, 3.0, 3.0]])
    c = read_curves(write_calibration(tmp_path, levels))
    s, (lo, hi), ratio, (rlo, rhi) = steps_with_interval(c, c.curve_at(0.0), c.curve_at(0.0), c.default_target())
    assert lo < s < hi and ratio == 1.0 and rlo == rhi == 1.0  # paired: BF16 against itself is exactly 1
    c2 = read_curves(write_calibration(tmp_path / "same"))
    s2, (lo2, hi2), *_ = steps_with_interval(c2, c2.curve_at(0.0), c2.curve_at(0.0), c2.default_target())
    assert lo2 == pytest.approx(s2) and hi2 == pytest.approx(s2)


def test_steps_never_reached_in_some_resamples_have_no_upper_end_and_no_nan(tmp_path):
    """One seed of three never reaches the target: resamples with two or three draws of it miss (7 in 27), so the
    95th percentile lies between two misses: no upper end, said without numpy's inf - inf warning; a low end past
    every reaching resample stays at the point, not 0 steps."""
    import warnings

    from fp8probe.budget.curves import _widen

    levels = dict(LEVELS)
    levels["0"] = ("none", "", [0.0] * 3, [[10, 6, 4, 3.0, 3.0], [10, 5, 3.5, 3.0, 3.0], [10, 9, 8, 7, 6.0]])
    c = read_curves(write_calibration(tmp_path, levels))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s, (lo, hi), *_ = steps_with_interval(c, c.curve_at(0.0), c.curve_at(0.0), 4.5)
    assert s is not None and lo <= s and hi is None
    # 96 of 100 resamples never reached it: the 5th percentile too is a miss, so the low end is the point itself
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _widen([12.0] * 4 + [math.inf] * 96, 10.0, 1.5) == (10.0, None)
        # 5 misses: the 95th percentile lies between the last reach and the first miss, inf itself: no upper end
        assert _widen([12.0] * 95 + [math.inf] * 5, 10.0, 1.5) == (10.0, None)
    assert _widen([8.0, 9.0, 10.0, 11.0, 12.0] * 20, 10.0, 1.0) == pytest.approx((8.0, 12.0))


def test_plan_end_to_end(cli, tiny_dirs, tmp_path):
    cal = write_calibration(tmp_path / "cal")
    out = tmp_path / "plan"
    r = cli(
        "plan",
        str(tiny_dirs["llama"]),
        "--num-prompts",
        "4",
        "--max-new-tokens",
        "8",
        "--fp8",
        "FP8_DYNAMIC",
        "--kv-cache-dtype",
        "fp8",
        "--async",
        "1",
        "--calibration",
        str(cal),
        "--budget",
        "2.0",
        "--train-step-s",
        "0.5",
        "--gpu",
        "H100",
        "--response-len",
        "256",
        "--rollout-batch",
        "64",
        "--out",
        str(out),
    )
    assert r.code == 0, r.err
    doc = json.loads((out / "plan.json").read_text())
    rows = {row["configuration"]: row for row in doc["rows"]}
    assert len(rows) == 8 and (out / "plan.png").stat().st_size > 0
    assert list(pd.read_csv(out / "plan.csv").columns)[:4] == ["configuration", "weights", "kv_cache_dtype", "async"]
    bf16 = rows["bf16"]
    assert bf16["mismatch"] == 0.0 and bf16["speedup"] == pytest.approx(1.0)
    assert bf16["steps_to_target"] == pytest.approx(14.7)  # the clean curve reaches 3.06 at step 14.7
    for name, row in rows.items():
        want = max(row["rollout_s"], 0.5) if row["async"] else row["rollout_s"] + 0.5
        assert row["step_s"] == pytest.approx(want), name
        if row["steps_to_target"] is not None:
            assert row["time_to_target_s"] == pytest.approx(row["steps_to_target"] * row["step_s"])
    # asynchronous BF16: the calibration's stale:1 level, its mismatch and its own curve ([10, 5, 3.5, 3, 3])
    a = rows["bf16 + async 1"]
    assert a["mismatch"] == pytest.approx(0.3) and (a["mismatch_lo"], a["mismatch_hi"]) == pytest.approx((0.2, 0.4))
    assert a["steps_to_target"] == pytest.approx(10 + 5 * (3.5 - 3.06) / 0.5)
    assert a["speedup"] == pytest.approx(14.7 / a["steps_to_target"] * bf16["step_s"] / a["step_s"])
    # FP8 weights: interpolated at the measured mismatch between level 0 and level 0.1 (mismatch 1.0)
    f = rows["fp8 FP8_DYNAMIC"]
    w = f["mismatch"] / 1.0
    assert 0 < w < 1
    curve = (1 - w) * np.array([10, 6, 4, 3.0, 3.0]) + w * np.array([10, 6, 4, 3.2, 3.1])
    assert f["steps_to_target"] == pytest.approx(steps_to(curve, STEPS, 3.06))
    # FP8 weights + async: the measured weights' mismatch plus stale:1's, labelled as a sum
    fa = rows["fp8 FP8_DYNAMIC + async 1"]
    assert fa["mismatch"] == pytest.approx(f["mismatch"] + 0.3) and fa["mismatch_source"].startswith("sum")
    # the KV cache in FP8 holds twice the tokens
    assert rows["bf16 + kv fp8"]["kv_tokens"] > 1.9 * bf16["kv_tokens"]
    assert "throughput MODELLED" in r.out and r.out.splitlines()[-1].startswith("plan: 8 configurations")
    p = cli("plot", str(out))
    assert p.code == 0 and (out / "plots" / "plan.png").exists()


def test_plan_refuses_what_the_check_rejects_and_what_lies_beyond_the_levels(cli, tiny_dirs, tmp_path):
    common = [
        "--num-prompts",
        "4",
        "--max-new-tokens",
        "8",
        "--train-step-s",
        "0.5",
        "--response-len",
        "64",
        "--rollout-batch",
        "16",
    ]
    cal = write_calibration(tmp_path / "cal")
    out = tmp_path / "plan"
    r = cli(
        "plan",
        str(tiny_dirs["llama"]),
        *common,
        "--async",
        "1",
        "--calibration",
        str(cal),
        "--budget",
        "0.1",
        "--out",
        str(out),
    )
    assert r.code == 0, r.err
    rows = {row["configuration"]: row for row in json.loads((out / "plan.json").read_text())["rows"]}
    a = rows["bf16 + async 1"]  # stale:1 measured 0.3 [0.2, 0.4], wholly above the budget 0.1
    assert a["verdict"] == "REJECT" and a["steps_to_target"] is None and a["steps_source"] == "refused: REJECT"
    # an UNCERTAIN verdict is computed (and says so): the same level against a budget inside its interval
    out2 = tmp_path / "plan2"
    assert (
        cli(
            "plan",
            str(tiny_dirs["llama"]),
            *common,
            "--async",
            "1",
            "--calibration",
            str(cal),
            "--budget",
            "0.25",
            "--out",
            str(out2),
        ).code
        == 0
    )
    rows = {row["configuration"]: row for row in json.loads((out2 / "plan.json").read_text())["rows"]}
    u = rows["bf16 + async 1"]
    assert u["verdict"] == "UNCERTAIN" and u["steps_to_target"] == pytest.approx(10 + 5 * (3.5 - 3.06) / 0.5)
    # a calibration whose ruler ends below the FP8 weights' measured mismatch: not extrapolated
    low = {k: v for k, v in LEVELS.items() if k in ("0", "0.1")}
    low["0.1"] = ("noise", 0.1, [1e-9] * 3, LEVELS["0.1"][3])
    out3 = tmp_path / "plan3"
    assert (
        cli(
            "plan",
            str(tiny_dirs["llama"]),
            *common,
            "--fp8",
            "FP8_DYNAMIC",
            "--calibration",
            str(write_calibration(tmp_path / "low", low)),
            "--budget",
            "100",
            "--out",
            str(out3),
        ).code
        == 0
    )
    rows = {row["configuration"]: row for row in json.loads((out3 / "plan.json").read_text())["rows"]}
    f = rows["fp8 FP8_DYNAMIC"]
    assert f["mismatch"] > 1e-9 and f["steps_to_target"] is None and "beyond the calibrated levels" in f["steps_source"]


def test_plan_shape_without_measurement(cli, tmp_path):
    out = tmp_path / "p"
    r = cli(
        "plan",
        "shape:qwen3-8b",
        "--no-measure",
        "--gpu",
        "H200",
        "--fp8",
        "FP8_DYNAMIC",
        "--response-len",
        "1024",
        "--rollout-batch",
        "64",
        "--out",
        str(out),
    )
    assert r.code == 0, r.err
    doc = json.loads((out / "plan.json").read_text())
    assert doc["assumed_steps"] == 100 and all(row["mismatch"] is None for row in doc["rows"])
    assert "ASSUMED to need BF16's 100 steps" in r.out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--async", "1"], "--async needs the mismatch of stale weights"),
        (["--gpu-memory", "80"], "plan models a GPU of the table"),
        (["--calibration", "nowhere"], "not a directory written by `fp8probe calibrate`"),
        (["--stale", "a", "b", "--async", "1"], "one --stale checkpoint per --async K"),
        (["--verl-async", "v1-colocate:warmup=1"], "they take turns on the same GPUs"),
    ],
)
def test_plan_bad_input(cli, tiny_dirs, tmp_path, args, message):
    out = tmp_path / "p"
    r = cli("plan", str(tiny_dirs["llama"]), "--response-len", "64", *args, "--out", str(out))
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1
    assert not out.exists()


# a config-only tiny Llama whose byte and FLOP counts the by-hand tests below derive (tests/deploy/test_throughput.py's)
HIDDEN, INTER, LAYERS, VOCAB = 64, 128, 2, 256


def _tiny_llama_config(d) -> None:
    from conftest import tiny_config

    cfg = tiny_config(
        "llama",
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        tie_word_embeddings=False,
    )
    d.mkdir()
    cfg.to_json_file(d / "config.json")


def test_each_configurations_rollout_by_hand(cli, tmp_path):
    """Every configuration's modelled rollout, from its own weights and KV dtype, against the roofline by hand: a
    config-only tiny Llama (tests/deploy/test_throughput.py's, byte counts derived there) on an H100 of the table
    with no overheads and efficiencies of 1, four requests of 16 + 32 tokens (all admitted at once: no preemption).
    A plan that modelled every configuration as BF16 (the recipe or KV dtype not passed on) fails here."""
    from fp8probe.deploy.gpus import gpu

    hidden, inter, layers, vocab = HIDDEN, INTER, LAYERS, VOCAB
    _tiny_llama_config(tmp_path / "m")
    out = tmp_path / "plan"
    r = cli(
        "plan",
        tmp_path / "m" / "config.json",
        "--gpu",
        "H100",
        "--fp8",
        "FP8_DYNAMIC",
        "--kv-cache-dtype",
        "fp8",
        "--prompt-len",
        "16",
        "--response-len",
        "32",
        "--rollout-batch",
        "4",
        "--train-step-s",
        "1",
        "--bandwidth-efficiency",
        "1",
        "--compute-efficiency",
        "1",
        "--step-overhead-s",
        "0",
        "--seq-overhead-s",
        "0",
        "--out",
        out,
    )
    assert r.code == 0, r.err
    rows = {row["configuration"]: row for row in json.loads((out / "plan.json").read_text())["rows"]}
    h100 = gpu("H100")
    bw, bf16, fp8 = h100.bandwidth_gbs * 1e9, h100.bf16_tflops * 1e12, h100.fp8_tflops * 1e12
    linear = layers * (hidden * hidden * 2 + hidden * 32 * 2 + 3 * hidden * inter)  # q, o; k, v (2 heads of 16)
    lm_head = vocab * hidden
    scales = layers * (64 + 32 + 32 + 64 + 128 + 128 + 64) * 4  # FP8_DYNAMIC: an fp32 scale per output channel
    B, P, R = 4, 16, 32

    def by_hand(fp8_weights: bool, kv_bytes: int) -> float:
        weights = linear + scales + 2 * lm_head if fp8_weights else 2 * (linear + lm_head)
        kv_token_layer = 2 * 2 * 16 * kv_bytes  # K and V, 2 heads of 16
        t = 0.0
        for j in range(R):  # decode step j: B sequences of P + j tokens each
            ctx = B * (P + j)
            mem = (weights + kv_token_layer * layers * ctx) / bw
            mm = 2 * B * linear / fp8 + 2 * B * lm_head / bf16 if fp8_weights else 2 * B * (linear + lm_head) / bf16
            attn = 4 * ctx * 4 * 16 * layers / bf16
            t += max(mem, mm + attn)
        prefill = 2 * B * P * (linear / fp8 + lm_head / bf16 if fp8_weights else (linear + lm_head) / bf16)
        return t + prefill

    want = {
        "bf16": by_hand(False, 2),
        "bf16 + kv fp8": by_hand(False, 1),
        "fp8 FP8_DYNAMIC": by_hand(True, 2),
        "fp8 FP8_DYNAMIC + kv fp8": by_hand(True, 1),
    }
    assert set(rows) == set(want)
    for name, seconds in want.items():
        assert rows[name]["rollout_s"] == pytest.approx(seconds, rel=1e-9), name
        assert rows[name]["rollout_tokens_per_s"] == pytest.approx(B * R / seconds, rel=1e-9), name
        assert rows[name]["step_s"] == pytest.approx(seconds + 1.0, rel=1e-9), name
    assert len({round(s, 15) for s in want.values()}) == 4  # four different answers: each configuration matters


def test_a_calibrated_kind_takes_its_own_curves_and_a_combination_of_a_costlier_kind_is_refused(tmp_path):
    """Each kind on its evidence, in time to quality: whole-model FP8 and a BF16 model with an FP8 KV cache are
    calibration levels of their own here, so their steps come from those levels' curves (FP8's never reach the
    target: 19.0 vs None, by hand), not from the noise ruler's at their mismatch; FP8 with the KV cache is no level,
    and FP8 cost more than the noise ruler predicts (the budget's evidence), so its time to quality is refused
    rather than read off the noise curves. Seen failing with only stale levels mapped to their own curves."""
    from fp8probe.budget.fit import Budget
    from fp8probe.planning.plan import Configuration, PlanSettings, quality_steps

    levels = {
        **LEVELS,
        "fp8:FP8_DYNAMIC": ("fp8", "", [1.0, 1.0, 1.0], [[10, 9, 8.5, 8.0, 7.5]] * 3),
        "kv:fp8": ("kv", "", [0.5, 0.5, 0.5], [[10, 6, 4, 3.1, 3.05]] * 3),
    }
    c = read_curves(write_calibration(tmp_path, levels))
    fp8 = {
        "level": "fp8:FP8_DYNAMIC",
        "mismatch": 1.0,
        "loss": 0.6,
        "loss_interval": [0.4, 0.8],
        "seeds": 3,
        "predicted": 0.02,
        "reading": "costs more than the ruler predicts",
    }
    budget = Budget("kl_q_p", 2.0, True, "test", (1.5, 3.0), 0.02, method="benchmark dose", kinds={"fp8": [fp8]})
    settings = PlanSettings()
    cost = {"mismatch": 1.0, "verdict": "UNCERTAIN"}
    whole = Configuration("fp8 FP8_DYNAMIC", "fp8 FP8_DYNAMIC", None, "FP8_DYNAMIC", None, 0)
    s, _, _, _, how, _ = quality_steps(whole, cost, c, budget, c.default_target(), settings)
    assert s is None and how.startswith("not reached")  # its own curves stay above the target (the ruler's reach it)
    kv = Configuration("bf16 + kv fp8", "bf16", None, None, "fp8", 0)
    s, _, _, _, how, _ = quality_steps(
        kv, {"mismatch": 0.5, "verdict": "ADMIT"}, c, budget, c.default_target(), settings
    )
    assert s == pytest.approx(15 + 5 * (3.1 - 3.06) / (3.1 - 3.05)) and how == "the calibration's kv:fp8 curves"
    both = Configuration("fp8 FP8_DYNAMIC + kv fp8", "fp8 FP8_DYNAMIC", None, "FP8_DYNAMIC", "fp8", 0)
    s, _, _, _, how, _ = quality_steps(
        both, {"mismatch": 1.2, "verdict": "UNCERTAIN"}, c, budget, c.default_target(), settings
    )
    assert s is None and how.startswith("refused: fp8 ran as calibration levels of their own")


def test_the_teachers_scoring_pass_is_a_stage_of_each_step(cli, tmp_path):
    """On-policy distillation: the teacher prefills every prompt + response of the batch, by hand 2 x tokens x its
    matmul weights / the peak (efficiency 1), the batch split over its replicas, FP8 weights at the FP8 peak. A
    synchronous step is rollout + teacher + train, an asynchronous one their maximum; a plan that left the teacher
    out (or added it to one row only) fails here."""
    from fp8probe.deploy.gpus import gpu

    hidden, inter, layers, vocab = HIDDEN, INTER, LAYERS, VOCAB
    _tiny_llama_config(tmp_path / "m")
    model = str(tmp_path / "m" / "config.json")
    common = ["--gpu", "H100", "--prompt-len", "16", "--response-len", "32", "--rollout-batch", "4"]
    common += ["--train-step-s", "1", "--compute-efficiency", "1", "--bandwidth-efficiency", "1"]
    h100 = gpu("H100")
    bf16, fp8 = h100.bf16_tflops * 1e12, h100.fp8_tflops * 1e12
    linear = layers * (hidden * hidden * 2 + hidden * 32 * 2 + 3 * hidden * inter)
    lm_head = vocab * hidden
    tokens = 4 * (16 + 32)

    def plan(name, *args):
        r = cli("plan", model, *common, *args, "--out", tmp_path / name)
        assert r.code == 0, r.err
        return json.loads((tmp_path / name / "plan.json").read_text())

    alone = plan("alone", "--async", "1")
    taught = plan("taught", "--async", "1", "--teacher", model, "--teacher-replicas", "2")
    fp8_teacher = plan("fp8", "--teacher", model, "--teacher-fp8", "FP8_DYNAMIC")
    teacher_bf16 = 2 * (tokens / 2) * (linear + lm_head) / bf16
    assert taught["teacher"]["scoring_s"] == pytest.approx(teacher_bf16, rel=1e-9)
    assert fp8_teacher["teacher"]["scoring_s"] == pytest.approx(2 * tokens * (linear / fp8 + lm_head / bf16), rel=1e-9)
    assert "teacher" not in alone
    for a, t in zip(alone["rows"], taught["rows"]):
        assert t["teacher_s"] == pytest.approx(teacher_bf16, rel=1e-9)
        if t["async"]:
            assert t["step_s"] == pytest.approx(max(t["rollout_s"], teacher_bf16, 1.0), rel=1e-12)
        else:
            assert t["step_s"] == pytest.approx(t["rollout_s"] + teacher_bf16 + 1.0, rel=1e-12)
            assert t["step_s"] > a["step_s"]


def test_a_teacher_slower_than_rollout_and_training_sets_the_asynchronous_step(cli, tmp_path):
    """A teacher 64 times the student's width scoring a batch at a compute efficiency of 0.001 while the trainer takes
    1e-9 s: the teacher is the slowest stage (checked first), so an asynchronous step is the teacher's scoring pass
    alone and the synchronous one the three stages' sum. Seen failing with the teacher left out of the asynchronous
    maximum (a step of the rollout's length: the modelled speed-up too large)."""
    from conftest import tiny_config

    _tiny_llama_config(tmp_path / "m")
    big = tiny_config(
        "llama",
        hidden_size=HIDDEN * 64,
        intermediate_size=INTER * 64,
        num_hidden_layers=LAYERS * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
    )
    (tmp_path / "t").mkdir()
    big.to_json_file(tmp_path / "t" / "config.json")
    common = ["--gpu", "H100", "--prompt-len", "16", "--response-len", "32", "--rollout-batch", "4"]
    common += ["--train-step-s", "1e-9", "--async", "1", "--teacher", str(tmp_path / "t" / "config.json")]
    common += ["--compute-efficiency", "0.001"]  # a compute-bound prefill (the teacher) far slower than decoding
    r = cli("plan", str(tmp_path / "m" / "config.json"), *common, "--out", tmp_path / "p")
    assert r.code == 0, r.err
    rows = json.loads((tmp_path / "p" / "plan.json").read_text())["rows"]
    for row in rows:
        assert row["teacher_s"] > max(row["rollout_s"], row["train_s"])  # the teacher is the slowest stage
        stages = row["rollout_s"] + row["teacher_s"] + row["train_s"]
        assert row["step_s"] == pytest.approx(row["teacher_s"] if row["async"] else stages, rel=1e-12)
    assert any(row["async"] for row in rows) and not all(row["async"] for row in rows)


def test_verl_async_rows_mix_the_lags(cli, tiny_dirs, tmp_path):
    """trigger 2, staleness 0: half the samples at lag 0, half at lag 1. From the calibration: BF16's row is half of
    stale:1 (0.3 [0.2, 0.4] over its seeds) = 0.15 [0.10, 0.20], FP8's its measured weights plus that, labelled as a
    sum, and every verl row steps as asynchronous rows do (the stages' maximum). With one checkpoint 2 steps old and
    staleness 0.5 (lags 1 and 2, half each) the row is half the sum of those lags' figures as `check --verl-async`
    measures them on the same rollouts. A lag the calibration lacks is refused in one line. Seen failing with the
    shares ignored (the whole stale:1 dose added)."""
    cal = write_calibration(tmp_path / "cal")
    common = [str(tiny_dirs["llama"]), "--num-prompts", "4", "--max-new-tokens", "8", "--budget", "2.0"]
    common += ["--train-step-s", "0.5", "--gpu", "H100", "--response-len", "64", "--rollout-batch", "16"]
    r = cli(
        "plan",
        *common,
        "--fp8",
        "FP8_DYNAMIC",
        "--calibration",
        str(cal),
        "--verl-async",
        "trigger=2,staleness=0",
        "--out",
        str(tmp_path / "cal-plan"),
    )
    assert r.code == 0, r.err
    doc = json.loads((tmp_path / "cal-plan" / "plan.json").read_text())
    rows = {row["configuration"]: row for row in doc["rows"]}
    a = rows["bf16 + verl async"]
    assert (a["mismatch"], a["mismatch_lo"], a["mismatch_hi"]) == pytest.approx((0.15, 0.10, 0.20))
    f = rows["fp8 FP8_DYNAMIC + verl async"]
    assert f["mismatch"] == pytest.approx(rows["fp8 FP8_DYNAMIC"]["mismatch"] + 0.15)
    assert f["mismatch_source"].startswith("sum")
    for row in (a, f):
        assert row["step_s"] == pytest.approx(max(row["rollout_s"], 0.5))
    assert doc["verl_async"]["regimes"]["trainer-bound"]["lags"] == {"0": 0.5, "1": 0.5}
    assert "verl async (trigger_parameter_sync_step 2, staleness_threshold 0; lags in trainer steps)" in r.out
    r = cli(
        "plan",
        *common,
        "--calibration",
        str(cal),
        "--verl-async",
        "trigger=3,staleness=0",
        "--out",
        str(tmp_path / "x"),
    )
    assert r.code == 2 and len(r.lines) == 1 and "no stale:2 level" in r.err and not (tmp_path / "x").exists()

    # measured: one checkpoint two steps old
    older_checkpoint(tiny_dirs["llama"], tmp_path / "old")
    keys = ["--verl-async", "trigger=2,staleness=0.5", "--stale", str(tmp_path / "old"), "--stale-steps", "2"]
    r = cli("plan", *common, *keys, "--out", str(tmp_path / "measured"))
    assert r.code == 0, r.err
    row = {x["configuration"]: x for x in json.loads((tmp_path / "measured" / "plan.json").read_text())["rows"]}
    c = cli("check", *common[:7], *keys, "--out", str(tmp_path / "check"))
    assert c.code in (0, 1, 3), c.err
    lag = json.loads((tmp_path / "check" / "check.json").read_text())["verl_async"]["lags"]
    want = 0.5 * (lag["1"]["measured"] + lag["2"]["measured"])
    assert row["bf16 + verl async"]["mismatch"] == pytest.approx(want, rel=1e-6)
    assert row["bf16 + verl async"]["mismatch_source"].startswith("measured: verl's trainer-bound lags")


def test_the_plan_verb_measures_each_configuration_on_the_bench_it_is_given(tiny_dirs, made_references):
    """`plan(bench, settings, serving, model)` from Python: each configuration's cost is the mismatch `measure` gives
    for it on that bench (whole-model FP8 measured here apart, by hand: every unit the scheme fits), BF16 costs
    nothing, and the bench's one reference pass serves them all; without a bench nothing is measured. Seen failing
    with the verb measuring on a bench of its own (a second reference pass) and with the bench's rows dropped."""
    from fp8probe import Bench, measure, plan
    from fp8probe.core.metrics import excess
    from fp8probe.core.schemes import Scheme
    from fp8probe.deploy.serving import Serving
    from fp8probe.measurement.perturbation import Perturbation
    from fp8probe.model.rollouts import make_rollouts
    from fp8probe.model.settings import ModelSource
    from fp8probe.planning.plan import PlanSettings

    model = ModelSource(str(tiny_dirs["llama"]))
    student = model.load()
    bench = Bench(student, make_rollouts(student, num_prompts=4, max_new_tokens=8, seed=0))
    settings = PlanSettings(fp8=("FP8_DYNAMIC",), budget="2.0", train_step_s=0.5, response_len=256)
    record = plan(bench, settings, Serving(gpu="H100"), model)
    rows = {r["configuration"]: r for r in record.rows}
    assert set(rows) == {"bf16", "fp8 FP8_DYNAMIC"}
    scheme = Scheme.from_name("FP8_DYNAMIC")
    by_hand = measure(bench, Perturbation(tuple(u.name for u in student.quantizable), scheme))
    fp8 = rows["fp8 FP8_DYNAMIC"]
    assert fp8["mismatch"] == pytest.approx(excess("kl_q_p", by_hand.metrics["kl_q_p"]), rel=1e-6)
    assert [fp8["mismatch_lo"], fp8["mismatch_hi"]] == pytest.approx(by_hand.excess_interval("kl_q_p"), rel=1e-6)
    assert fp8["mismatch"] > 0 and rows["bf16"]["mismatch"] == 0.0
    assert len(made_references) == 1  # the bench's own reference, for the verb and for the measurement by hand
    unmeasured = plan(None, settings, Serving(gpu="H100"), model)
    assert all(r["mismatch"] is None and r["mismatch_source"] == "not measured" for r in unmeasured.rows)


def test_the_budgets_student_is_checked_once(monkeypatch):
    """`fp8probe plan` checks the student against a calibrated budget before sampling its rollouts (a content hash of
    every weight) and hands the plan verb that checked evidence: the verb does not hash it again. Seen failing with
    the checked evidence ignored (two checks)."""
    from fp8probe.budget import fit
    from fp8probe.planning.plan import PlanEvidence

    calls = []
    monkeypatch.setattr(fit, "check_student", lambda budget, student, other: calls.append(student) or "a note")
    evidence = PlanEvidence(None, "a budget").on("the student", False)
    assert (evidence.student_note, evidence.checked, calls) == ("a note", True, ["the student"])
    assert evidence.on("the student", False) is evidence and len(calls) == 1
