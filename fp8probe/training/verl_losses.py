"""verl's on-policy distillation losses, per token, as verl 0.9.1 computes them (the calibration objectives opd-k3,
opd-topk:K and opd-pg train with these; runs.OBJECTIVES).

verl's `distillation.distillation_loss` (verl/workers/config/distillation.py, `DistillationLossConfig`) picks one of:

    k3                supervised sampled-token reverse-KL estimator (`loss_mode=k3`, `use_policy_gradient=false`): on
                      each token the student sampled, exp(t - s) - (t - s) - 1 with s, t the student's and the
                      teacher's log-probability of it (verl/trainer/ppo/core_algos.py `kl_penalty_forward`, clamps
                      ±20 inside and ±10 outside), then clamped to ±`loss_max_clamp` (10) and token-mean aggregated
    forward_kl_topk   supervised forward KL over the teacher's top-K tokens (verl/trainer/distillation/fsdp/losses.py
                      `compute_forward_kl_topk`): Σ_k exp(t_k)(t_k - s_k) with both log-probs clamped below at
                      `log_prob_min_clamp` (-10), then clamped at 0 from below (the top-K masses do not sum to 1)
    k1 + policy grad  the per-token k1 estimate s - t (clamped ±10) as a negative advantage in a PPO-clip loss
                      (`use_policy_gradient=true`, `policy_loss_mode=vanilla`, clip 0.2, dual clip 3.0 on negative
                      advantages; verl/trainer/distillation/losses.py `distillation_loss`, core_algos.py
                      `compute_policy_loss_vanilla`), the advantage taken on the current forward and detached; the
                      ratio's denominator is what verl hands it as old_log_probs: here the rollout's own log-probs
                      (the fully-async policy's and bypass mode's), so the rollout mismatch enters the ratio

Every function takes [B, T] (or [B, T, V]) tensors and the response mask, and returns the scalar loss verl's
`token-mean` aggregation makes over the masked tokens; the network test compares each with verl's own functions
imported from the released wheel.
"""

from __future__ import annotations

import torch

from ..deploy.frameworks.verl import LOG_PROB_MIN_CLAMP, LOSS_MAX_CLAMP  # DistillationLossConfig's defaults

CLIP = 0.2  # DistillationLossConfig.clip_ratio (low = high)
CLIP_C = 3.0  # ActorConfig.clip_ratio_c: the dual clip of negative advantages


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's `agg_loss(..., loss_agg_mode="token-mean")` on one batch: the mean over the masked tokens."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp_min(1.0)


def k3_losses(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """verl's `kl_penalty(logprob=student, ref_logprob=teacher, "k3")`, then `loss_max_clamp`: per token [B, T]."""
    kl = (teacher_logp - student_logp).clamp(-20.0, 20.0)
    k3 = (kl.exp() - kl - 1).clamp(-10.0, 10.0)
    return k3.clamp(-LOSS_MAX_CLAMP, LOSS_MAX_CLAMP)


def k1_losses(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """verl's k1 estimate (student minus teacher log-prob of the sampled token), clamped at ±`loss_max_clamp`."""
    return (student_logp - teacher_logp).clamp(-LOSS_MAX_CLAMP, LOSS_MAX_CLAMP)


def topk_forward_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, k: int) -> torch.Tensor:
    """verl's forward_kl_topk per token [B, T] from both models' logits [B, T, V]: the teacher's top-k tokens, both
    log-probs clamped below at -10, Σ p_t (log p_t - log p_s), clamped at 0 from below."""
    t_logp = torch.log_softmax(teacher_logits.float(), -1)
    top_t, ids = t_logp.topk(k, dim=-1)
    top_s = torch.log_softmax(student_logits.float(), -1).gather(-1, ids)
    top_t, top_s = top_t.clamp_min(LOG_PROB_MIN_CLAMP), top_s.clamp_min(LOG_PROB_MIN_CLAMP)
    return (top_t.exp() * (top_t - top_s)).sum(-1).clamp_min(0.0)


def pg_loss(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """verl's policy-gradient OPD loss (k1 advantage, vanilla PPO clip 0.2 with dual clip 3.0, token-mean) and the
    share of tokens the clip cut (verl's pg_clipfrac)."""
    advantages = -k1_losses(student_logp, teacher_logp).detach()
    ratio = (student_logp - rollout_logp).clamp(-20.0, 20.0).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - CLIP, 1 + CLIP)
    worst = torch.maximum(unclipped, clipped)
    losses = torch.where(advantages < 0, torch.minimum(-advantages * CLIP_C, worst), worst)
    clipfrac = token_mean(torch.gt(clipped, unclipped).float(), mask)
    return token_mean(losses, mask), float(clipfrac)
