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

from ..core.metrics import METRICS  # the names, zero points and directions are declared in metrics.py
from ..core.metrics import metric
from ..core.stats import LEVEL, bootstrap_interval

CHUNK_ROWS = 128  # rows per chunk: measured fastest on a 2-core CPU (benchmarks/)


def log_softmax32(logits: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
    x = logits.float()
    if softcap:
        x = torch.tanh(x / softcap) * softcap
    return torch.log_softmax(x, dim=-1)


class RefRows:
    """Reference quantities that every candidate is compared with, per row (token): the log-probs [M, V] in fp32,
    or — storage "hidden" — the final norm's outputs [M, H] and the head that turns them into those log-probs,
    recomputed a chunk at a time when a chunk is taken (`rows(s, e).to(device)`): the same fp32 numbers for
    H x 4 bytes a token instead of V x 4 (a 262k vocabulary: 1 MiB a token). `top1` and `token_logp` (the
    sampled token's log p) are kept either way."""

    def __init__(self, logp, top1, tokens, token_logp=None, hidden=None, head=None):
        self._logp, self.top1, self.tokens, self.hidden, self.head = logp, top1, tokens, hidden, head
        self.token_logp = (
            token_logp if token_logp is not None else logp.gather(-1, tokens[:, None].to(logp.device)).squeeze(-1)
        )

    @classmethod
    def from_logp(cls, logp: torch.Tensor, tokens: torch.Tensor) -> "RefRows":
        logp = logp.float()
        return cls(logp, logp.argmax(-1), tokens)

    @property
    def logp(self) -> torch.Tensor:
        """[M, V] fp32 log p (recomputed from the hidden states, whole, when stored as those)."""
        if self._logp is None:
            return (
                torch.cat(
                    [
                        self.head(self.hidden[s : s + CHUNK_ROWS]).cpu()
                        for s in range(0, self.hidden.shape[0], CHUNK_ROWS)
                    ]
                )
                if len(self)
                else torch.zeros(0)
            )
        return self._logp

    @property
    def storage(self) -> str:
        return "logp" if self._logp is not None else "hidden"

    def rows(self, s: int, e: int) -> "RefRows":
        if self._logp is None:
            return RefRows(None, self.top1[s:e], self.tokens[s:e], self.token_logp[s:e], self.hidden[s:e], self.head)
        return RefRows(self._logp[s:e], self.top1[s:e], self.tokens[s:e], self.token_logp[s:e])

    def to(self, device) -> "RefRows":
        """On the candidate's device, log-probs materialised (the reference is kept on the host: 150k-vocabulary
        rows add up)."""
        logp = self.head(self.hidden.to(device)) if self._logp is None else self._logp.to(device)
        return RefRows(logp, self.top1.to(device), self.tokens.to(device), self.token_logp.to(device))

    def tensors(self) -> list[torch.Tensor]:
        """What the rows hold in memory."""
        kept = [self._logp] if self._logp is not None else [self.hidden]
        return kept + [self.top1, self.tokens, self.token_logp]

    def __len__(self) -> int:
        return self.tokens.shape[0]


def token_stats(ref: RefRows, cand_logp: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token quantities for reference rows and candidate log-probabilities [M, V].

    d = log q - log p is formed first and then reduced, so that KLs of 1e-8 survive fp32; the two
    reductions are fused multiply-adds (vecdot) with no [M, V] temporary.
    """
    q = cand_logp.float()
    d = q - ref.logp
    kl_q_p = torch.linalg.vecdot(q.exp(), d)
    kl_p_q = -torch.linalg.vecdot(ref.logp.exp(), d)
    tok = ref.tokens[:, None]
    return {
        "kl_q_p": kl_q_p.clamp_min(0),  # rounding can give -1e-12 for equal rows
        "kl_p_q": kl_p_q.clamp_min(0),
        "logp_ref": ref.token_logp.to(q.device),
        "logp_cand": q.gather(-1, tok).squeeze(-1),
        "top1": q.argmax(-1) == ref.top1,
    }


def chunked_token_stats(
    ref: RefRows, cand_logits_fn, chunk: int = CHUNK_ROWS, softcap: float | None = None
) -> dict[str, torch.Tensor]:
    """token_stats over row chunks; cand_logits_fn(start, end) returns the candidate logits of those rows."""
    parts: dict[str, list[torch.Tensor]] = {}
    for s in range(0, len(ref), chunk):
        e = min(s + chunk, len(ref))
        cand = log_softmax32(cand_logits_fn(s, e), softcap)
        st = token_stats(ref.rows(s, e).to(cand.device), cand)
        for k, v in st.items():
            parts.setdefault(k, []).append(v.cpu())
    return {k: torch.cat(v) for k, v in parts.items()}


SAMPLED_METRICS = ("k1", "k3", "abs_dlogp_mean", "abs_dlogp_max", "token_mult_prob_error", "rms_dp")


def sampled_token_metrics(logp_ref: torch.Tensor, logp_cand: torch.Tensor) -> dict[str, float]:
    """The metrics that need only the sampled tokens' log-probs (all a rollout engine's logprobs give, e.g.
    vLLM's prompt logprobs): k1, k3, |dlog p| mean and max, token_mult_prob_error, rms_dp."""
    stats = {"logp_ref": torch.as_tensor(logp_ref), "logp_cand": torch.as_tensor(logp_cand)}
    return _over_all(stats, SAMPLED_METRICS)


def summarize(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """The metric dict (METRICS keys) from per-token quantities: each metric's reduction (below) over every token."""
    return _over_all(stats, METRICS)


def _over_all(stats: dict[str, torch.Tensor], names) -> dict[str, float]:
    if not len(stats["logp_ref"]):  # no tokens: no figure
        return dict.fromkeys(names, float("nan"))
    return {k: metric_over(stats, k)[1](slice(None)) for k in names}


def _r(s):  # log p(y) - log q(y) on the sampled token
    return s["logp_ref"].double() - s["logp_cand"].double()


# metric -> (its per-token value from token_stats, how a set of tokens reduces to the metric): summarize over every
# token, the bootstrap over its resamples
_PER_TOKEN = {
    "kl_q_p": (lambda s: s["kl_q_p"].double(), "mean"),
    "kl_p_q": (lambda s: s["kl_p_q"].double(), "mean"),
    "k1": (_r, "mean"),
    "k3": (lambda s: torch.expm1(-_r(s)) + _r(s), "mean"),
    "abs_dlogp_mean": (lambda s: _r(s).abs(), "mean"),
    "abs_dlogp_max": (lambda s: _r(s).abs(), "max"),
    "token_mult_prob_error": (lambda s: _r(s).abs().exp(), "mean"),
    "top1_agree": (lambda s: s["top1"].double(), "mean"),
    "kl_p50": (lambda s: s["kl_q_p"].double(), 50),
    "kl_p90": (lambda s: s["kl_q_p"].double(), 90),
    "kl_p99": (lambda s: s["kl_q_p"].double(), 99),
    "kl_p999": (lambda s: s["kl_q_p"].double(), 99.9),
    "kl_max": (lambda s: s["kl_q_p"].double(), "max"),
    "rms_dp": (lambda s: (s["logp_cand"].double().exp() - s["logp_ref"].double().exp()).pow(2), "rms"),
}
MEAN_METRICS = tuple(k for k, (_, how) in _PER_TOKEN.items() if how == "mean")  # a mean over the tokens


def metric_over(stats: dict[str, torch.Tensor], name: str):
    """(per-token values, reduce(index) -> the metric over those tokens) for metric `name` from token_stats."""
    fn, how = _PER_TOKEN[name]
    v = fn(stats).numpy()
    if how == "mean":
        return v, lambda i: float(v[i].mean())
    if how == "max":
        return v, lambda i: float(v[i].max())
    if how == "rms":
        return v, lambda i: float(np.sqrt(v[i].mean()))
    return v, lambda i: float(np.percentile(v[i], how))


def metric_interval(
    stats: dict[str, torch.Tensor], groups: torch.Tensor, name: str, level: float | None = None, seed: int = 0
) -> tuple[float, float]:
    """The 90 % (or `level`) bootstrap interval of metric `name` over groups of tokens (core/stats.py; a token's
    prompt): how far the figure could move on another draw of as many prompts."""

    _, reduce = metric_over(stats, name)
    m = metric(name)
    return bootstrap_interval(groups.numpy(), reduce, level=level or LEVEL, seed=seed, bounds=(m.low, m.high))


def mismatch(
    ref_logits: torch.Tensor, cand_logits: torch.Tensor, tokens: torch.Tensor, chunk: int = CHUNK_ROWS
) -> dict[str, float]:
    """All metrics between reference and candidate logits [M, V] that predict the sampled tokens [M]."""
    if ref_logits.shape != cand_logits.shape or ref_logits.shape[0] != tokens.shape[0]:
        raise ValueError(
            f"shape mismatch: ref {tuple(ref_logits.shape)}, cand {tuple(cand_logits.shape)}, "
            f"tokens {tuple(tokens.shape)}"
        )
    ref = RefRows.from_logp(
        torch.cat([log_softmax32(ref_logits[s : s + chunk]) for s in range(0, len(tokens), chunk)]), tokens
    )
    return summarize(chunked_token_stats(ref, lambda s, e: cand_logits[s:e], chunk))


def response_positions(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of the logits that predict each response token: a token at t is predicted at t-1."""
    rows, cols = torch.nonzero(response_mask[:, 1:], as_tuple=True)
    return rows, cols


def response_logits(logits: torch.Tensor, input_ids: torch.Tensor, response_mask: torch.Tensor):
    """From full logits [N, T, V]: the predicting rows [M, V] and their sampled tokens [M]."""
    rows, cols = response_positions(response_mask)
    return logits[rows, cols], input_ids[rows, cols + 1]


TAIL_FLOOR = 1e-6  # a tail mass below this is the rounding of an fp32-normalized distribution, not mass


def kl_lower_bound_topk(top_ids: torch.Tensor, top_logq: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """A lower bound of KL(q‖p) per row when only q's K most likely tokens are known (an engine's top-K
    logprobs) and p in full: the K tokens exactly, the rest of the vocabulary pooled into one bin. Pooling
    never raises a KL (log-sum inequality), so the bound is <= the full KL, equal when the tail is empty.
    top_ids, top_logq: [M, K]; logp: [M, V] (fp32 log-probabilities of the reference)."""
    q = top_logq.double().exp()
    lp = logp.double().gather(-1, top_ids)
    head = (q * (top_logq.double() - lp)).sum(-1)
    q_tail = 1 - q.sum(-1)
    q_tail = torch.where(q_tail > TAIL_FLOOR, q_tail, torch.zeros_like(q_tail))  # below fp32 rounding: no tail
    p_tail = (1 - lp.exp().sum(-1)).clamp_min(1e-300)
    tail = torch.where(q_tail > 0, q_tail * (q_tail.clamp_min(1e-300).log() - p_tail.log()), torch.zeros_like(q_tail))
    return (head + tail).clamp_min(0)
