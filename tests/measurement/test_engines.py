"""Engine profiles (vllm_profile.py): vLLM's activation quantization by hand, the bf16 model, and vLLM-CPU itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_student

from fp8probe.core.schemes import KVCacheScheme, Scheme
from fp8probe.measurement.engines import engine
from fp8probe.measurement.vllm_profile import (
    MIN_SCALE,
    _fp8_linear,
    engine_model,
    fp8_kv_attention,
    quantize_activation,
    quantize_activation_groups,
    quantize_activation_static,
    quantize_activation_tensor,
    response_logp,
)

CPU, CUDA = engine("vllm-cpu"), engine("vllm-cuda")
DYNAMIC, KV = Scheme.from_name("FP8_DYNAMIC"), KVCacheScheme.from_name("fp8")


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


def test_per_tensor_dynamic_by_hand():
    """FP8_TENSOR_DYNAMIC (vLLM's online quantization="fp8"): one fp32 scale over every token of the call, amax /
    448 with vLLM's floor; codes by reciprocal-multiply. bf16 -3.3 is -3.296875, / 2 -> 1.6484 -> e4m3 1.625;
    bf16 0.3 is 0.30078, / 2 -> 0.1504 -> 0.15625 (step 1/64 in [1/8, 1/4))."""
    x = torch.tensor([[896.0, 1.0, -3.3], [0.3, 2.0, 0.0]], dtype=torch.bfloat16)
    codes, scale = quantize_activation_tensor(x)
    assert scale.dtype == torch.float32 and scale.tolist() == [[2.0]]
    assert codes.float().tolist() == [[448.0, 0.5, -1.625], [0.15625, 1.0, 0.0]]
    assert quantize_activation_tensor(torch.zeros(2, 3))[1].item() == pytest.approx(MIN_SCALE)
    # the Linear: codes @ weight codes in fp32, * 2 * the weight's one scale, bf16 out
    e4 = torch.float8_e4m3fn
    w = torch.tensor([[1.0, 2.0, 0.5]]).to(e4)
    lin = _fp8_linear(w, torch.tensor(0.25), None, torch.bfloat16, Scheme.from_name("FP8_TENSOR_DYNAMIC"))
    want = [(448 + 1.0 - 0.8125) * 2 * 0.25, (0.15625 + 2.0) * 2 * 0.25]
    assert lin(x).float().flatten().tolist() == [torch.tensor(v, dtype=torch.bfloat16).item() for v in want]


def test_static_and_block_linears_by_hand():
    """FP8 (static): codes = e4m3(x * (1 / input_scale)), fp32 GEMM, * scales, bf16. FP8_BLOCK: one scale per 128
    values of a token, x / scale, the GEMM summed per 128-block with both scales."""
    e4 = torch.float8_e4m3fn
    lin = _fp8_linear(
        torch.tensor([[1.0, 2.0]]).to(e4),
        torch.tensor(0.5),
        None,
        torch.bfloat16,
        Scheme.from_name("FP8"),
        input_scale=torch.tensor(0.01),
    )
    # 0.1 / 0.01 = 10 (exact in e4m3), 0.33 / 0.01 = 33 -> 32 (step 4 in [32, 64)); (10 + 64) * 0.01 * 0.5 = 0.37
    assert lin(torch.tensor([[0.1, 0.33]])).item() == torch.tensor(0.37, dtype=torch.bfloat16).item()
    assert quantize_activation_static(torch.tensor([1000.0, 3.3]), torch.tensor(1.0)).float().tolist() == [448.0, 3.25]
    # a token whose second group is 100x smaller than its first keeps its precision there
    x = torch.cat([torch.full((1, 128), 4.0), torch.full((1, 128), 0.03)], dim=1)
    x[0, 0] = 448.0
    codes, scales = quantize_activation_groups(x)
    assert scales.tolist() == [[1.0, pytest.approx(0.03 / 448)]] and codes[0, 128:].float().unique().tolist() == [448.0]
    w = torch.cat([torch.full((1, 128), 1.0), torch.full((1, 128), 2.0)], dim=1).to(e4)
    blk = _fp8_linear(w, torch.tensor([[0.5, 0.25]]), torch.tensor([1.0]), torch.float32, Scheme.from_name("FP8_BLOCK"))
    want = (448 + 127 * 4) * 0.5 + 128 * 0.03 * 0.5 + 1.0  # = x . (codes * block scales) + bias
    assert blk(x).item() == pytest.approx(want, rel=1e-5)


def test_fp8_kv_attention_by_hand():
    """FlashAttention 3 over an FP8 KV cache: P = exp2(S log2 e - (max - 8)) is cast to e4m3 for P.V while the row
    sum keeps fp32 P. One query, two keys, S log2 e = [0, 0.5]: P = [2**7.5, 256] = [181.02, 256]; e4m3 turns
    181.02 into 176 (step 16 in [128, 256)), so the first output is 176 / 437.02 = 0.4027 where exact softmax
    attention gives 181.02 / 437.02 = 0.4142."""
    import math

    q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.bfloat16)
    k = torch.tensor([[[[0.0, 0.0], [1.0, 0.0]]]], dtype=torch.bfloat16)
    v = torch.tensor([[[[1.0, 0.0], [0.0, 3.0]]]], dtype=torch.bfloat16)
    keep = torch.ones(1, 1, 1, 2, dtype=torch.bool)
    one = torch.tensor(1.0)
    out = fp8_kv_attention(q, k, v, keep, 0.5 * math.log(2), (one, one, one))
    p0, total = 2**7.5, 2**7.5 + 256
    assert out.shape == (1, 1, 1, 2)
    assert out[0, 0, 0, 0].item() == torch.tensor(176 / total, dtype=torch.bfloat16).item()
    assert out[0, 0, 0, 1].item() == torch.tensor(768 / total, dtype=torch.bfloat16).item()
    assert abs(out[0, 0, 0, 0].item() - p0 / total) > 0.01
    # the query shares K's scale (vLLM, no q_scale in the checkpoint): beyond 448 * k_scale it saturates
    big = fp8_kv_attention(q * 1000, k, v, keep, 0.5 * math.log(2), (one, one, one))
    sat = fp8_kv_attention(q * 448, k, v, keep, 0.5 * math.log(2), (one, one, one))
    assert torch.equal(big, sat)
    # an additive float mask and a boolean one are the same mask; a fully masked (padding) row gives 0, not NaN
    add = torch.tensor([[[[0.0, torch.finfo(torch.float32).min]]]])
    assert torch.equal(
        fp8_kv_attention(q, k, v, add, 1.0, (one, one, one)),
        fp8_kv_attention(q, k, v, torch.tensor([[[[True, False]]]]), 1.0, (one, one, one)),
    )
    none = fp8_kv_attention(q, k, v, torch.zeros(1, 1, 1, 2, dtype=torch.bool), 1.0, (one, one, one))
    assert torch.equal(none, torch.zeros_like(none))
    # no mask (transformers' SDPA path): one query (a decoding step) sees every key; several queries are causal
    ones = (one, one, one)
    assert torch.equal(fp8_kv_attention(q, k, v, None, 1.0, ones), fp8_kv_attention(q, k, v, keep, 1.0, ones))
    q2 = q.expand(1, 1, 2, 2)
    causal = torch.tensor([[[[True, False], [True, True]]]])
    assert torch.equal(
        fp8_kv_attention(q2, k, v, None, 1.0, (one, one, one)), fp8_kv_attention(q2, k, v, causal, 1.0, (one, one, one))
    )


def test_fp8_kv_profile_in_the_model(monkeypatch):
    """Every layer's attention goes through the FP8 KV path; padding does not leak into a sequence (the batch of
    three left-padded rollouts gives each sequence what it gets alone); with no FP8 KV, the bf16 model."""
    import fp8probe.measurement.vllm_profile as engines
    from fp8probe.measurement.reference import Reference
    from fp8probe.model.rollouts import make_rollouts

    s = tiny_student("llama")
    r = make_rollouts(s, num_prompts=3, max_new_tokens=6, seed=0)
    cal = Reference(s, r).calibration
    calls, original = [], engines.fp8_kv_attention
    monkeypatch.setattr(engines, "fp8_kv_attention", lambda *a: calls.append(a[-1][1].item()) or original(*a))
    with engine_model(s, [], DYNAMIC, CUDA, KV, calibration=cal) as m:
        batched, _ = response_logp(m, r, batch_size=3)
        n = len(calls)
        alone, _ = response_logp(m, r, batch_size=1)
    layers = s.model.config.num_hidden_layers
    assert n == layers and calls[:layers] == [pytest.approx(float(cal.k_amax[i]) / 448) for i in range(layers)]
    assert torch.isfinite(batched).all() and (batched - alone).abs().max() < 0.05
    with engine_model(s, [], DYNAMIC, CUDA) as m:
        plain, _ = response_logp(m, r)
    assert (plain - batched).abs().max() > 1e-3


def test_experts_profile_is_the_linear_profile_per_expert():
    """A token routed to one expert with weight 1: the experts profile gives what vLLM's Linear steps give for
    gate_up, SiLU(gate) * up in fp32 from the bf16 halves, then down (the same arithmetic, another code path);
    with two experts, the routing weights multiply in fp32 before the bf16 cast and the results add."""
    from fp8probe.core.numerics import quantize_weight
    from fp8probe.measurement.vllm_profile import _fp8_experts

    s = tiny_student("mixtral")
    mod = __import__("copy").deepcopy(s.model.get_submodule("model.layers.0.mlp.experts")).to(torch.bfloat16)
    scheme = Scheme.from_name("FP8_DYNAMIC")
    fwd = _fp8_experts(mod, scheme, torch.bfloat16)
    x = torch.randn(1, mod.gate_up_proj.shape[-1], generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)

    def by_linear(e):
        gu = _fp8_linear(*quantize_weight(mod.gate_up_proj[e], scheme), None, torch.bfloat16, scheme)(x)
        gate, up = gu.float().chunk(2, dim=-1)
        h = (gate * torch.sigmoid(gate) * up).to(torch.bfloat16)
        return _fp8_linear(*quantize_weight(mod.down_proj[e], scheme), None, torch.bfloat16, scheme)(h)

    one = fwd(x, torch.tensor([[1]]), torch.tensor([[1.0]]))
    assert torch.equal(one, by_linear(1))
    two = fwd(x, torch.tensor([[0, 2]]), torch.tensor([[0.75, 0.25]]))
    assert torch.allclose(two.float(), 0.75 * by_linear(0).float() + 0.25 * by_linear(2).float(), rtol=2e-2, atol=1e-3)


def test_no_fp8_unit_is_the_bf16_model():
    s = tiny_student("llama")
    from fp8probe.model.rollouts import make_rollouts

    r = make_rollouts(s, num_prompts=3, max_new_tokens=6, seed=0)
    with engine_model(s, [], DYNAMIC, CPU) as m:
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
    draws = [d[np.concatenate([groups[i] for i in rng.integers(0, len(groups), len(groups))])].mean() for _ in range(n)]
    return float(d.mean()), *np.quantile(draws, [0.05, 0.95])


AMX_GAP = 0.2  # relative: measured 10 % (interval 2.5 .. 18 %) on an AMX Xeon


@pytest.mark.slow
@pytest.mark.vllm
def test_cpu_profile_predicts_vllm_cpu_within_sampling_noise(embedded):
    """The shipped tight recipe (23 units in FP8_DYNAMIC), where the engine's bf16 arithmetic matters most:
    per token, |log p_ref - log q| under the vllm-cpu profile and under vLLM-CPU itself; their mean difference
    must be closer to 0 than the fp32 simulation's, which leaves out the engine's bf16 rounding, and within its
    own 90 % bootstrap interval of 0 (the tolerance is the sampling noise, measured here) on the CPUs the profile
    follows. On a CPU with AMX tiles vLLM-CPU dispatches other kernels (its SGL AMX GEMMs for BF16 weights under
    1 MiB, the AMX attention backend), which the profile does not follow: measured on a 2-core AMX Xeon, vLLM 0.0559,
    profile 0.0502 (-10 %, interval -0.0101 .. -0.0014), fp32 simulation 0.0410; vLLM's own FP8 GEMM (oneDNN's
    reference kernel) and its fp32 stand-in gave 0.0489 and 0.0491 on 144 tokens, so the stand-in is not the gap.
    There the bound is the measured gap with room for sampling noise: |difference| <= AMX_GAP of vLLM's value."""
    import tempfile
    from pathlib import Path

    from fp8probe.deploy.export import export
    from fp8probe.deploy.vllm_check import VLLMServe, run_vllm
    from fp8probe.measurement.mismatch import response_positions
    from fp8probe.measurement.quantize import quantize_units
    from fp8probe.measurement.reference import Reference
    from fp8probe.model.rollouts import make_rollouts
    from fp8probe.model.settings import ModelSource
    from fp8probe.recipe.recipe import read_recipe

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m" / "kl_q_p-0.002" / "recipe.yaml"
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
        res = run_vllm(
            export(ModelSource(), recipe, Path(tmp) / "ckpt", max_model_len=8192).out, VLLMServe(8192), score=seqs
        )
    real = np.asarray(
        [lp[t] for i, lp in enumerate(res["prompt_logprobs"]) for t in range(1, len(lp)) if r.response_mask[i][t]],
        dtype=np.float64,
    )
    with engine_model(embedded, units, DYNAMIC, CPU) as m:
        prof = logp(m)
    with quantize_units(embedded.model, units, Scheme.from_name("FP8_DYNAMIC")):
        sim = logp(embedded.model)
    d_real, d_prof, d_sim = (np.abs(lp_ref - x) for x in (real, prof, sim))
    prof_mean, lo, hi = paired_interval(d_prof, d_real, seq)
    sim_mean, slo, shi = paired_interval(d_sim, d_real, seq)
    print(
        f"{len(real)} tokens; mean |dlogp| realised {d_real.mean():.4f}, profile {d_prof.mean():.4f} "
        f"(diff {prof_mean:+.4f} [{lo:+.4f}, {hi:+.4f}]), fp32 simulation {d_sim.mean():.4f} "
        f"(diff {sim_mean:+.4f} [{slo:+.4f}, {shi:+.4f}])"
    )
    assert abs(prof_mean) < abs(sim_mean)
    if torch.cpu._is_amx_tile_supported():
        assert abs(prof_mean) <= AMX_GAP * d_real.mean()
    else:
        assert lo <= 0 <= hi


