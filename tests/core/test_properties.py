"""Properties that must hold for every input, searched by hypothesis: the FP8 numerics and the mismatch metrics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8probe.core.numerics import compute_scale, fake_quant
from fp8probe.core.schemes import QuantSpec
from fp8probe.measurement.mismatch import METRICS, mismatch  # noqa: E402

# finite fp32 values, subnormals included; |x| <= 2^116 (8e34) keeps 448 x (amax / 448) representable in fp32
values = st.floats(min_value=-(2.0**116), max_value=2.0**116, allow_nan=False, allow_infinity=False, width=32)
tensors = st.lists(values, min_size=1, max_size=64).map(lambda v: torch.tensor(v, dtype=torch.float32))
specs = st.sampled_from(
    [QuantSpec("tensor"), QuantSpec("token"), QuantSpec("tensor", fmt="e5m2"), QuantSpec("token", fmt="e5m2")]
)
FMT = {"e4m3": (3, -6), "e5m2": (2, -14)}  # mantissa bits, smallest normal exponent


def half_step(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """Half the spacing of FP8 values around |v| (in units of the scale)."""
    mant, emin = FMT[fmt]
    e = torch.floor(torch.log2(v.abs().clamp_min(2.0**emin))).clamp_min(emin)
    return 0.5 * torch.exp2(e - mant)


@settings(max_examples=300, deadline=None)
@given(x=tensors, spec=specs)
def test_fake_quant_finite_and_within_half_a_step(x, spec):
    xq = fake_quant(x, spec)
    assert torch.isfinite(xq).all()
    scale = compute_scale(x, spec)
    v = x / scale  # the value in FP8 units, as quantize() forms it
    err = (x.double() - xq.double()).abs()
    bound = half_step(v, spec.fmt).double() * scale.double() * (1 + 1e-6) + 1e-45
    assert (err <= bound).all(), (x[err > bound], xq[err > bound])


@settings(max_examples=300, deadline=None)
@given(x=tensors, spec=specs, s=st.floats(min_value=1e-6, max_value=1e6))
def test_fake_quant_idempotent_with_a_fixed_scale(x, spec, s):
    """Quantizing an already quantized tensor with the same scale changes nothing (saturation included)."""
    scale = torch.tensor([s], dtype=torch.float32)
    once = fake_quant(x, spec, scale=scale)
    assert torch.isfinite(once).all()
    assert torch.equal(fake_quant(once, spec, scale=scale), once)


@settings(max_examples=300, deadline=None)
@given(x=tensors, spec=specs)
def test_fake_quant_idempotent_with_its_own_scale(x, spec):
    """With the scale taken from the tensor itself, a second pass moves values by at most a rounding of the
    scale (amax' = 448 x scale may differ from amax in the last bit)."""
    once = fake_quant(x, spec)
    twice = fake_quant(once, spec)
    amax = once.abs().amax(dim=-1, keepdim=True) if spec.strategy == "token" else once.abs().amax()
    assert ((twice - once).abs() <= amax * 4e-7 + 1e-45).all()


logit_rows = st.integers(min_value=1, max_value=6)
vocab = st.integers(min_value=2, max_value=50)


def _logits(seed, m, v, spread):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, v, generator=g, dtype=torch.float64).float() * spread


def _kl64(p_logits, q_logits):
    """KL(q || p) and KL(p || q) per row in float64, straight from the definition."""
    lp, lq = torch.log_softmax(p_logits.double(), -1), torch.log_softmax(q_logits.double(), -1)
    return (lq.exp() * (lq - lp)).sum(-1), (lp.exp() * (lp - lq)).sum(-1)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31), m=logit_rows, v=vocab, spread=st.floats(0.01, 20.0), noise=st.floats(1e-3, 5.0))
def test_kl_nonnegative_and_matches_float64(seed, m, v, spread, noise):
    p = _logits(seed, m, v, spread)
    q = p + _logits(seed + 1, m, v, noise)
    tokens = torch.randint(0, v, (m,), generator=torch.Generator().manual_seed(seed))
    got = mismatch(p, q, tokens)
    kl_qp, kl_pq = _kl64(p, q)
    assert got["kl_q_p"] >= 0 and got["kl_p_q"] >= 0 and got["k3"] >= 0
    assert got["kl_q_p"] == pytest.approx(float(kl_qp.mean()), rel=1e-3, abs=1e-6)
    assert got["kl_p_q"] == pytest.approx(float(kl_pq.mean()), rel=1e-3, abs=1e-6)
    assert got["kl_max"] >= got["kl_p50"] >= 0


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31), m=logit_rows, v=vocab, spread=st.floats(0.01, 20.0))
def test_zero_iff_equal_distributions(seed, m, v, spread):
    p = _logits(seed, m, v, spread)
    tokens = torch.randint(0, v, (m,), generator=torch.Generator().manual_seed(seed))
    same = mismatch(p, p.clone(), tokens)
    zero = {k: 0.0 for k in METRICS}
    zero.update(top1_agree=1.0, token_mult_prob_error=1.0)  # the metrics whose zero point is 1
    assert same == zero
    # a different distribution: one logit of every row moved by 1 (never a uniform shift)
    q = p.clone()
    q[:, 0] += 1.0
    kl_qp, _ = _kl64(p, q)
    got = mismatch(p, q, tokens)
    if float(kl_qp.mean()) > 1e-5:  # fp32 resolves it (a dominant logit can make the KL vanish even in fp64)
        assert got["kl_q_p"] > 0 and got["kl_p_q"] > 0
    assert math.isfinite(got["kl_q_p"])
