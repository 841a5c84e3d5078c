"""Other weights for the duration, restored exactly on exit: seeded noise on chosen units, another checkpoint.

with add_noise(model, ["model.layers.0.mlp.down_proj"], rel_std=1e-3): ...
with swap_weights(model, state): ...          # stale weights: a checkpoint of K updates ago
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..core.errors import FP8ProbeError
from .quantize import unit_weights


@contextlib.contextmanager
def add_noise(model: nn.Module, names, rel_std: float, seed: int = 0):
    """Gaussian noise of rel_std x each weight tensor's own std on the named units (Linears or experts),
    seeded: the same names, σ and seed give the same noise, drawn in the order of `names`."""
    g = torch.Generator().manual_seed(seed)
    restore = []
    try:
        for n in names:
            for w in unit_weights(model, n):
                noise = torch.randn(w.shape, generator=g).to(w) * (w.float().std() * rel_std).to(w.dtype)
                restore.append((w, w.data))
                w.data = w.data + noise
        yield
    finally:
        for w, d in reversed(restore):
            w.data = d


@contextlib.contextmanager
def swap_weights(model: nn.Module, state: dict[str, torch.Tensor]):
    """Every parameter replaced by the same-named tensor of `state` (another checkpoint of this model: stale
    weights), restored on exit. Names and shapes must match exactly."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(state))
    bad = [n for n in params if n in state and tuple(state[n].shape) != tuple(params[n].shape)]
    if missing or bad:
        what = f"lacks {missing[0]}" if missing else f"has {bad[0]} of shape {tuple(state[bad[0]].shape)}"
        raise FP8ProbeError(f"the other checkpoint {what}: it is not a checkpoint of this model")
    restore = []
    try:
        for n, p in params.items():
            restore.append((p, p.data))
            p.data = state[n].to(device=p.device, dtype=p.dtype)
        yield
    finally:
        for p, d in reversed(restore):
            p.data = d
