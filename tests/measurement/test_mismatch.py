"""Each metric against values worked out by hand (math module, not the code under test)."""

import math

import pytest
import torch

from fp8probe.measurement.mismatch import METRICS, mismatch, response_logits


def _logits(*probs):
    return torch.tensor([[math.log(x) for x in p] for p in probs], dtype=torch.float32)


def test_two_tokens_by_hand():
    # position 0: p = (0.4, 0.6),   q = (0.75, 0.25), sampled token 0 (top-1 differs)
    # position 1: p = (0.2, 0.8),   q = (0.4, 0.6),   sampled token 1
    ref = _logits((0.4, 0.6), (0.2, 0.8))
    cand = _logits((0.75, 0.25), (0.4, 0.6))
    tok = torch.tensor([0, 1])
    m = mismatch(ref, cand, tok)
    kl_qp = [
        0.75 * math.log(0.75 / 0.4) + 0.25 * math.log(0.25 / 0.6),  # 0.2525893
        0.4 * math.log(0.4 / 0.2) + 0.6 * math.log(0.6 / 0.8),
    ]  # 0.1046496
    kl_pq = [
        0.4 * math.log(0.4 / 0.75) + 0.6 * math.log(0.6 / 0.25),  # 0.2738378
        0.2 * math.log(0.2 / 0.4) + 0.8 * math.log(0.8 / 0.6),
    ]  # 0.0915198
    r = [math.log(0.4 / 0.75), math.log(0.8 / 0.6)]  # log p(y) - log q(y)
    assert m["kl_q_p"] == pytest.approx(sum(kl_qp) / 2, rel=1e-5)
    assert m["kl_q_p"] == pytest.approx(0.1786195, rel=1e-5)
    assert m["kl_p_q"] == pytest.approx(sum(kl_pq) / 2, rel=1e-5)
    assert m["k1"] == pytest.approx(sum(r) / 2, rel=1e-5)
    assert m["k3"] == pytest.approx(sum(math.exp(-x) - 1 + x for x in r) / 2, rel=1e-5)
    assert m["abs_dlogp_mean"] == pytest.approx((abs(r[0]) + abs(r[1])) / 2, rel=1e-5)
    assert m["abs_dlogp_max"] == pytest.approx(abs(r[0]), rel=1e-5)
    assert m["token_mult_prob_error"] == pytest.approx((0.75 / 0.4 + 0.8 / 0.6) / 2, rel=1e-5)
    assert m["top1_agree"] == 0.5  # pos 0: argmax p = 1, argmax q = 0; pos 1: both 1
    assert m["rms_dp"] == pytest.approx(math.sqrt((0.35**2 + 0.2**2) / 2), rel=1e-5)
    assert m["kl_max"] == pytest.approx(max(kl_qp), rel=1e-5)
    assert m["kl_p50"] == pytest.approx(sum(kl_qp) / 2, rel=1e-5)  # median of two = their mean
    assert m["kl_p90"] == pytest.approx(kl_qp[1] + 0.9 * (kl_qp[0] - kl_qp[1]), rel=1e-5)
    assert list(m) == METRICS


def test_identical_is_zero_and_direction():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(50, 1000, generator=g) * 3
    tok = torch.randint(0, 1000, (50,), generator=g)
    m = mismatch(ref, ref.clone(), tok)
    assert m["kl_q_p"] == 0 and m["kl_p_q"] == 0 and m["k1"] == 0 and m["k3"] == 0
    assert m["token_mult_prob_error"] == 1 and m["top1_agree"] == 1 and m["rms_dp"] == 0
    cand = ref + 0.3 * torch.randn(50, 1000, generator=g)
    m = mismatch(ref, cand, tok, chunk=7)  # chunking gives the same answer
    m2 = mismatch(ref, cand, tok, chunk=1000)
    for k in METRICS:
        assert m[k] == pytest.approx(m2[k], rel=1e-6, abs=1e-12)
    assert m["kl_q_p"] > 0 and m["kl_p_q"] > 0 and 0 <= m["top1_agree"] <= 1


def test_response_logits_shift():
    logits = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]])
    resp = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]])
    rows, toks = response_logits(logits, ids, resp)
    # response tokens: (0,2)=7 predicted at (0,1); (0,3)=8 at (0,2); (1,1)=10 at (1,0); (1,2)=11 at (1,1)
    assert toks.tolist() == [7, 8, 10, 11]
    assert torch.equal(rows, torch.stack([logits[0, 1], logits[0, 2], logits[1, 0], logits[1, 1]]))


def test_every_metric_over_a_subset_of_tokens_is_the_metric_of_those_tokens_alone():
    """metric_over (what the bootstrap resamples, and what summarize reduces over every token) on a subset of token
    indices gives the metric `mismatch` computes from those rows alone; no tokens: every figure NaN."""
    from fp8probe.measurement.mismatch import (
        RefRows,
        log_softmax32,
        metric_over,
        sampled_token_metrics,
        summarize,
        token_stats,
    )

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(50, 40, generator=g)
    cand = ref + 0.3 * torch.randn(50, 40, generator=g)
    toks = torch.randint(0, 40, (50,), generator=g)
    stats = token_stats(RefRows.from_logp(log_softmax32(ref), toks), log_softmax32(cand))
    subset = torch.tensor([3, 7, 7, 11, 20, 21, 22, 40, 49])  # a resample: repeats count twice
    alone = mismatch(ref[subset], cand[subset], toks[subset])
    for name in METRICS:
        _, reduce = metric_over(stats, name)
        assert reduce(subset.numpy()) == pytest.approx(alone[name], rel=1e-6, abs=1e-12), name
    empty = {k: v[:0] for k, v in stats.items()}
    assert all(math.isnan(v) for v in summarize(empty).values()) and list(summarize(empty)) == METRICS
    assert all(math.isnan(v) for v in sampled_token_metrics(torch.zeros(0), torch.zeros(0)).values())


def test_reference_labels_each_row_with_its_rollout_and_prompt():
    """Reference.sequence counts each rollout's response tokens; Reference.prompt groups rollouts of one prompt."""
    from conftest import tiny_student

    from fp8probe.measurement.reference import Reference
    from fp8probe.model.rollouts import make_rollouts

    st = tiny_student("llama")
    r = make_rollouts(st, num_prompts=3, samples_per_prompt=2, max_new_tokens=5, batch_size=4)
    ref = Reference(st, r, batch_size=4)
    counts = torch.bincount(ref.sequence, minlength=r.num_sequences)
    assert counts.tolist() == r.response_mask[:, 1:].sum(1).tolist()
    assert r.prompt_groups().tolist() == [0, 0, 1, 1, 2, 2]
    assert ref.prompt.tolist() == [s // 2 for s in ref.sequence.tolist()]
