"""A response that straddles a weight sync (verl's `partial_rollout`, and every resumed request of its v1 trainer): its
tokens before the sync sampled by the older weights, the rest by the newer ones after a fresh prefill.

verl 0.9.1 does not finish such a response on the old KV cache: at a sync, `update_weights`
(verl/checkpoint_engine/base.py) aborts the requests in flight, frees the KV cache, syncs the weights, resets the
prefix cache and resumes; the rollout server then sends each aborted request again as prompt + the tokens generated
so far (verl/workers/rollout/llm_server.py: `generate`'s retry loop, for fully-async with partial_rollout and always
for the v1 trainer), so the new weights re-prefill the whole sequence. What differs from the trainer's weights is
which weights sampled each token: the log-probs the rollout recorded before the sync are the older state's, those
after it the newer state's, each from a plain forward of its own weights. On the student's rollouts the sync is put
halfway through each response; each token's figure is its own state's plain forward against the reference, in the
reference's row order, so the figure is a Measured like any other (its intervals, its mixture over lags).
"""

from __future__ import annotations

import torch

from .measure import Measured
from .mismatch import response_positions, summarize


def split_at(prompt_len: int, response_len: int) -> int:
    """The first position the new weights predict from: the last prefix token, halfway through the response."""
    return max(prompt_len + response_len // 2 - 1, 1)


def before_split(rollouts) -> torch.Tensor:
    """Per response token, in the reference's row order: True where the older weights sampled it (its predicting
    position before split_at)."""
    rows, cols = response_positions(rollouts.response_mask)
    lengths = rollouts.attention_mask.sum(1)
    prompt = lengths - rollouts.response_mask.sum(1)
    cut = torch.tensor([split_at(int(p), int(n - p)) for p, n in zip(prompt, lengths)])
    return cols < cut[rows]


def straddled(rollouts, older: Measured, newer: Measured) -> Measured:
    """The straddling response's figure from the two states' plain figures on the same rollouts (each a measure() of
    its perturbation): each token's own state's, split as before_split."""
    before = before_split(rollouts)
    stats = {k: torch.where(before.to(v.device), v, newer.stats[k]) for k, v in older.stats.items()}
    return Measured(summarize(stats), stats, older.prompt)
