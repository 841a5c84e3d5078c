"""Training-inference mismatch on one scale: metrics between reference and candidate logits on the same tokens.

p is the reference (the BF16 trainer), q the candidate (the rollout engine: FP8 weights, FP8 KV, ...).
Every metric is taken over the distributions that predict response tokens: the logits at position t-1
for a response token at t. The names are used everywhere (API keys, CSV columns):

    kl_q_p              mean over tokens of KL(q || p) over the full vocabulary   (primary)
    kl_p_q              mean of KL(p || q)
    k1, k3              sampled-token estimators of KL(p || q): the tokens were sampled from the BF16
                        student p, so with r = log p(y) - log q(y):  k1 = r,  k3 = exp(-r) - 1 + r
                        (Schulman's k1/k3; verl and slime log the same pair with the rollout engine as
                        the sampler)
    abs_dlogp_mean/max  |log q(y) - log p(y)| on the sampled token
    token_mult_prob_error  mean exp(|log q(y) - log p(y)|)   (NeMo-RL's name; 1.0 means no mismatch)
    top1_agree          fraction of positions where argmax p == argmax q
    kl_p50 .. kl_max    percentiles of the per-token KL(q || p) (as llama.cpp's KL-divergence mode
                        prints them), linear interpolation
    rms_dp              sqrt(mean((q(y) - p(y))^2)) on the sampled token

All log-softmaxes run in fp32 and in chunks of rows, so 49k-vocabulary logits for thousands of tokens
never sit in memory twice.
"""

from __future__ import annotations

import numpy as np
import torch

METRICS = [
    "kl_q_p", "kl_p_q", "k1", "k3", "abs_dlogp_mean", "abs_dlogp_max", "token_mult_prob_error",
    "top1_agree", "kl_p50", "kl_p90", "kl_p99", "kl_p999", "kl_max", "rms_dp",
]

CHUNK_ROWS = 256


def log_softmax32(logits: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
    x = logits.float()
    if softcap:
        x = torch.tanh(x / softcap) * softcap
    return torch.log_softmax(x, dim=-1)


def token_stats(ref_logp: torch.Tensor, cand_logp: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token quantities for rows of log-probabilities [M, V] and the sampled tokens [M]."""
    p, q = ref_logp.float(), cand_logp.float()
    pe, qe = p.exp(), q.exp()
    lp = p.gather(-1, tokens[:, None]).squeeze(-1)
    lq = q.gather(-1, tokens[:, None]).squeeze(-1)
    return {
        "kl_q_p": (qe * (q - p)).sum(-1).clamp_min(0),  # clamp: rounding can give -1e-9 for equal rows
        "kl_p_q": (pe * (p - q)).sum(-1).clamp_min(0),
        "logp_ref": lp,
        "logp_cand": lq,
        "top1": (p.argmax(-1) == q.argmax(-1)),
    }


def chunked_token_stats(ref_logp: torch.Tensor, cand_logits_fn, tokens: torch.Tensor,
                        chunk: int = CHUNK_ROWS, softcap: float | None = None) -> dict[str, torch.Tensor]:
    """token_stats over row chunks; cand_logits_fn(start, end) returns the candidate logits of those rows."""
    parts: dict[str, list[torch.Tensor]] = {}
    for s in range(0, tokens.shape[0], chunk):
        e = min(s + chunk, tokens.shape[0])
        st = token_stats(ref_logp[s:e], log_softmax32(cand_logits_fn(s, e), softcap), tokens[s:e])
        for k, v in st.items():
            parts.setdefault(k, []).append(v.cpu())
    return {k: torch.cat(v) for k, v in parts.items()}


def summarize(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """The metric dict (METRICS keys) from per-token quantities."""
    kl_qp = stats["kl_q_p"].double()
    r = (stats["logp_ref"] - stats["logp_cand"]).double()  # log p(y) - log q(y)
    adl = r.abs()
    dp = stats["logp_cand"].double().exp() - stats["logp_ref"].double().exp()
    pct = np.percentile(kl_qp.numpy(), [50, 90, 99, 99.9]) if kl_qp.numel() else [float("nan")] * 4
    out = {
        "kl_q_p": kl_qp.mean(),
        "kl_p_q": stats["kl_p_q"].double().mean(),
        "k1": r.mean(),
        "k3": (torch.expm1(-r) + r).mean(),
        "abs_dlogp_mean": adl.mean(),
        "abs_dlogp_max": adl.max() if adl.numel() else torch.tensor(float("nan")),
        "token_mult_prob_error": adl.exp().mean(),
        "top1_agree": stats["top1"].double().mean(),
        "kl_p50": pct[0], "kl_p90": pct[1], "kl_p99": pct[2], "kl_p999": pct[3],
        "kl_max": kl_qp.max() if kl_qp.numel() else torch.tensor(float("nan")),
        "rms_dp": dp.pow(2).mean().sqrt(),
    }
    return {k: float(out[k]) for k in METRICS}


def mismatch(ref_logits: torch.Tensor, cand_logits: torch.Tensor, tokens: torch.Tensor,
             chunk: int = CHUNK_ROWS) -> dict[str, float]:
    """All metrics between reference and candidate logits [M, V] that predict the sampled tokens [M]."""
    if ref_logits.shape != cand_logits.shape or ref_logits.shape[0] != tokens.shape[0]:
        raise ValueError(f"shape mismatch: ref {tuple(ref_logits.shape)}, cand {tuple(cand_logits.shape)}, "
                         f"tokens {tuple(tokens.shape)}")
    parts: dict[str, list[torch.Tensor]] = {}
    for s in range(0, tokens.shape[0], chunk):
        st = token_stats(log_softmax32(ref_logits[s:s + chunk]), log_softmax32(cand_logits[s:s + chunk]),
                         tokens[s:s + chunk])
        for k, v in st.items():
            parts.setdefault(k, []).append(v)
    return summarize({k: torch.cat(v) for k, v in parts.items()})


def response_positions(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of the logits that predict each response token: a token at t is predicted at t-1."""
    rows, cols = torch.nonzero(response_mask[:, 1:], as_tuple=True)
    return rows, cols


def response_logits(logits: torch.Tensor, input_ids: torch.Tensor, response_mask: torch.Tensor):
    """From full logits [N, T, V]: the predicting rows [M, V] and their sampled tokens [M]."""
    rows, cols = response_positions(response_mask)
    return logits[rows, cols], input_ids[rows, cols + 1]
