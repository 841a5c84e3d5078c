"""The sweep equals a naive full forward per unit, its sanity row is 0, it resumes after SIGKILL and is
deterministic."""

import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import ARCHS, cli_process, same_arithmetic, tiny_student

from fp8probe.core.schemes import KVCacheScheme, Scheme
from fp8probe.measurement.attention import quantize_kv
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.mismatch import METRICS, mismatch, response_logits
from fp8probe.measurement.quantize import quantize_units
from fp8probe.measurement.reference import Reference
from fp8probe.model.rollouts import make_rollouts
from fp8probe.sweeps.files import COLUMNS
from fp8probe.sweeps.settings import SweepSettings
from fp8probe.sweeps.sweep import plan_rows, sweep

_student = tiny_student


def _naive(student, rollouts, row, ref_cal, scheme, kv=KVCacheScheme()):
    """Full forward of the whole model with the row's perturbation, logits on every position."""
    import contextlib

    m = student.model
    ids, am, resp = rollouts.input_ids, rollouts.attention_mask, rollouts.response_mask
    with torch.no_grad():
        ref_logits, tokens = response_logits(m(input_ids=ids, attention_mask=am).logits, ids, resp)
        with contextlib.ExitStack() as st:
            p = row.perturbation
            if p.units:
                st.enter_context(quantize_units(m, p.units, scheme, calibration=ref_cal))
            if p.kv_layers:
                st.enter_context(quantize_kv(m, p.kv_layers, kv, calibration=ref_cal))
            cand, _ = response_logits(m(input_ids=ids, attention_mask=am).logits, ids, resp)
    return mismatch(ref_logits, cand, tokens)  # the model's forward already applies any logit softcap


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("scheme", ["FP8_DYNAMIC", "FP8", "FP8_TENSOR_DYNAMIC"])
def test_prefix_reuse_equals_naive_forward(arch, scheme):
    student = _student(arch)
    r = make_rollouts(student, num_prompts=5, max_new_tokens=8, batch_size=8)
    # one batch: the naive forward sees the same padding
    df = sweep(Bench(student, r, 8), SweepSettings(method="exact", scheme=scheme)).table
    ref = Reference(student, r, batch_size=8)
    sch = Scheme.from_name(scheme)
    rows = {row.unit: row for row in plan_rows(student, sch, "unit", True)}
    assert list(df["unit"]) == list(rows)
    for _, got in df.iterrows():
        row = rows[got["unit"]]
        want = _naive(student, r, row, ref.calibration, sch)
        for k in METRICS:
            assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-9), (got["unit"], k)
    assert (df[["kl_q_p", "kl_p_q", "k3"]] >= 0).all().all()
    sanity = df[df["unit"] == "model.reference"].iloc[0]
    assert sanity["kl_q_p"] == 0 and sanity["kl_max"] == 0 and sanity["top1_agree"] == 1
    assert list(df.columns) == COLUMNS


def test_group_granularity_and_bytes():
    student = _student("llama")
    r = make_rollouts(student, num_prompts=3, max_new_tokens=6)
    df = sweep(Bench(student, r), SweepSettings(method="exact", granularity="group", include_kv=False)).table
    kinds = df[df.block == 0]["kind"].tolist()
    assert kinds == ["qkv", "o", "gate_up", "down"]
    qkv = df[df.unit == "model.layers.0.self_attn.qkv_proj"].iloc[0]
    # q [128,128] + k [64,128] + v [64,128]: 32768 weights; per-channel scales: 256 rows x 2 bytes
    assert qkv["params"] == 32768 and qkv["bytes_saved"] == 32768 - 2 * 256
    whole = df[df.unit == "model.fp8_all"].iloc[0]
    assert whole["bytes_saved"] == df[df.kind != "model"]["bytes_saved"].sum()


def _cli(*args):
    return cli_process("-q", *args)


