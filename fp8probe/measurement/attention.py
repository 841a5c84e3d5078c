"""The attention of chosen layers, seen or replaced, and the FP8 KV cache; restored exactly on exit.

    with quantize_kv(model, layers=[3], kv=KVCacheScheme()):   # FP8 KV cache of attention layer 3
        ...

The KV cache is quantized where vLLM stores it: keys after RoPE, values, as the attention function sees
them. Attention is routed through a registered transformers attention function that fake-quantizes K and
V of the chosen layers and then calls the model's own implementation (sdpa, eager, ...);
`attention_override` replaces the whole computation of chosen layers (the engine profiles' FP8 attention).
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch import nn

from ..core.errors import FP8ProbeError
from ..core.numerics import compute_scale, fake_quant
from ..core.schemes import KVCacheScheme
from ..model.structure import decoder_layers
from .scales import Calibration


def attention_modules(model: nn.Module) -> dict[int, nn.Module]:
    out = {}
    for i, layer in enumerate(decoder_layers(model)):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            raise FP8ProbeError(f"decoder layer {i} has no self_attn; KV-cache quantization is not supported here")
        out[i] = attn
    return out


_ROUTED: set[str] = set()  # implementation names wrapped right now (nesting is refused)


def _kv_attention_for(original):
    """Attention that fake-quantizes K/V of flagged layers, then calls the model's own implementation (or,
    for a layer flagged with a whole attention function, calls that instead)."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        whole = getattr(module, "_fp8probe_attention", None)
        if whole is not None:
            return whole(module, query, key, value, attention_mask, **kwargs)
        action = getattr(module, "_fp8probe_kv", None)
        if action is not None:
            key, value = action(key, value)
        fn = original or sys.modules[type(module).__module__].eager_attention_forward
        return fn(module, query, key, value, attention_mask, **kwargs)

    return attention


@contextlib.contextmanager
def route_attention(model: nn.Module, actions: dict[int, object], attr: str = "_fp8probe_kv"):
    """Send K/V of the layers in `actions` (layer index -> fn(k, v) -> (k, v)) through those functions; with
    attr="_fp8probe_attention", the actions are whole attention functions (module, q, k, v, mask, **kw).

    The model's attention modules look their function up by name in transformers' ALL_ATTENTION_FUNCTIONS
    on every call (the module's own eager function when the name is "eager" and nothing is registered).
    We register a wrapper under the model's implementation name for the duration and leave the config
    alone, so that everything else keyed on that name (mask construction above all) stays as it was.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as registry

    attn = attention_modules(model)
    impls = {m.config._attn_implementation for m in attn.values()}
    if any(i in _ROUTED for i in impls):
        raise FP8ProbeError("KV-cache hooks cannot be nested")
    local = registry._local_mapping
    saved = {i: local.get(i) for i in impls}
    try:
        for impl in impls:
            original = registry[impl] if impl in registry else None  # None: the module's own eager function
            _ROUTED.add(impl)
            local[impl] = _kv_attention_for(original)
        for i, m in attn.items():
            if i in actions:
                setattr(m, attr, actions[i])
        yield
    finally:
        for impl in impls:
            if saved[impl] is None:
                local.pop(impl, None)
            else:
                local[impl] = saved[impl]
            _ROUTED.discard(impl)
        for m in attn.values():
            if hasattr(m, attr):
                delattr(m, attr)


@contextlib.contextmanager
def observe_kv(model: nn.Module, fn, layers=None):
    """fn(layer, k, v) -> (k, v) sees (and may replace) each attention layer's K (after RoPE) and V, where
    vLLM stores them, for the duration; all layers when `layers` is None."""
    idx = list(attention_modules(model)) if layers is None else list(layers)
    with route_attention(model, {i: (lambda k, v, _i=i: fn(_i, k, v)) for i in idx}):
        yield


@contextlib.contextmanager
def attention_override(model: nn.Module, fn, layers=None):
    """fn(module, query, key, value, attention_mask, **kwargs) -> (output [B, T, H, D], weights) computes the
    attention of the given layers (all when None) instead of the model's implementation, for the duration."""
    idx = list(attention_modules(model)) if layers is None else list(layers)
    with route_attention(model, {i: fn for i in idx}, attr="_fp8probe_attention"):
        yield


def kv_scales(kv: KVCacheScheme, layer: int, calibration: Calibration | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The (k, v) scales the engine uses for one layer: 1.0 (online engines) or calibrated on the rollouts."""
    if kv.scale == "unit":
        return torch.ones(1), torch.ones(1)
    if calibration is None or layer not in calibration.k_amax:
        raise FP8ProbeError("a calibrated FP8 KV cache needs a Calibration from the rollouts")
    return compute_scale(calibration.k_amax[layer], kv.spec), compute_scale(calibration.v_amax[layer], kv.spec)


@contextlib.contextmanager
def quantize_kv(
    model: nn.Module,
    layers=None,
    kv: KVCacheScheme = KVCacheScheme(),
    calibration: Calibration | None = None,
    observer=None,
):
    """FP8 KV cache for the given attention layers (all when None).

    observer(k, k_fp8, v, v_fp8), when given, sees each layer's K/V before and after quantization.
    """
    spec = kv.spec
    idx = list(attention_modules(model)) if layers is None else list(layers)
    actions = {}
    for i in idx:
        ks, vs = kv_scales(kv, i, calibration)

        def act(k, v, ks=ks, vs=vs):
            kq, vq = fake_quant(k, spec, scale=ks.to(k.device)), fake_quant(v, spec, scale=vs.to(v.device))
            if observer is not None:
                observer(k, kq, v, vq)
            return kq, vq

        actions[i] = act
    with route_attention(model, actions):
        yield
