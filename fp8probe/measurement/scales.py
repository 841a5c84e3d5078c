"""The static scales a calibration measured (`Calibration`: input amax per unit and per expert input, K/V amax per
layer) and the real-token part of a padded batch they are measured on (`without_padding`). Data only: the
quantizers (quantize.py, attention.py) read it and calibration.py records it, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.errors import FP8ProbeError
from ..core.numerics import STORAGE_DTYPE, compute_scale
from ..core.schemes import QuantSpec


@dataclass
class Calibration:
    """Static scales measured on the rollouts: input amax per module (and per expert input), KV amax per layer.

    `valid` ([B, T] bool, set by whoever runs the batches while recording) marks the batch's real tokens: the
    left padding of a batch is not calibration data (llm-compressor calibrates on each sequence alone)."""

    input_amax: dict[str, torch.Tensor]
    k_amax: dict[int, torch.Tensor]
    v_amax: dict[int, torch.Tensor]
    valid: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def input_scale(self, key: str, spec: QuantSpec) -> torch.Tensor:
        if key not in self.input_amax:
            raise FP8ProbeError(f"no calibrated input scale for {key}; calibrate on the rollouts first")
        # llm-compressor computes the static input scale in the checkpoint's dtype
        return compute_scale(self.input_amax[key].to(STORAGE_DTYPE), spec).float()


def without_padding(x: torch.Tensor, valid: torch.Tensor | None, kind: str = "tokens", rows=None) -> torch.Tensor:
    """The real-token part of x, given the batch's `valid` mask [B, T]: hidden states [B, T, ...] or flattened
    [B*T, ...] (`rows`: the flattened tokens x holds, for an expert's routed tokens), or K/V [B, H, T, D]
    ("kv": returned as [1, H, N, D]). Unchanged when there is no mask or x does not line up with it."""
    if valid is None:
        return x
    if kind == "kv":
        if x.ndim != 4 or (x.shape[0], x.shape[2]) != tuple(valid.shape):
            return x
        return x.transpose(1, 2)[valid].transpose(0, 1).unsqueeze(0)
    if rows is not None:
        return x[valid.reshape(-1)[rows]]
    if x.ndim >= 3 and tuple(x.shape[:2]) == tuple(valid.shape):
        return x[valid]
    if x.shape[0] == valid.numel():
        return x[valid.reshape(-1)]
    return x