def test_kill_resume_and_determinism(deep_tiny_dir, tmp_path):
    slow_tiny = deep_tiny_dir
    common = ["--method", "exact", "--num-prompts", 6, "--max-new-tokens", 12, "--seed", 5]
    full = tmp_path / "full"
    p = _cli("sweep", slow_tiny, "--out", full, *common)
    assert p.wait(timeout=600) == 0, p.stderr.read()
    # determinism across processes: the killed run's rows and the resumed run's rest equal `full`'s, byte for byte,
    # since all three ran the same arithmetic (conftest.cli_process: same flags, same thread count; checked below)

    killed = tmp_path / "killed"
    p = _cli("sweep", slow_tiny, "--out", killed, *common)
    partial = killed / "sensitivity.partial.csv"
    deadline = time.time() + 300
    while time.time() < deadline:
        if partial.exists() and partial.read_text().count("\n") >= 20:
            break
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait() == -signal.SIGKILL
    n_done = partial.read_text().count("\n") - 1
    total = len(pd.read_csv(full / "sensitivity.csv"))
    assert 0 < n_done < total, "the sweep finished before it could be killed"
    assert not (killed / "sensitivity.csv").exists()
    with open(partial, "a") as f:  # a row cut off mid-write by the kill
        f.write("model.layers.9.self_attn.q_proj,q,9,model.layers.9.self")

    bad = _cli("sweep", slow_tiny, "--out", killed, "--resume", *common, "--scheme", "FP8_BLOCK")
    assert bad.wait(timeout=600) == 2
    assert "other settings (scheme)" in bad.stderr.read()

    p = _cli("sweep", slow_tiny, "--out", killed, "--resume", *common)
    assert p.wait(timeout=600) == 0, p.stderr.read()
    assert same_arithmetic(killed, full)
    assert (killed / "sensitivity.csv").read_bytes() == (full / "sensitivity.csv").read_bytes()
    assert not partial.exists()


def test_whole_model_rows_carry_intervals_and_the_kv_effect():
    """run.json's whole_model: each whole-model row again with its interval (the same value the sweep's own row
    measured), and the FP8 KV cache's effect on top of FP8 weights paired over the same tokens."""
    from fp8probe.sweeps.sweep import summary, whole_model_rows

    student = tiny_student("gemma3_text")  # sliding-window layers and a single KV group per kind
    r = make_rollouts(student, num_prompts=6, max_new_tokens=8, seed=3)
    df = sweep(Bench(student, r)).table.set_index("unit")
    w = whole_model_rows(Bench(student, r), SweepSettings(method="exact"))
    for name in ("model.fp8_all", "model.fp8_all_kv"):
        lo, hi = w[name]["interval"]
        assert w[name]["kl_q_p"] == pytest.approx(df.loc[name, "kl_q_p"], rel=1e-5)
        assert lo <= w[name]["kl_q_p"] <= hi and lo < hi
    effect = w["kv_effect"]
    assert effect["kl_q_p"] == pytest.approx(
        df.loc["model.fp8_all_kv", "kl_q_p"] - df.loc["model.fp8_all", "kl_q_p"], rel=1e-4, abs=1e-9
    )
    lo, hi = effect["interval"]
    assert lo <= effect["kl_q_p"] <= hi and effect["num_prompts"] == 6
    # the paired interval is narrower than the two rows' own intervals side by side
    assert hi - lo < sum(w[n]["interval"][1] - w[n]["interval"][0] for n in ("model.fp8_all", "model.fp8_all_kv"))
    line = summary(df.reset_index(), w).splitlines()[-1]
    assert line.startswith("the FP8 KV cache on top of FP8 weights") and "paired, 90 % over 6 prompts" in line


