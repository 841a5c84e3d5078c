"""Units in FP8 for the duration of a context, restored exactly on exit (also after an exception).

    with quantize_units(model, ["model.layers.3.mlp.down_proj"], scheme):
        logits = model(input_ids).logits          # that one Linear in FP8, the rest untouched

Weights are quantized as llm-compressor stores them (from BF16 weights, BF16 scales; core/numerics.py) and
dequantized exactly (codes x scales in fp32), which is what vLLM multiplies with. Only the perturbed
weights get a new tensor; the original is kept by reference and put back. Input activations are
quantized by a forward pre-hook, per token (FP8_DYNAMIC), per group of 128 (FP8_BLOCK), per tensor
(FP8_TENSOR_DYNAMIC) or with a calibrated per-tensor scale (FP8; calibration.py). For the per-tensor FP8
scheme vLLM fuses q/k/v and gate/up into one GEMM with the largest of their scales, so a fused group
quantized as a whole is requantized with that maximum, as vLLM's loader does (`checkpoint_codes`).
`fp8_forwards` gives the same FP8 outputs as functions, without changing the model (the fast estimate).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..core.errors import FP8ProbeError
from ..core.numerics import STORAGE_DTYPE, dequantize, fake_quant, quantize, quantize_weight
from ..core.schemes import Scheme
from ..model.structure import fused_groups, is_experts, list_units
from .scales import Calibration


def checkpoint_codes(model: nn.Module, names: list[str], scheme: Scheme) -> dict[str, tuple]:
    """(FP8 codes, fp32 scale) per named Linear, as vLLM holds them; per-tensor scales shared over fused groups."""
    spec = scheme.weight
    out = {n: _swap(quantize_weight(model.get_submodule(n).weight, scheme, STORAGE_DTYPE)) for n in names}
    if spec.strategy == "tensor" and len(out) > 1:  # one weight is no fused group: no need to list the model's
        for ns in ([u.name for u in us] for us in fused_groups(list_units(model)).values()):
            if len(ns) > 1 and set(ns) <= set(out):
                # vLLM: one GEMM for the fused group, weights requantized with the largest scale
                smax = torch.stack([out[n][1] for n in ns]).max().reshape(1)
                for n in ns:
                    w = dequantize(*out[n], spec)
                    out[n] = (quantize(w, smax, spec), smax)
    return out


def simulated_weights(model: nn.Module, names, scheme: Scheme) -> dict[str, torch.Tensor]:
    """The weights vLLM multiplies with for the named Linear units (codes x scales, exact in fp32)."""
    return {
        n: dequantize(c, s, scheme.weight).to(model.get_submodule(n).weight.dtype)
        for n, (c, s) in checkpoint_codes(model, list(names), scheme).items()
    }


def expert_forward(mod: nn.Module, quant_in, weights):
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
def quantize_units(
    model: nn.Module,
    names,
    scheme: Scheme,
    calibration: Calibration | None = None,
    weights_only: bool = False,
    just_in_time: bool = True,
):
    """Put the named units (Linear modules or fused-experts modules) in FP8 for the duration.

    just_in_time=False dequantizes every weight once on entry (a second copy of the weights in memory),
    which is faster when the model runs many small forwards, as in token-by-token generation."""
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
                    handles.append(mod.register_forward_pre_hook(lambda m, a, q=quant_input: (q(a[0]),) + tuple(a[1:])))
        for n in experts:
            mod = model.get_submodule(n)
            weights = _simulate_experts(mod, scheme)

            def quant_in(x, which, rows=None, _n=n):
                if weights_only:
                    return x
                scale = calibration.input_scale(f"{_n}:{which}", scheme.input) if scheme.static_input else None
                return fake_quant(x, scheme.input, scale=scale)

            restore.append((mod, "forward"))
            mod.forward = expert_forward(mod, quant_in, weights)
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


def _input_scale(name: str, scheme: Scheme, calibration: Calibration | None) -> torch.Tensor | None:
    """The unit's static input scale from the calibration; None for a dynamic scheme (each input its own)."""
    return calibration.input_scale(name, scheme.input) if scheme.static_input else None


def _input_quant(name: str, scheme: Scheme, calibration: Calibration | None):
    scale = _input_scale(name, scheme, calibration)
    return lambda x: fake_quant(x, scheme.input, scale=scale)


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


