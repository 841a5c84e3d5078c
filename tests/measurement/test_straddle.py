"""A response that straddles a weight sync (measurement/straddle.py): its tokens before the sync the old state's, after
it the new state's on a fresh prefill (as verl 0.9.1 resumes an aborted request), against plain forwards of each."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_student

from fp8probe.measurement.bench import Bench
from fp8probe.measurement.measure import measure
from fp8probe.measurement.mismatch import response_positions
from fp8probe.measurement.perturbation import Perturbation
from fp8probe.measurement.straddle import before_split, straddled
from fp8probe.model.rollouts import make_rollouts


def measure_straddle(bench, old, new):
    """A response sampled by `old` up to halfway and by `new` after it: the splice of the two plain figures, as
    check --verl-async makes it (budget/admission.py _straddle)."""
    return straddled(bench.rollouts, measure(bench, old), measure(bench, new))


@pytest.fixture(scope="module")
def setup():
    st = tiny_student("llama")
    r = make_rollouts(st, num_prompts=4, max_new_tokens=8, seed=0)
    g = torch.Generator().manual_seed(0)
    older = {
        n: p.detach() + torch.randn(p.shape, generator=g) * 0.05 * p.detach().std().clamp_min(1e-3)
        for n, p in st.model.named_parameters()
    }
    return st, r, Bench(st, r), Perturbation(stale=older)


def test_one_state_on_both_sides_is_a_plain_forward(setup):
    """The same weights before and after the split: exactly the plain forward; the trainer's own weights on both
    sides: no mismatch at all."""
    _, r, bench, old = setup
    plain = measure(bench, old)
    both = measure_straddle(bench, old, old)
    assert both.metrics["kl_q_p"] == plain.metrics["kl_q_p"] and torch.equal(
        both.stats["kl_q_p"], plain.stats["kl_q_p"]
    )
    assert float(measure_straddle(bench, Perturbation(), Perturbation()).stats["kl_q_p"].abs().max()) == 0.0


def test_the_prefix_is_the_old_state_and_the_suffix_is_re_prefilled(setup):
    """Old weights, then the trainer's: every token before the split carries exactly the old state's per-token KL,
    every token after it none, since verl re-prefills a resumed request with the new weights (no KV cache of the old
    ones is read: the module docstring). The other way round, the reverse. The split by hand: a response of R tokens
    after a prompt of P switches at position P + R // 2 - 1. Seen failing with the old two-phase forward (the suffix
    attending to the old state's cache: its tokens' KL > 0)."""
    _, r, bench, old = setup
    plain = measure(bench, old).stats["kl_q_p"]
    got = measure_straddle(bench, old, Perturbation()).stats["kl_q_p"]
    rows, cols = response_positions(r.response_mask)
    lengths = r.attention_mask.sum(1)
    prompt = lengths - r.response_mask.sum(1)
    cut = torch.tensor([int(p) + int(n - p) // 2 - 1 for p, n in zip(prompt, lengths)])
    before = cols < cut[rows]
    assert before.any() and (~before).any() and torch.equal(before, before_split(r))
    assert torch.equal(got[before], plain[before]) and float(got[~before].abs().max()) == 0.0
    swapped = measure_straddle(bench, Perturbation(), old).stats["kl_q_p"]
    assert float(swapped[before].abs().max()) == 0.0 and torch.equal(swapped[~before], plain[~before])