def test_whole_model_intervals_come_from_the_sweeps_own_rows(monkeypatch):
    """The sweep keeps its whole-model rows' per-token statistics (keep["model_rows"]), so run.json's whole_model
    is computed from the very measurement in the table (the same number, exactly) with no second pass; a row the
    sweep did not measure (a resumed sweep's) is measured again."""
    import fp8probe.measurement.measure as measure
    from fp8probe.sweeps.sweep import whole_model_rows

    student = tiny_student("gemma3_text")
    r = make_rollouts(student, num_prompts=6, max_new_tokens=8, seed=3)
    bench = Bench(student, r)
    swept = sweep(bench)
    df = swept.table.set_index("unit")
    assert set(swept.model_rows) == {"model.reference", "model.fp8_all", "model.fp8_all_kv"}
    # the rows measured a second time
    again = whole_model_rows(bench, SweepSettings(method="exact"))
    calls = []
    real = measure.measure
    monkeypatch.setattr(measure, "measure", lambda *a, **k: calls.append(a) or real(*a, **k))
    w = whole_model_rows(bench, SweepSettings(method="exact"), measured=swept.model_rows)
    assert calls == []
    for name in ("model.fp8_all", "model.fp8_all_kv"):
        assert w[name]["kl_q_p"] == df.loc[name, "kl_q_p"]
        assert w[name]["interval"] == pytest.approx(again[name]["interval"], rel=1e-4)
    assert w["kv_effect"]["interval"] == pytest.approx(again["kv_effect"]["interval"], rel=1e-4, abs=1e-9)
    partial = {"model.fp8_all": swept.model_rows["model.fp8_all"]}
    mixed = whole_model_rows(bench, SweepSettings(method="exact"), measured=partial)["kv_effect"]
    assert len(calls) == 1 and mixed["kl_q_p"] == pytest.approx(w["kv_effect"]["kl_q_p"], rel=1e-4, abs=1e-9)


def test_whole_model_rows_on_their_own_samples_as_verl_logs_them(cli, tiny_dirs, tmp_path):
    """`sweep --verl-figures`: run.json's whole-model rows carry verl's figures on each row's own samples, and
    rollout_corr/kl (mean of log q - log p over the tokens the FP8 model sampled) equals a recomputation from plain
    full forwards here: the candidate's continuations sampled again with the same common random numbers, both
    policies' log-probs of them gathered by hand. The sweep prints it; the fast estimate, which measures no
    whole-model row, refuses the flag in one line."""
    import json

    from fp8probe import load_rollouts, load_student
    from fp8probe.measurement.perturbed import apply_perturbation
    from fp8probe.measurement.prefix import prompt_ids, sample_crn
    from fp8probe.model.rollouts import Rollouts
    from fp8probe.sweeps.sweep import plan_rows

    out = tmp_path / "s"
    args = ("sweep", tiny_dirs["llama"], "--num-prompts", 4, "--max-new-tokens", 10)
    r = cli(*args, "--method", "exact", "--verl-figures", "--out", out)
    assert r.code == 0, r.err
    assert "model.fp8_all on its own samples, as verl logs it: rollout_corr/kl=" in r.out
    whole = json.loads((out / "run.json").read_text())["whole_model"]
    st, rollouts = load_student(tiny_dirs["llama"]), load_rollouts(out)
    ref = Reference(st, rollouts)
    prompts = prompt_ids(st, rollouts)
    for row in plan_rows(st, Scheme.from_name("FP8_DYNAMIC"), include_kv=True):
        if row.unit not in ("model.fp8_all", "model.fp8_all_kv"):
            continue
        got = whole[row.unit]["own_samples"]
        with apply_perturbation(st, row.perturbation, ref.calibration, many_forwards=True):
            own = Rollouts.from_sequences(
                prompts, sample_crn(st, prompts, max_new_tokens=10, seed=0, batch_size=64), st.tokenizer.pad_token_id
            )
            with torch.no_grad():
                q = torch.log_softmax(st.model(input_ids=own.input_ids, attention_mask=own.attention_mask).logits, -1)
        with torch.no_grad():
            p = torch.log_softmax(st.model(input_ids=own.input_ids, attention_mask=own.attention_mask).logits, -1)
        tok, mask = own.input_ids[:, 1:, None], own.response_mask[:, 1:].bool()
        diff = (q[:, :-1].gather(-1, tok) - p[:, :-1].gather(-1, tok)).squeeze(-1)[mask]
        assert diff.abs().max() > 0 and got["rollout_corr/kl"] == pytest.approx(float(diff.mean()), rel=0.01, abs=1e-7)
    # verl's own rollout (every Linear in 128x128 blocks where the shapes admit, KV at scale 1.0) beside the BF16 engine
    # alone: a figure reads as a multiple of the non-zero baseline every verl run logs
    base = whole["bf16_engine"]["own_samples"]["rollout_corr/kl"]
    verl = whole["verl_rollout"]
    assert verl["scheme"] == "FP8_BLOCK" and verl["kv"] == "fp8 (scale 1.0)"
    assert (
        "not_applied" in verl
        or verl["own_samples"]["rollout_corr/kl"] != whole["model.fp8_all_kv"]["own_samples"]["rollout_corr/kl"]
    )
    assert base != 0 and "the BF16 engine alone (vllm-cuda profile), as verl logs it" in r.out
    assert "x the BF16 engine's)" in r.out
    bad = cli(*args, "--verl-figures", "--out", tmp_path / "f")
    assert bad.code == 2 and "pass --method auto or exact" in bad.err and not (tmp_path / "f").exists()


