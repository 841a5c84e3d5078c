"""Context managers that perturb a model and restore it exactly on exit, also after an exception.

    with quantize_units(model, ["model.layers.3.mlp.down_proj"], "FP8_DYNAMIC"):
        logits = model(input_ids).logits          # that one Linear in FP8, the rest untouched
    with quantize_kv(model, layers=[3], kv=KVCacheScheme()):   # FP8 KV cache of attention layer 3
        ...
    with add_noise(model, ["model.layers.0.mlp.down_proj"], rel_std=1e-3): ...

Weights are quantized as llm-compressor stores them (from BF16 weights, BF16 scales; see fp8.py) and
dequantized exactly (codes x scales in fp32), which is what vLLM multiplies with. Only the perturbed
weights get a new tensor; the original is kept by reference and put back. Input activations are
quantized by a forward pre-hook, per token (FP8_DYNAMIC), per group of 128 (FP8_BLOCK) or with a
calibrated per-tensor scale (FP8). For the per-tensor FP8 scheme vLLM fuses q/k/v and gate/up into one
GEMM with the largest of their scales, so a fused group quantized as a whole is requantized with that
maximum, as vLLM's loader does.

The KV cache is quantized where vLLM stores it: keys after RoPE, values, as the attention function sees
them. We route attention through a registered transformers attention function that fake-quantizes K and
V of the chosen layers and then calls the model's own implementation (sdpa, eager, ...).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

import torch
from torch import nn

from ..core.errors import FP8ProbeError
from ..core.numerics import amax, compute_scale, dequantize, fake_quant, quantize, quantize_weight
from ..core.schemes import KVCacheScheme, QuantSpec, Scheme
from ..model.student import decoder_layers, fused_groups, is_experts, list_units

STORAGE_DTYPE = torch.bfloat16  # the checkpoint's dtype: scales and codes are computed in it
_PER_TENSOR = QuantSpec("tensor")  # static input scales and per-tensor KV scales reduce over everything


# ---------------------------------------------------------------------------------------------------
# weights and input activations


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


def checkpoint_codes(model: nn.Module, names: list[str], scheme: Scheme) -> dict[str, tuple]:
    """(FP8 codes, fp32 scale) per named Linear, as vLLM holds them; per-tensor scales shared over fused groups."""
    spec = scheme.weight
    out = {n: _swap(quantize_weight(model.get_submodule(n).weight, scheme, STORAGE_DTYPE)) for n in names}
    if spec.strategy == "tensor":
        for ns in ([u.name for u in us] for us in fused_groups(list_units(model)).values()):
            if len(ns) > 1 and set(ns) <= set(out):
                # vLLM: one GEMM for the fused group, weights requantized with the largest scale
                smax = torch.stack([out[n][1] for n in ns]).max().reshape(1)
                for n in ns:
                    w = dequantize(*out[n], spec)
                    out[n] = (quantize(w, smax, spec), smax)
    return out


def simulated_weights(model: nn.Module, names, scheme: "str | Scheme" = "FP8_DYNAMIC") -> dict[str, torch.Tensor]:
    """The weights vLLM multiplies with for the named Linear units (codes x scales, exact in fp32)."""
    scheme = Scheme.from_name(scheme)
    return {n: dequantize(c, s, scheme.weight).to(model.get_submodule(n).weight.dtype)
            for n, (c, s) in checkpoint_codes(model, list(names), scheme).items()}


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


def _expert_forward(mod: nn.Module, quant_in, weights):
    """A forward for transformers' fused-experts modules with FP8 weights and quantized expert inputs;
    quant_in(x, which, rows) with `rows` the flattened token indices x holds (None: every token)."""
    gate_up, down = weights

    def forward(hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        with torch.no_grad():
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=mod.num_experts).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        x_all = quant_in(hidden_states, "experts_in", None)
        for e in hit:
            e = e[0]
            pos, tok = torch.where(mask[e])
            gate, up = nn.functional.linear(x_all[tok], gate_up[e]).chunk(2, dim=-1)
            h = quant_in(mod.act_fn(gate) * up, "experts_mid", tok)
            h = nn.functional.linear(h, down[e]) * top_k_weights[tok, pos, None]
            final.index_add_(0, tok, h.to(final.dtype))
        return final

    return forward


def _simulate_experts(mod: nn.Module, scheme: Scheme) -> tuple[torch.Tensor, torch.Tensor]:
    spec = scheme.weight
    outs = []
    for p in (mod.gate_up_proj, mod.down_proj):
        per = [dequantize(*_swap(quantize_weight(p[e], scheme, STORAGE_DTYPE)), spec) for e in range(p.shape[0])]
        outs.append(torch.stack(per).to(p.dtype))
    return outs[0], outs[1]


def _swap(cs):
    c, s = cs
    return c, s.float()


@contextlib.contextmanager
def quantize_units(model: nn.Module, names, scheme: "str | Scheme" = "FP8_DYNAMIC",
                   calibration: Calibration | None = None, weights_only: bool = False, just_in_time: bool = True):
    """Put the named units (Linear modules or fused-experts modules) in FP8 for the duration.

    just_in_time=False dequantizes every weight once on entry (a second copy of the weights in memory),
    which is faster when the model runs many small forwards, as in token-by-token generation."""
    scheme = Scheme.from_name(scheme)
    names = list(names)
    if scheme.static_input and not weights_only and calibration is None:
        raise FP8ProbeError(f"scheme {scheme.name} has static input scales: pass a Calibration from the rollouts")
    handles, restore = [], []
    linear, experts = _split_units(model, names, scheme)
    try:
        # FP8 codes (1 byte per weight) are kept for the duration; each weight is dequantized just before
        # its module runs and dropped right after, so that a whole-model recipe costs 1 byte per weight
        # extra instead of a second fp32 copy of the model. Above LAZY_CODES_BYTES of codes (a big student's
        # whole-model rows on one GPU) not even the codes are kept: each forward quantizes its weight again.
        lazy = just_in_time and sum(model.get_submodule(n).weight.numel() for n in linear) > LAZY_CODES_BYTES
        codes_of = _lazy_codes(model, linear, scheme) if lazy else checkpoint_codes(model, linear, scheme)
        for n, (codes, scale) in codes_of.items():
            mod = model.get_submodule(n)
            restore.append((mod.weight, mod.weight.data))
            quant_input = None if weights_only else _input_quant(n, scheme, calibration)
            if just_in_time:
                handles.append(mod.register_forward_pre_hook(_swap_in_hook(codes, scale, scheme, quant_input)))
                handles.append(mod.register_forward_hook(_swap_out_hook(mod.weight.data)))
            else:
                mod.weight.data = dequantize(codes, scale, scheme.weight).to(mod.weight.dtype)
                if quant_input is not None:
                    handles.append(mod.register_forward_pre_hook(
                        lambda m, a, q=quant_input: (q(a[0]),) + tuple(a[1:])))
        for n in experts:
            mod = model.get_submodule(n)
            weights = _simulate_experts(mod, scheme)

            def quant_in(x, which, rows=None, _n=n):
                if weights_only:
                    return x
                scale = calibration.input_scale(f"{_n}:{which}", scheme.input) if scheme.static_input else None
                return fake_quant(x, scheme.input, scale=scale)

            restore.append((mod, "forward"))
            mod.forward = _expert_forward(mod, quant_in, weights)
        yield
    finally:
        for h in handles:
            h.remove()
        for obj, val in reversed(restore):
            if val == "forward":
                del obj.forward  # back to the class's forward
            else:
                obj.data = val


def _split_units(model: nn.Module, names: list[str], scheme: Scheme) -> tuple[list[str], list[str]]:
    """(Linear units, fused-experts units) of `names`; refuses anything else and dims the scheme cannot take."""
    linear = [n for n in names if isinstance(model.get_submodule(n), nn.Linear)]
    experts = [n for n in names if is_experts(model.get_submodule(n))]
    other = set(names) - set(linear) - set(experts)
    if other:
        raise FP8ProbeError(f"not quantizable units: {', '.join(sorted(other))}")
    _check_dims(model, linear, experts, scheme)
    return linear, experts


def _check_dims(model, linear, experts, scheme: Scheme) -> None:
    dims = {n: model.get_submodule(n).in_features for n in linear}
    for n in experts:
        mod = model.get_submodule(n)
        dims[n] = min(mod.gate_up_proj.shape[-1], mod.down_proj.shape[-1])
    scheme.check_input_dims(dims)


def _input_quant(name: str, scheme: Scheme, calibration: Calibration | None):
    spec = scheme.input
    scale = calibration.input_scale(name, spec) if scheme.static_input else None
    return lambda x: fake_quant(x, spec, scale=scale)


LAZY_CODES_BYTES = 4 * 2**30  # quantize_units keeps FP8 codes up to this many bytes, and requantizes per forward above


def _lazy_codes(model: nn.Module, names: list[str], scheme: Scheme) -> dict[str, tuple]:
    """Like checkpoint_codes, but each entry is (fn, None): fn() quantizes that weight now (with its fused
    group, for per-tensor scales), so that nothing is held between forwards."""
    members = _fused_members(model, names)
    return {n: ((lambda n=n: checkpoint_codes(model, members[n], scheme)[n]), None) for n in names}


def _fused_members(model: nn.Module, names: list[str]) -> dict[str, list[str]]:
    """Each name -> the names quantized with it: its whole fused group when every member is among `names`
    (vLLM's shared per-tensor scale), else itself alone."""
    members = {n: [n] for n in names}
    for us in fused_groups(list_units(model)).values():
        ns = [u.name for u in us]
        if len(ns) > 1 and set(ns) <= set(names):
            members.update({n: ns for n in ns})
    return members


def _swap_in_hook(codes, scale, scheme: Scheme, quant_input):
    def hook(module, args):
        c, s = codes() if scale is None else (codes, scale)
        module.weight.data = dequantize(c, s, scheme.weight).to(module.weight.dtype)
        if quant_input is not None:
            return (quant_input(args[0]),) + tuple(args[1:])
        return None

    return hook


def _swap_out_hook(original):
    def hook(module, args, output):
        module.weight.data = original

    return hook


def fp8_forwards(model: nn.Module, names, scheme: "str | Scheme" = "FP8_DYNAMIC",
                 calibration: Calibration | None = None, fused: bool = True) -> dict[str, object]:
    """For each named unit, a function of that module's forward arguments giving the output it would have in
    FP8 (weights as vLLM holds them, inputs quantized as the scheme does), computed without changing the model.

    Up to DEQUANTIZED_CACHE_BYTES of weights, the FP8 weights are made once and kept (fastest); above it, each
    call quantizes and dequantizes its unit's weight again (the same numbers, no memory held between calls),
    so that a 32B student's estimate needs no second copy of the model.
    The fast sensitivity estimate (fisher.py) takes a unit's perturbation y_fp8 - y from these. fused=False
    quantizes each unit as if it were the only one in FP8 (a per-tensor scale of its own, as a one-unit row of
    the sweep does) instead of sharing the largest scale over a fused group, as vLLM does for a whole group."""
    scheme = Scheme.from_name(scheme)
    names = list(names)
    if scheme.static_input and calibration is None:
        raise FP8ProbeError(f"scheme {scheme.name} has static input scales: pass a Calibration from the rollouts")
    linear, experts = _split_units(model, names, scheme)
    out = {}
    members = _fused_members(model, linear) if fused else {n: [n] for n in linear}
    keep = sum(_weight_bytes(model, n) for n in names) <= DEQUANTIZED_CACHE_BYTES
    last: dict = {}  # q/k/v (and gate/up) see the same input: quantize it once (dynamic schemes)

    def weight_of(n):
        """The FP8 weight of n in the model's dtype: kept from the start (small models) or made at each call."""
        mod = model.get_submodule(n)

        def make():
            codes, scale = checkpoint_codes(model, members[n], scheme)[n]
            return dequantize(codes, scale, scheme.weight).to(mod.weight.dtype)

        if keep:
            w = make()
            return lambda: w
        return make

    for n in linear:
        mod = model.get_submodule(n)
        quant_input = _input_quant(n, scheme, calibration)

        def forward(x, *_, weight=weight_of(n), mod=mod, quant_input=quant_input):
            if scheme.static_input or last.get("x") is not x:
                last.update(x=x, xq=quant_input(x))
            return nn.functional.linear(last["xq"], weight(), mod.bias)

        out[n] = forward
    for n in experts:
        mod = model.get_submodule(n)

        def quant_in(x, which, rows=None, _n=n):
            scale = calibration.input_scale(f"{_n}:{which}", scheme.input) if scheme.static_input else None
            return fake_quant(x, scheme.input, scale=scale)

        if keep:
            weights = _simulate_experts(mod, scheme)
            out[n] = _expert_forward(mod, quant_in, weights)
        else:
            def lazy(*args, _mod=mod, _q=quant_in):
                return _expert_forward(_mod, _q, _simulate_experts(_mod, scheme))(*args)

            out[n] = lazy
    return out


def _weight_bytes(model: nn.Module, name: str) -> int:
    return sum(w.numel() * w.element_size() for w in _weights_of(model, name))


DEQUANTIZED_CACHE_BYTES = 2**30  # fp8_forwards keeps FP8 weights dequantized up to this; above, makes them per call


# ---------------------------------------------------------------------------------------------------
# KV cache


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
def _route_attention(model: nn.Module, actions: dict[int, object], attr: str = "_fp8probe_kv"):
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
    with _route_attention(model, {i: (lambda k, v, _i=i: fn(_i, k, v)) for i in idx}):
        yield


@contextlib.contextmanager
def attention_override(model: nn.Module, fn, layers=None):
    """fn(module, query, key, value, attention_mask, **kwargs) -> (output [B, T, H, D], weights) computes the
    attention of the given layers (all when None) instead of the model's implementation, for the duration."""
    idx = list(attention_modules(model)) if layers is None else list(layers)
    with _route_attention(model, {i: fn for i in idx}, attr="_fp8probe_attention"):
        yield


def kv_scales(kv: KVCacheScheme, layer: int, calibration: Calibration | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The (k, v) scales the engine uses for one layer: 1.0 (online engines) or calibrated on the rollouts."""
    if kv.scale == "unit":
        return torch.ones(1), torch.ones(1)
    if calibration is None or layer not in calibration.k_amax:
        raise FP8ProbeError("a calibrated FP8 KV cache needs a Calibration from the rollouts")
    return compute_scale(calibration.k_amax[layer], kv.spec), compute_scale(calibration.v_amax[layer], kv.spec)


@contextlib.contextmanager
def quantize_kv(model: nn.Module, layers=None, kv: "str | KVCacheScheme" = "fp8",
                calibration: Calibration | None = None, observer=None):
    """FP8 KV cache for the given attention layers (all when None).

    observer(k, k_fp8, v, v_fp8), when given, sees each layer's K/V before and after quantization.
    """
    kv = KVCacheScheme.from_name(kv) if not isinstance(kv, KVCacheScheme) else kv
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
    with _route_attention(model, actions):
        yield


# ---------------------------------------------------------------------------------------------------
# calibration


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
                mod.forward = _expert_forward(mod, rec,
                                              (mod.gate_up_proj, mod.down_proj))

        def kv_rec(i):
            def act(k, v):
                upd(cal.k_amax, i, k, kv_spec, "kv")
                upd(cal.v_amax, i, v, kv_spec, "kv")
                return k, v
            return act

        with _route_attention(model, {i: kv_rec(i) for i in attention_modules(model)}):
            yield cal
    finally:
        cal.valid = None
        for h in handles:
            h.remove()
        for m in restore:
            del m.forward


# ---------------------------------------------------------------------------------------------------
# noise (a mismatch source on the same scale, for admission checks)


def _weights_of(model: nn.Module, name: str) -> list[torch.Tensor]:
    mod = model.get_submodule(name)
    return [mod.gate_up_proj, mod.down_proj] if is_experts(mod) else [mod.weight]


@contextlib.contextmanager
def add_noise(model: nn.Module, names, rel_std: float, seed: int = 0):
    """Gaussian noise of rel_std x each weight tensor's own std on the named units (Linears or experts),
    seeded: the same names, σ and seed give the same noise, drawn in the order of `names`."""
    g = torch.Generator().manual_seed(seed)
    restore = []
    try:
        for n in names:
            for w in _weights_of(model, n):
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
