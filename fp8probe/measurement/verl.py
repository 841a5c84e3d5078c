"""The mismatch under verl's names, computed as verl computes them, on the rollout engine's own samples.

verl logs the training–inference mismatch of every step from two log-probs of the tokens the rollout engine sampled:
the engine's own (`rollout_log_probs`, here the candidate q: FP8 weights, an FP8 KV cache, stale weights) and the
trainer's recomputation (`old_log_probs`, here the reference p). fp8probe's `kl_q_p` and `k3` score the reference's
samples; these score the candidate's, in verl's directions (verl 0.9.1: verl/trainer/ppo/rollout_corr_helper.py
`compute_offpolicy_metrics`, verl/utils/debug/metrics.py `calculate_debug_metrics`):

    rollout_corr/kl                       mean over tokens of log q - log p: the k1 estimate of KL(q || p)
    rollout_corr/k3_kl                    mean of r - log r - 1, r = p / q: the k3 estimate of KL(q || p)
    rollout_corr/chi2_token               mean of r^2 - 1 (log r clamped to +-20): chi^2(p || q) per token
    rollout_corr/chi2_seq                 mean over sequences of (prod r)^2 - 1 (the sum of log r clamped to +-20)
    rollout_corr/training_ppl, rollout_ppl  mean over sequences of exp(-mean log p), exp(-mean log q)
    rollout_corr/log_ppl_diff, log_ppl_abs_diff, ppl_ratio  per sequence mean log q - mean log p; its |.|; exp(.)
    training/rollout_probs_diff_mean|max|std  |p - q| of the sampled tokens' probabilities (std unbiased)
    training/rollout_actor_probs_pearson_corr  Pearson correlation of those probabilities
    ppo_clip_share                        share of tokens whose ratio p / q lies outside [1 - 0.2, 1 + 0.2]: what a
                                          PPO clip of 0.2 clips at the first optimisation step when the rollout's
                                          log-probs are the ratio's denominator (verl's bypass and fully-async modes)
    pg_clipfrac                           what verl logs as actor/pg_clipfrac there: the share of tokens whose clipped
                                          term binds, on the side the advantage sets (above 1 + 0.2 for a positive one,
                                          below 1 - 0.2 for a negative one), MODELLED with advantages of either sign
                                          alike and independent of the ratio: (share above + share below) / 2, half
                                          of ppo_clip_share

Every mean over tokens is over all response tokens of the batch at once (verl's masked_mean), every mean over
sequences over the sequences.
"""

from __future__ import annotations

import torch

from ..core.metrics import VERL_METRICS  # noqa: F401  (re-exported: the names this module computes)

SAFETY_BOUND = 20.0  # verl's clamp of log-ratios before exp (rollout_corr_helper.SAFETY_BOUND)
PPO_CLIP = 0.2


def verl_metrics(logp_rollout, logp_train, lengths, clip: float = PPO_CLIP) -> dict[str, float]:
    """VERL_METRICS (module docstring) of the sampled tokens' log-probs under the rollout engine (`logp_rollout`, q)
    and the trainer (`logp_train`, p), flat in sequence order; `lengths`: each sequence's number of response tokens
    (they sum to the tokens' count)."""
    q = torch.as_tensor(logp_rollout).double()
    p = torch.as_tensor(logp_train).double()
    n = torch.as_tensor(lengths, dtype=torch.int64)
    if int(n.sum()) != q.numel() or q.shape != p.shape or not q.numel():
        raise ValueError("verl_metrics: one log-prob per response token of each sequence, for both policies")
    seq = torch.repeat_interleave(torch.arange(len(n)), n)
    keep = n > 0

    def per_seq_mean(x):
        return torch.zeros(len(n), dtype=x.dtype).index_add_(0, seq, x)[keep] / n[keep]

    log_ratio = p - q
    rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    seq_sum = torch.zeros(len(n), dtype=q.dtype).index_add_(0, seq, log_ratio)[keep]
    mean_p, mean_q = per_seq_mean(p), per_seq_mean(q)
    log_ppl_diff = mean_q - mean_p
    dp = (p.exp() - q.exp()).abs()
    probs = torch.stack([p.exp(), q.exp()])
    return {
        "rollout_corr/kl": float((q - p).mean()),
        "rollout_corr/k3_kl": float((log_ratio.exp() - log_ratio - 1).mean()),
        "rollout_corr/chi2_token": float(rho.square().mean() - 1),
        "rollout_corr/chi2_seq": float((2 * seq_sum.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp().mean() - 1),
        "rollout_corr/training_ppl": float((-mean_p).exp().mean()),
        "rollout_corr/rollout_ppl": float((-mean_q).exp().mean()),
        "rollout_corr/log_ppl_diff": float(log_ppl_diff.mean()),
        "rollout_corr/log_ppl_abs_diff": float(log_ppl_diff.abs().mean()),
        "rollout_corr/ppl_ratio": float(log_ppl_diff.exp().mean()),
        "training/rollout_probs_diff_mean": float(dp.mean()),
        "training/rollout_probs_diff_max": float(dp.max()),
        "training/rollout_probs_diff_std": float(dp.std()) if dp.numel() > 1 else float("nan"),
        "training/rollout_actor_probs_pearson_corr": float(torch.corrcoef(probs)[0, 1]),
        "ppo_clip_share": float(((log_ratio.exp() - 1).abs() > clip).double().mean()),
        "pg_clipfrac": 0.5 * float(((log_ratio.exp() - 1).abs() > clip).double().mean()),
    }
