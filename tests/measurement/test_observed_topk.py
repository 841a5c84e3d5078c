"""kl_top20_own (measurement/prefix.py): what an engine's top-20 log-probs show of the mismatch on the candidate's own
samples, against the pooled-tail bound written out by hand from plain forwards."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_student

from fp8probe.measurement.perturbation import Perturbation
from fp8probe.measurement.perturbed import apply_perturbation
from fp8probe.measurement.prefix import PrefixShift, prompt_ids, sample_crn
from fp8probe.measurement.reference import Reference
from fp8probe.model.rollouts import Rollouts, make_rollouts


def _rows(model, own: Rollouts) -> torch.Tensor:
    """[M, V] float64 log-probs of the positions predicting each response token, one plain forward per sequence."""
    out = []
    for i in range(own.num_sequences):
        n = int(own.attention_mask[i].sum())
        with torch.no_grad():
            logits = model(input_ids=own.input_ids[i : i + 1, :n]).logits[0].double()
        cols = torch.nonzero(own.response_mask[i, :n]).squeeze(-1) - 1
        out.append(torch.log_softmax(logits[cols], -1))
    return torch.cat(out)


def test_the_top20_bound_by_hand_and_below_the_full_kl():
    """q's 20 most likely tokens exactly, the rest of q's mass against the rest of p's in one bin; never above the
    full KL(q || p) on the same samples. Seen failing with the tail bin dropped (the head alone)."""
    st = tiny_student("llama")
    r = make_rollouts(st, num_prompts=4, max_new_tokens=8, seed=0)
    ref = Reference(st, r)
    prompts = prompt_ids(st, r)
    p = Perturbation(noise=0.3, noise_units=tuple(st.unit_names), noise_seed=0)
    got = PrefixShift(st, ref, prompts, max_new_tokens=8, seed=0).measure(p)

    with apply_perturbation(st, p, many_forwards=True):
        cand = sample_crn(st, prompts, max_new_tokens=8, seed=0, batch_size=64)
        own = Rollouts.from_sequences(prompts, cand, st.tokenizer.pad_token_id)
        lq = _rows(st.model, own)
    lp = _rows(st.model, own)
    top, ids = lq.topk(20, dim=-1)
    head = (top.exp() * (top - lp.gather(-1, ids))).sum(-1)
    q_tail = 1 - top.exp().sum(-1)
    p_tail = 1 - lp.gather(-1, ids).exp().sum(-1)
    tail = torch.where(q_tail > 1e-6, q_tail * (q_tail.clamp_min(1e-300).log() - p_tail.clamp_min(1e-300).log()), 0)
    want = float((head + tail).clamp_min(0).mean())
    assert got["kl_top20_own"] == pytest.approx(want, rel=1e-3)
    assert 0 < got["kl_top20_own"] <= got["kl_q_p_own"] * (1 + 1e-6)
    assert lq.shape[1] > 20  # the tail is not empty: not a test of the full KL
