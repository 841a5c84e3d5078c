"""verl's mismatch metrics (measurement/verl.py) against verl's own functions, lifted from the released wheel.

The embedded student's whole-model FP8 candidate writes its own continuations (the prefix shift's common random
numbers); both policies' log-probs of those tokens come from plain full forwards here (not fp8probe's reference
machinery), laid out as verl's batches are ([B, T] with a response mask), and go through verl 0.9.1's
`compute_offpolicy_metrics` (verl/trainer/ppo/rollout_corr_helper.py) and `calculate_debug_metrics`' pieces
(verl/utils/debug/metrics.py). fp8probe's figures must equal them within 1 %.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch
from conftest import lift

from fp8probe.core.schemes import Scheme
from fp8probe.measurement.perturbation import Perturbation
from fp8probe.measurement.perturbed import apply_perturbation
from fp8probe.measurement.prefix import PrefixShift, prompt_ids, sample_crn
from fp8probe.measurement.reference import Reference
from fp8probe.model.rollouts import Rollouts, make_rollouts


def _verl(root) -> dict:
    functional = lift(root, "verl/utils/torch_functional.py", ("masked_sum", "masked_mean"), {"torch": torch})
    verl_f = type("verl_F", (), {"masked_sum": functional["masked_sum"], "masked_mean": functional["masked_mean"]})
    helper = lift(
        root,
        "verl/trainer/ppo/rollout_corr_helper.py",
        ("SAFETY_BOUND", "compute_offpolicy_metrics"),
        {"torch": torch, "verl_F": verl_f, "Optional": Optional, "Any": Any},
    )
    debug = lift(
        root,
        "verl/utils/debug/metrics.py",
        ("pearson_correlation_coefficient", "calculate_log_prob_diff"),
        {"torch": torch},
    )
    return {**helper, **debug}


def _token_logp(model, own: Rollouts) -> torch.Tensor:
    """[B, T] log-prob of each token under `model` (position t scored from t - 1; 0 at t = 0), one plain forward."""
    with torch.no_grad():
        logits = model(input_ids=own.input_ids, attention_mask=own.attention_mask).logits.double()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, own.input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logp, (1, 0))


@pytest.mark.slow
@pytest.mark.network
def test_verl_metrics_equal_verls_own_functions_on_the_embedded_student(released, embedded):
    verl = _verl(released["verl"])
    st = embedded
    r = make_rollouts(st, num_prompts=6, max_new_tokens=24, seed=0)
    ref = Reference(st, r)
    prompts = prompt_ids(st, r)
    fp8 = Perturbation(tuple(st.unit_names), Scheme.from_name("FP8_DYNAMIC"))
    got = PrefixShift(st, ref, prompts, max_new_tokens=24, seed=0).measure(fp8)

    # the candidate's own continuations, sampled again with the same common random numbers, scored by both
    with apply_perturbation(st, fp8, ref.calibration, many_forwards=True):
        cand = sample_crn(st, prompts, max_new_tokens=24, seed=0, batch_size=64)
        own = Rollouts.from_sequences(prompts, cand, st.tokenizer.pad_token_id)
        rollout_logp = _token_logp(st.model, own)  # q: the engine's log-probs (verl's rollout_log_probs)
    train_logp = _token_logp(st.model, own)  # p: the trainer's recomputation (verl's old_log_probs)
    mask = own.response_mask.bool()

    want = verl["compute_offpolicy_metrics"](train_logp, rollout_logp, mask)
    for key in ("kl", "k3_kl", "chi2_token", "chi2_seq", "training_ppl", "rollout_ppl", "log_ppl_diff", "ppl_ratio"):
        assert got[f"rollout_corr/{key}"] == pytest.approx(want[key], rel=0.01), key
    diff = verl["calculate_log_prob_diff"](train_logp.exp(), rollout_logp.exp(), mask)
    assert got["training/rollout_probs_diff_mean"] == pytest.approx(float(diff.mean()), rel=0.01)
    assert got["training/rollout_probs_diff_max"] == pytest.approx(float(diff.max()), rel=0.01)
    assert got["training/rollout_probs_diff_std"] == pytest.approx(float(diff.std()), rel=0.01)
    corr = verl["pearson_correlation_coefficient"](train_logp.exp(), rollout_logp.exp(), mask)
    assert got["training/rollout_actor_probs_pearson_corr"] == pytest.approx(corr, rel=0.01)
    assert want["kl"] > 0 and got["diverged"] > 0  # FP8 moves the text and the log-probs: not a test of zeros
