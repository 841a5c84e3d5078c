"""A response that straddles a weight sync (measurement/straddle.py): the two-phase forward (the old state's KV cache
kept, the new state continuing on it) against plain forwards of each state."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_student

from fp8probe.measurement.measure import measure
from fp8probe.measurement.mismatch import response_positions
from fp8probe.measurement.perturbation import Perturbation
from fp8probe.measurement.reference import Reference
from fp8probe.measurement.straddle import measure_straddle, split_at
from fp8probe.model.rollouts import make_rollouts


@pytest.fixture(scope="module")
def setup():
    st = tiny_student("llama")
    r = make_rollouts(st, num_prompts=4, max_new_tokens=8, seed=0)
    g = torch.Generator().manual_seed(0)
    older = {
        n: p.detach() + torch.randn(p.shape, generator=g) * 0.05 * p.detach().std().clamp_min(1e-3)
        for n, p in st.model.named_parameters()
    }
    return st, r, Reference(st, r), Perturbation(stale=older)


def _rounding(plain) -> float:
    """What fp32 rounding alone may leave of a per-token KL where the weights agree: the two-phase forward runs the
    prefix at another length than the plain forward, so another GEMM shape, and on a CPU without AVX-512 (AVX2 alone)
    its last bits differ: 3.6e-7 per token here, against the old state's 0.010 or more. Bounded at 1e-4 of the
    smallest per-token KL the old state causes (0 on the CPUs this was first run on)."""
    return 1e-4 * float(plain.min())


def test_one_state_on_both_sides_is_a_plain_forward(setup):
    """The same weights before and after the split: the cached continuation is the plain forward, to rounding; the
    trainer's own weights on both sides: no mismatch at all."""
    st, r, ref, old = setup
    plain = measure(ref, st, r, old)
    both = measure_straddle(ref, st, r, old, old)
    assert both.metrics["kl_q_p"] == pytest.approx(plain.metrics["kl_q_p"], rel=1e-4)
    assert torch.allclose(both.stats["kl_q_p"], plain.stats["kl_q_p"], rtol=1e-3, atol=1e-7)
    same = measure_straddle(ref, st, r, Perturbation(), Perturbation()).stats["kl_q_p"]
    assert float(same.abs().max()) < _rounding(plain.stats["kl_q_p"])


def test_the_prefix_is_the_old_state_and_the_suffix_sees_its_cache(setup):
    """Old weights, then the trainer's: every token predicted before the split carries exactly the old state's
    per-token KL; after it, less than the old state's on the whole (the new weights predict) but not zero (they
    attend to the old state's KV cache). Seen failing with the split moved one token later."""
    st, r, ref, old = setup
    plain = measure(ref, st, r, old).stats["kl_q_p"]
    got = measure_straddle(ref, st, r, old, Perturbation()).stats["kl_q_p"]
    rows, cols = response_positions(r.response_mask)
    lengths = r.attention_mask.sum(1)
    prompt = lengths - r.response_mask.sum(1)
    cut = torch.tensor([split_at(int(p), int(n - p)) for p, n in zip(prompt, lengths)])
    before = cols < cut[rows]
    assert before.any() and (~before).any()
    assert torch.allclose(got[before], plain[before], rtol=1e-3, atol=1e-7)
    tiny = _rounding(plain)
    assert got[~before].sum() < plain[~before].sum() and got[~before].max() > 100 * tiny
    # the other way round, the trainer's weights first: nothing before the split, and the very first prediction
    # after it is the old state's already
    swapped = measure_straddle(ref, st, r, Perturbation(), old).stats["kl_q_p"]
    assert float(swapped[before].abs().max()) < tiny and bool((swapped[cols == cut[rows]] > 100 * tiny).all())
