"""The mismatch metrics, declared once: name, the value that means "no mismatch", and which way is worse.

p is the reference (the BF16 trainer), q the candidate (the rollout engine). mismatch.py computes them
on the student's own rollouts; everything that reads them (the sweep's sanity row, recipe budgets and
scores, plots, the comparison with vLLM) goes through this table, so that a metric whose zero point is
not 0 (token_mult_prob_error is 1, top1_agree is 1 and lower is worse) is never read the wrong way.
This module imports nothing heavy: the CLI takes its choices from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import FP8ProbeError


@dataclass(frozen=True)
class Metric:
    name: str
    zero: float  # the value when q == p
    worse: str  # "higher" or "lower": the direction in which mismatch grows
    meaning: str
    low: float = 0.0  # the values it can take: an interval is never drawn outside them
    high: float = math.inf


TABLE = (
    Metric("kl_q_p", 0.0, "higher", "mean per-token KL(q || p) over the full vocabulary (primary)"),
    Metric("kl_p_q", 0.0, "higher", "mean per-token KL(p || q)"),
    Metric(
        "k1", 0.0, "higher", "sampled-token estimator of KL(p || q): mean of r = log p(y) - log q(y)", low=-math.inf
    ),
    Metric("k3", 0.0, "higher", "sampled-token estimator of KL(p || q): mean of exp(-r) - 1 + r"),
    Metric("abs_dlogp_mean", 0.0, "higher", "mean |log q(y) - log p(y)| on the sampled token"),
    Metric("abs_dlogp_max", 0.0, "higher", "max |log q(y) - log p(y)| on the sampled token"),
    Metric("token_mult_prob_error", 1.0, "higher", "mean exp(|log q(y) - log p(y)|) (NeMo-RL's name)", low=1.0),
    Metric("top1_agree", 1.0, "lower", "fraction of positions where argmax p == argmax q", high=1.0),
    Metric("kl_p50", 0.0, "higher", "median per-token KL(q || p)"),
    Metric("kl_p90", 0.0, "higher", "90th percentile of the per-token KL(q || p)"),
    Metric("kl_p99", 0.0, "higher", "99th percentile of the per-token KL(q || p)"),
    Metric("kl_p999", 0.0, "higher", "99.9th percentile of the per-token KL(q || p)"),
    Metric("kl_max", 0.0, "higher", "largest per-token KL(q || p)"),
    Metric("rms_dp", 0.0, "higher", "sqrt(mean((q(y) - p(y))^2)) on the sampled token"),
)
METRICS = [m.name for m in TABLE]
_BY_NAME = {m.name: m for m in TABLE}


def metric(name: str) -> Metric:
    if name not in _BY_NAME:
        raise FP8ProbeError(f"unknown metric {name!r}; supported: {', '.join(METRICS)}")
    return _BY_NAME[name]


def no_mismatch() -> dict[str, float]:
    """Every metric at its zero point: what a candidate identical to the reference measures."""
    return {m.name: m.zero for m in TABLE}


def excess(name: str, value: float) -> float:
    """How much mismatch `value` shows: its distance from the zero point in the worse direction.

    0 for no mismatch; what a budget bounds and what recipe scores add up (e.g. token_mult_prob_error 1.05 -> 0.05,
    top1_agree 0.93 -> 0.07).
    """
    m = metric(name)
    return value - m.zero if m.worse == "higher" else m.zero - value


# verl's own names of the mismatch, computed on the rollout engine's samples (measurement/verl.py): torch-free here,
# so that a budget on one of them (training/verl_runs.py) reads without loading torch
VERL_METRICS = (
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "rollout_corr/chi2_token",
    "rollout_corr/chi2_seq",
    "rollout_corr/training_ppl",
    "rollout_corr/rollout_ppl",
    "rollout_corr/log_ppl_diff",
    "rollout_corr/log_ppl_abs_diff",
    "rollout_corr/ppl_ratio",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr",
    "ppo_clip_share",
    "pg_clipfrac",
)