def test_measure_engine_cli(cli, tiny_dirs, tmp_path):
    """`fp8probe measure --engine vllm-cpu`: the whole model through the profile, on the sweep's scale; the
    bf16 engine is not the fp32 simulation; what no profile covers is refused in one line before any output."""
    import json

    common = ["-q", "measure", tiny_dirs["llama"], "--num-prompts", 3, "--max-new-tokens", 6]
    assert cli(*common, "--out", tmp_path / "sim", "--engine", "sim").code == 0
    r = cli(*common, "--out", tmp_path / "eng", "--engine", "vllm-cpu", "--rollouts", tmp_path / "sim")
    assert r.code == 0, r.err
    r = cli(*common, "--out", tmp_path / "kv", "--kv-cache-dtype", "fp8", "--rollouts", tmp_path / "sim")
    assert r.code == 0, r.err  # the default: vllm-cuda, FP8 KV cache included
    sim, eng, kv = (json.loads((tmp_path / d / "mismatch.json").read_text()) for d in ("sim", "eng", "kv"))
    assert eng["engine"] == "vllm-cpu" and sim["engine"] == "sim" and kv["engine"] == "vllm-cuda"
    assert eng["metrics"]["kl_q_p"] > 0 and eng["metrics"]["kl_q_p"] != sim["metrics"]["kl_q_p"]
    assert kv["metrics"]["kl_q_p"] > eng["metrics"]["kl_q_p"]
    from fp8probe.core.errors import FP8ProbeError

    with pytest.raises(FP8ProbeError, match="AMX"):
        CPU.check(Scheme.from_name("FP8_BLOCK"))
    with pytest.raises(FP8ProbeError, match="static_scaled_fp8_quant"):  # vLLM-CPU cannot load per-tensor weights
        CPU.check(Scheme.from_name("FP8"))
    moe = tiny_student("mixtral")
    with pytest.raises(FP8ProbeError, match="MoE kernels need AMX"):
        with engine_model(moe, [u.name for u in moe.quantizable], DYNAMIC, CPU):
            pass
    engine("sim").check(Scheme.from_name("FP8_BLOCK"), KVCacheScheme.from_name("fp8_e5m2"), experts=True)
    for name, bad, why in (
        ("vllm-cpu", ["--kv-cache-dtype", "fp8"], "AVX-512"),
        ("vllm-cuda", ["--kv-cache-dtype", "fp8_e5m2"], "e4m3"),
    ):
        r = cli(*common, "--out", tmp_path / "x", "--engine", name, *bad)
        assert r.code == 2 and len(r.lines) == 1 and "use --engine sim" in r.err and why in r.err
        assert not (tmp_path / "x").exists()


