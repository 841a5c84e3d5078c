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
from .scales import Calibration, SequenceAmax, without_padding

_PER_TENSOR = QuantSpec("tensor")  # static input scales and per-tensor KV scales reduce over everything


@contextlib.contextmanager
def record_calibration(model: nn.Module, names, kv_strategy: str = "tensor", per_sequence_of=None):
    """Record input amax of the named units and K/V amax of every attention layer; yields the Calibration. With
    `per_sequence_of` (the Rollouts being run), also each sequence's own amax (`Calibration.per_sequence`): whoever
    runs the batches sets `Calibration.sequences`, the batch's sequence indices, beside `valid`."""
    cal = Calibration({}, {}, {})
    num_sequences = per_sequence_of.num_sequences if per_sequence_of is not None else 0
    per = {"input": {}, "k": {}, "v": {}} if num_sequences else None
    aligned = [True]  # False once a batch's x did not line up with its mask: nothing per sequence is kept
    handles = []

    def upd(which, key, x, spec=_PER_TENSOR, kind="tokens", rows=None):
        x, val = x.detach(), None
        if per is not None and aligned[0]:
            batch = _per_sequence(x, cal, spec, kind, rows)
            aligned[0] = batch is not None
            if batch is not None:  # the batch's amax is their max: the same number, to the bit
                got, seen = batch
                if not bool(seen.any()):
                    return
                _keep(per[which], key, got[seen], cal.sequences[seen], num_sequences)
                val = got[seen].amax(0)
        if val is None:
            x = without_padding(x, cal.valid, kind, rows)
            if x.numel() == 0:
                return
            val = amax(x, spec).float().cpu()
        d = {"input": cal.input_amax, "k": cal.k_amax, "v": cal.v_amax}[which]
        d[key] = val if key not in d else torch.maximum(d[key], val)

    kv_spec = QuantSpec(kv_strategy)

    restore = []
    try:
        for n in names:
            mod = model.get_submodule(n)
            if isinstance(mod, nn.Linear):
                handles.append(mod.register_forward_pre_hook(lambda m, a, _n=n: upd("input", _n, a[0])))
            elif is_experts(mod):

                def rec(x, which, rows=None, _n=n):
                    upd("input", f"{_n}:{which}", x, rows=rows)
                    return x

                restore.append(mod)
                mod.forward = expert_forward(mod, rec, (mod.gate_up_proj, mod.down_proj))

        def kv_rec(i):
            def act(k, v):
                upd("k", i, k, kv_spec, "kv")
                upd("v", i, v, kv_spec, "kv")
                return k, v

            return act

        with route_attention(model, {i: kv_rec(i) for i in attention_modules(model)}):
            yield cal
        if per is not None and aligned[0]:
            cal.per_sequence = SequenceAmax(per["input"], per["k"], per["v"], kv_strategy, per_sequence_of.digest())
    finally:
        cal.valid = cal.sequences = None
        for h in handles:
            h.remove()
        for m in restore:
            del m.forward


def _per_sequence(x, cal: Calibration, spec, kind, rows):
    """(each sequence of the batch's amax of x over its real tokens [B, *amax shape], which sequences have any) as
    without_padding takes the real tokens for the whole batch; None where x does not line up with the batch's mask
    (nothing per sequence can be told then). Per tensor, one reduction over the batch (max(x, -x) per token, the
    padding masked); otherwise (per head, an expert's routed tokens) sequence by sequence."""
    valid = cal.valid
    if valid is None or cal.sequences is None:
        return None
    b_count, t = valid.shape
    if rows is None and spec.strategy == _PER_TENSOR.strategy:
        if kind == "kv" and x.ndim == 4 and (x.shape[0], x.shape[2]) == tuple(valid.shape):
            top = torch.maximum(x.amax(dim=(1, 3)), -x.amin(dim=(1, 3)))  # [B, H, T, D] -> [B, T]
        elif kind != "kv" and x.ndim >= 3 and tuple(x.shape[:2]) == tuple(valid.shape):
            top = torch.maximum(x.flatten(2).amax(-1), -x.flatten(2).amin(-1))
        elif kind != "kv" and x.shape[0] == valid.numel():
            top = torch.maximum(x.flatten(1).amax(-1), -x.flatten(1).amin(-1)).reshape(b_count, t)
        else:
            return None
        return top.masked_fill(~valid, 0).amax(1).float().cpu().reshape(b_count, 1), valid.any(1).cpu()
    got, seen = [], []
    for b in range(b_count):
        vb = valid[b : b + 1]
        if rows is not None:  # an expert's routed tokens: the flattened positions `rows` of the batch
            m = rows // t == b
            xb = without_padding(x[m], vb, kind, rows[m] - b * t)
        elif kind == "kv" and x.ndim == 4 and (x.shape[0], x.shape[2]) == tuple(valid.shape):
            xb = without_padding(x[b : b + 1], vb, "kv")
        elif kind != "kv" and x.ndim >= 3 and tuple(x.shape[:2]) == tuple(valid.shape):
            xb = without_padding(x[b : b + 1], vb)
        else:
            return None
        seen.append(xb.numel() > 0)
        got.append(amax(xb, spec).float().cpu() if seen[-1] else None)
    shape = next((g.shape for g in got if g is not None), (1,))
    filled = [g if g is not None else torch.zeros(shape) for g in got]
    return torch.stack(filled), torch.tensor(seen)


def _keep(store: dict, key, got, sequences, n: int) -> None:
    """These sequences' amax (got [S, ...]) into store[key] ([n, ...], zeros where a sequence has none)."""
    if key not in store:
        store[key] = torch.zeros((n, *got.shape[1:]))
    idx = sequences.to(torch.int64)
    store[key][idx] = torch.maximum(store[key][idx], got)


def calibrate(
    student, rollouts, names, kv_strategy: str = "tensor", batch_size: int = 8, per_sequence: bool = False
) -> Calibration:
    """Static input scales of the named units and K/V amax from one forward over the rollouts (no lm_head): the same
    numbers a Reference records in its pass, without keeping anything else. `per_sequence`: each sequence's too
    (`Calibration.per_sequence`, a SequenceAmax of these rollouts), what a sweep keeps for the recipe."""
    model = student.model
    device = next(model.parameters()).device
    with torch.no_grad(), record_calibration(model, names, kv_strategy, rollouts if per_sequence else None) as cal:
        start = 0
        for ids, am, _ in rollouts.batches(batch_size):
            cal.valid = am.to(device).bool()
            cal.sequences = torch.arange(start, start + len(ids))
            start += len(ids)
            model.model(input_ids=ids.to(device), attention_mask=am.to(device), use_cache=False)
    return cal