def test_reference_kept_as_hidden_states_gives_the_same_rows_bit_for_bit():
    """Storage "hidden" recomputes the reference log-probs a chunk at a time, as the reference pass chunked them:
    every row of the sweep is the same number as with the log-probs kept, in a fraction of the memory."""
    from fp8probe.measurement.reference import HIDDEN_ABOVE_BYTES, reference_storage
    from fp8probe.sweeps.memory import estimate

    student = tiny_student("gemma3_text")  # softcapped logits, sliding-window layers
    r = make_rollouts(student, num_prompts=5, max_new_tokens=9, seed=2)
    refs = {s: Reference(student, r, 4, storage=s) for s in ("logp", "hidden")}
    tables = {s: sweep(Bench.around(ref, student, r, 4)).table for s, ref in refs.items()}
    pd.testing.assert_frame_equal(tables["logp"], tables["hidden"], check_exact=True)
    assert refs["hidden"].rows.storage == "hidden" and refs["logp"].rows.storage == "logp"
    # the whole [M, V] view recomputes in chunks counted from row 0, where the pass chunked each batch from its own
    # first row: the same numbers up to the GEMM's last bits, which depend on the chunk's rows on some CPUs (an
    # AVX2 AMD EPYC: 9.5e-7 on log-probs near -10). The rows a measurement takes are chunked as the pass chunked
    # them: bit for bit the same (the tables above).
    assert torch.allclose(refs["hidden"].rows.logp, refs["logp"].rows.logp, rtol=0, atol=1e-5)
    assert refs["hidden"].nbytes() < refs["logp"].nbytes()
    # auto: the log-probs while they fit in HIDDEN_ABOVE_BYTES, the hidden states beyond; the estimate follows
    cfg = student.model.config
    small = HIDDEN_ABOVE_BYTES // (cfg.vocab_size * 4)
    assert reference_storage("auto", cfg, small) == "logp" and reference_storage("auto", cfg, small + 1) == "hidden"
    host = {n: estimate(cfg, 4, "exact", 8, 1, n, n).host for n in (small, small + 1)}
    assert host[small] == small * cfg.vocab_size * 4 and host[small + 1] == (small + 1) * cfg.hidden_size * 4


def test_a_student_fetched_by_name_reloads_by_name():
    """A sweep of a student fp8probe fetches (Gemma 3 270M, SmolLM2) is loaded again by its name, not by the cache path
    it was converted to (which may move); a local model by its path; a pruned student by its name. Seen failing with
    Gemma's cache path returned."""
    from types import SimpleNamespace

    from fp8probe.sweeps.files import SweepRun

    def source(model, path):
        return SweepRun(Path("."), SimpleNamespace(model=model, model_path=path), None).model_source

    assert source("gemma3-270m", "/cache/gguf/a5fd") == "gemma3-270m"
    assert source("smollm2-135m", "/cache/student") is None  # the embedded one: load_student's default
    assert source("/models/mine", "/models/mine") == "/models/mine"
    assert source("pruned:3", "/cache/student") == "pruned:3"