def test_topk_kl_bound_never_exceeds_the_full_kl():
    """Pooling q's tail into one bin never raises KL(q||p): the top-K bound is <= the full KL, equal at K = V."""
    from fp8probe.measurement.mismatch import RefRows, kl_lower_bound_topk, token_stats

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


def test_fp8_kv_profile_decodes_as_it_prefills():
    """Token-by-token decoding through the FP8 KV profile (a KV cache, one query per step, no mask for a single
    sequence) gives the logits of one full forward over the same tokens: every step attends to every key so far."""
    from fp8probe.measurement.reference import Reference
    from fp8probe.model.rollouts import make_rollouts

    s = tiny_student("llama")
    r = make_rollouts(s, num_prompts=2, max_new_tokens=6, seed=0)
    cal = Reference(s, r).calibration
    ids = r.input_ids[:1, : int(r.attention_mask[0].sum())]
    with engine_model(s, [], DYNAMIC, CUDA, KV, calibration=cal) as m, torch.no_grad():
        full = m(input_ids=ids).logits[0].float()
        out = m(input_ids=ids[:, :-3], use_cache=True)
        steps = [out.logits[0, -1].float()]
        for t in range(ids.shape[1] - 3, ids.shape[1]):
            out = m(input_ids=ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[0, -1].float())
    want = full[ids.shape[1] - 4 :]
    got = torch.stack(steps)
    assert (got - want).abs().max() < 0.05 * want.abs().max()  # bf16 arithmetic in other shapes, nothing more
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_check_through_the_engine(cli, tiny_dirs, tmp_path):
    """`fp8probe check --engine vllm-cuda`: the measured figure, the prefix shift and the own-sample mismatch come
    from the engine's copy (the FP8 KV cache as FlashAttention 3 runs it), not the simulation; what the profile
    does not cover is refused before any output."""
    import json

    common = [tiny_dirs["llama"], "--kv-cache-dtype", "fp8", "--budget", 1, "--num-prompts", 3, "--max-new-tokens", 6]
    assert cli("-q", "check", *common, "--out", tmp_path / "sim").code == 0
    r = cli("-q", "check", *common, "--out", tmp_path / "eng", "--engine", "vllm-cuda", "--rollouts", tmp_path / "sim")
    assert r.code == 0 and "as vllm-cuda runs it" in r.out, r.err
    sim, eng = (json.loads((tmp_path / d / "check.json").read_text()) for d in ("sim", "eng"))
    assert sim["engine"] == "sim" and eng["engine"] == "vllm-cuda"
    assert eng["measured"] > sim["measured"] > 0
    assert eng["prefix_shift"]["kl_q_p_own"] != sim["prefix_shift"]["kl_q_p_own"]
    r = cli("check", *common, "--out", tmp_path / "x", "--engine", "vllm-cpu")
    assert r.code == 2 and len(r.lines) == 1 and "AVX-512" in r.err and not (tmp_path / "x").exists()