def fp8_forwards(
    model: nn.Module,
    names,
    scheme: Scheme,
    calibration: Calibration | None = None,
    fused: bool = True,
    straight_through: bool = False,
) -> dict[str, object]:
    """For each named unit, a function of that module's forward arguments giving the output it would have in
    FP8 (weights as vLLM holds them, inputs quantized as the scheme does), computed without changing the model.

    Up to DEQUANTIZED_CACHE_BYTES of weights, the FP8 weights are made once and kept (fastest); above it, each
    call quantizes and dequantizes its unit's weight again (the same numbers, no memory held between calls),
    so that a 32B student's estimate needs no second copy of the model.
    The fast sensitivity estimate (fisher.py) takes a unit's perturbation y_fp8 - y from these. fused=False
    quantizes each unit as if it were the only one in FP8 (a per-tensor scale of its own, as a one-unit row of
    the sweep does) instead of sharing the largest scale over a fused group, as vLLM does for a whole group.
    straight_through: the input's quantization passes gradients as if it were the identity (a straight-through
    estimator), so that d(output)/d(input) is the FP8 weight (the path attribution differentiates through it)."""
    names = list(names)
    if scheme.static_input and calibration is None:
        raise FP8ProbeError(f"scheme {scheme.name} has static input scales: pass a Calibration from the rollouts")
    linear, experts = _split_units(model, names, scheme)
    out = {}
    members = _fused_members(model, linear) if fused else {n: [n] for n in linear}
    keep = sum(_weight_bytes(model, n) for n in names) <= DEQUANTIZED_CACHE_BYTES
    # q/k/v (and gate/up) see the same input: quantize it once per scale (a sweep's calibration gives them one, the
    # amax of that input; a caller's may give them several, each quantized on its own)
    last: dict = {}
    codes = {}  # kept: each set of members' codes made once (a fused group's shared scale not once per member)
    for ms in {tuple(ms) for ms in members.values()} if keep else ():
        codes.update(checkpoint_codes(model, list(ms), scheme))

    def weight_of(n):
        """The FP8 weight of n in the model's dtype: kept from the start (small models) or made at each call."""
        mod = model.get_submodule(n)
        if keep:
            w = dequantize(*codes[n], scheme.weight).to(mod.weight.dtype)
            return lambda: w

        def make():
            return dequantize(*checkpoint_codes(model, members[n], scheme)[n], scheme.weight).to(mod.weight.dtype)

        return make

    for n in linear:
        mod = model.get_submodule(n)
        scale = _input_scale(n, scheme, calibration)

        def forward(x, *_, weight=weight_of(n), mod=mod, scale=scale):
            if last.get("x") is not x or not _same_scale(last["scale"], scale):
                xq = fake_quant(x, scheme.input, scale=scale)
                last.update(x=x, scale=scale, xq=x + (xq - x).detach() if straight_through else xq)
            return nn.functional.linear(last["xq"], weight(), mod.bias)

        out[n] = forward
    for n in experts:
        mod = model.get_submodule(n)

        def quant_in(x, which, rows=None, _n=n):
            scale = calibration.input_scale(f"{_n}:{which}", scheme.input) if scheme.static_input else None
            return fake_quant(x, scheme.input, scale=scale)

        if keep:
            weights = _simulate_experts(mod, scheme)
            out[n] = expert_forward(mod, quant_in, weights)
        else:

            def lazy(*args, _mod=mod, _q=quant_in):
                return expert_forward(_mod, _q, _simulate_experts(_mod, scheme))(*args)

            out[n] = lazy
    return out


def _same_scale(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two input scales quantize alike (None: dynamic, from the input itself)."""
    return a is b or (a is not None and b is not None and torch.equal(a, b))


def _weight_bytes(model: nn.Module, name: str) -> int:
    return sum(w.numel() * w.element_size() for w in unit_weights(model, name))


DEQUANTIZED_CACHE_BYTES = 2**30  # fp8_forwards keeps FP8 weights dequantized up to this; above, makes them per call


def unit_weights(model: nn.Module, name: str) -> list[torch.Tensor]:
    mod = model.get_submodule(name)
    return [mod.gate_up_proj, mod.down_proj] if is_experts(mod) else [mod.weight]
