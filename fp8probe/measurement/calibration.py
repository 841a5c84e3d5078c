"""Static scales measured on the rollouts: input amax per unit (and per expert input), K/V amax per layer.

Only real tokens count: the left padding of a batch is not calibration data (llm-compressor calibrates
each sequence alone), so whoever runs the batches sets `Calibration.valid` while recording.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..core.numerics import amax
from ..core.schemes import QuantSpec
from ..model.structure import is_experts
from .attention import attention_modules, route_attention
from .quantize import expert_forward
from .scales import Calibration, without_padding

_PER_TENSOR = QuantSpec("tensor")  # static input scales and per-tensor KV scales reduce over everything


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
                mod.forward = expert_forward(mod, rec, (mod.gate_up_proj, mod.down_proj))

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


def calibrate(student, rollouts, names, kv_strategy: str = "tensor", batch_size: int = 8) -> Calibration:
    """Static input scales of the named units and K/V amax from one forward over the rollouts (no lm_head): the same
    numbers a Reference records in its pass, without keeping anything else."""
    model = student.model
    device = next(model.parameters()).device
    with torch.no_grad(), record_calibration(model, names, kv_strategy) as cal:
        for ids, am, _ in rollouts.batches(batch_size):
            cal.valid = am.to(device).bool()
            model.model(input_ids=ids.to(device), attention_mask=am.to(device), use_cache=False)
    return cal