def test_ladder_through_the_engine(cli, tiny_dirs, tmp_path):
    """`fp8probe ladder --engine vllm-cuda`: a first row for the engine alone (its bf16 arithmetic, no shortcut),
    every source measured through the profile: the FP8 KV row above the engine-alone row and above the simulated one."""
    import json

    import pandas as pd

    common = [
        tiny_dirs["llama"],
        "--noise",
        1e-3,
        "--kv-cache-dtype",
        "fp8",
        "--num-prompts",
        3,
        "--max-new-tokens",
        6,
        "--no-prefix-shift",
    ]
    assert cli("-q", "ladder", *common, "--out", tmp_path / "sim").code == 0
    r = cli("-q", "ladder", *common, "--out", tmp_path / "eng", "--engine", "vllm-cuda", "--rollouts", tmp_path / "sim")
    assert r.code == 0, r.err
    sim, eng = (pd.read_csv(tmp_path / d / "ladder.csv").set_index("source") for d in ("sim", "eng"))
    assert list(eng.index) == ["vllm-cuda alone", "noise 0.001", "kv fp8"] and "vllm-cuda alone" not in sim.index
    assert eng.loc["kv fp8", "kl_q_p"] > eng.loc["vllm-cuda alone", "kl_q_p"] > 0
    assert eng.loc["kv fp8", "kl_q_p"] > sim.loc["kv fp8", "kl_q_p"]
    assert json.loads((tmp_path / "eng" / "ladder.json").read_text())["engine"] == "vllm-cuda"
