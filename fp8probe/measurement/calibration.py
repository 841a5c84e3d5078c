"""Static scales measured on the rollouts: input amax per unit (and per expert input), K/V amax per layer.

Only real tokens count: the left padding of a batch is not calibration data (llm-compressor calibrates
each sequence alone), so whoever runs the batches sets `Calibration.valid` while recording.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from ..core.errors import FP8ProbeError
from ..core.numerics import STORAGE_DTYPE, amax, compute_scale
from ..core.schemes import QuantSpec
from ..model.structure import is_experts
from .attention import attention_modules, route_attention
from .quantize import expert_forward

_PER_TENSOR = QuantSpec("tensor")  # static input scales and per-tensor KV scales reduce over everything


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


@contextlib.contextmanager
def record_calibration(model: nn.Module, names, kv_strategy: str = "tensor"):
    """Record input amax of the named units and K/V amax of every attention layer; yields the Calibration."""
    cal = Calibration({}, {}, {})
    handles = []

    def upd(d, key, x, spec=_PER_TENSOR, kind="tokens", rows=None):
        x = without_padding(x.detach(), cal.valid, kind, rows)
        if x.numel() == 0:
            return
        val = amax(x, spec).float().cpu()
        d[key] = val if key not in d else torch.maximum(d[key], val)

    kv_spec = QuantSpec(kv_strategy)

    restore = []
    try:
        for n in names:
            mod = model.get_submodule(n)
            if isinstance(mod, nn.Linear):
                handles.append(mod.register_forward_pre_hook(lambda m, a, _n=n: upd(cal.input_amax, _n, a[0])))
            elif is_experts(mod):
                def rec(x, which, rows=None, _n=n):
                    upd(cal.input_amax, f"{_n}:{which}", x, rows=rows)
                    return x

                restore.append(mod)
                mod.forward = expert_forward(mod, rec,
                                              (mod.gate_up_proj, mod.down_proj))

        def kv_rec(i):
            def act(k, v):
                upd(cal.k_amax, i, k, kv_spec, "kv")
                upd(cal.v_amax, i, v, kv_spec, "kv")
                return k, v
            return act

        with route_attention(model, {i: kv_rec(i) for i in attention_modules(model)}):
            yield cal
    finally:
        cal.valid = None
        for h in handles:
            h.remove()
        for m in restore:
            del m.forward
