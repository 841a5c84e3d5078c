"""FP8 formats and schemes: simulated (quantize -> dequantize) FP8, bit-identical to compressed-tensors.

vLLM serves the compressed-tensors presets that llm-compressor writes:

    scheme        weights                              input activations
    FP8           e4m3, one scale per tensor, static    e4m3, one scale per tensor, static (calibrated)
    FP8_DYNAMIC   e4m3, one scale per output channel    e4m3, one scale per token, dynamic
    FP8_BLOCK     e4m3, one scale per 128x128 block     e4m3, one scale per 128 inputs of a token, dynamic
    KV cache      e4m3 (or e5m2), per tensor or per head, after RoPE

The numerics mirror compressed-tensors' own `calculate_qparams` and `_quantize_dequantize`:

    scale = max(|min(x, 0)|, |max(x, 0)|) / 448        (computed in x's dtype; 0 -> finfo(dtype).eps)
    codes = float8(clamp(x / scale, -448, 448))         (x / scale also in x's dtype)
    x_hat = codes.to(scale.dtype) * scale

Why clamp before the cast: torch's cast to float8_e4m3fn saturates on some versions, but the fnuz types
and other versions return NaN, and float8_e5m2 overflows to inf. The clamp makes every version agree.

Why the dtype matters: llm-compressor quantizes a BF16 checkpoint in BF16 arithmetic, so its scales are
BF16 numbers and `x / scale` is rounded to BF16 before the FP8 cast. fp32 scales pick different FP8 codes
for a few per cent of the weights. `quantize_weight` therefore computes in the checkpoint's dtype
(BF16 by default) and hands back the exact codes and scales a compressed checkpoint would hold.

One known difference: for a 2-D activation [tokens, hidden] compressed-tensors' dynamic per-token path
reduces over nothing and falls back to one scale for the whole tensor; we always take one scale per
token (what vLLM's kernels do). For the 3-D [batch, seq, hidden] activations of a transformer, and for
every other strategy, the results are bit-identical (tests/core/test_numerics.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .errors import FP8ProbeError
from .schemes import KVCacheScheme, QuantSpec, Scheme, Strategy

STORAGE_DTYPE = torch.bfloat16  # a checkpoint's dtype: llm-compressor computes scales and codes in it

# ---------------------------------------------------------------------------------------------------
# scales


def _pad_to_blocks(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Zero-pad a 2-D weight to whole blocks (as compressed-tensors does; zeros leave amax alone)."""
    rows, cols = x.shape
    bh, bw = block
    return F.pad(x, (0, (-cols) % bw, 0, (-rows) % bh))


def _blocks(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    # x: [R, C] padded -> [R/bh, C/bw, bh, bw]
    bh, bw = block
    rows, cols = x.shape
    return x.reshape(rows // bh, bh, cols // bw, bw).transpose(1, 2)


def _amax_block(a: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    if a.ndim != 2:
        raise FP8ProbeError(f"block quantization needs a 2-D weight, got shape {tuple(a.shape)}")
    return _blocks(_pad_to_blocks(a, spec.block), spec.block).amax(dim=(-1, -2))  # [R/bh, C/bw]


def _amax_head(a: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    # K/V as attention sees them: [batch, kv_heads, seq, head_dim] -> [1, kv_heads, 1, 1]
    if a.ndim != 4:
        raise FP8ProbeError(f"per-head quantization needs [batch, heads, seq, dim], got {tuple(a.shape)}")
    return a.amax(dim=(0, 2, 3), keepdim=True)


# strategy -> the |x| reduction it shares one scale over, shaped to broadcast against x (block: per block)
_AMAX = {
    Strategy.TENSOR: lambda a, spec: a.amax().reshape(1),
    Strategy.CHANNEL: lambda a, spec: a.amax(dim=-1, keepdim=True),  # weight [out, in] -> [out, 1]
    Strategy.TOKEN: lambda a, spec: a.amax(dim=-1, keepdim=True),  # activation [..., hidden] -> [..., 1]
    Strategy.BLOCK: _amax_block,
    Strategy.GROUP: lambda a, spec: a.unflatten(-1, (math.ceil(a.shape[-1] / spec.group_size), spec.group_size)).amax(
        dim=-1
    ),  # [..., G]
    Strategy.HEAD: _amax_head,
}


def amax(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """max(|min(x,0)|, |max(x,0)|) reduced as the strategy says, shaped to broadcast against x."""
    return _AMAX[spec.strategy](x.abs(), spec)


def compute_scale(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """scale = amax / fmt max in x's dtype, zeros replaced by that dtype's eps (as compressed-tensors)."""
    top = amax(x, spec)
    scale = top / torch.tensor(spec.max, dtype=top.dtype, device=top.device)
    eps = torch.tensor(torch.finfo(scale.dtype).eps, dtype=scale.dtype, device=scale.device)
    return torch.where(scale == 0, eps, scale)


# ---------------------------------------------------------------------------------------------------
# quantize / dequantize


def _apply(x: torch.Tensor, scale: torch.Tensor, spec: QuantSpec, fn) -> torch.Tensor:
    """Reshape x so that `scale` broadcasts, apply fn(x, scale), and restore x's shape."""
    s = spec.strategy
    if s == Strategy.BLOCK:
        shape = x.shape
        xb = _blocks(_pad_to_blocks(x, spec.block), spec.block)  # [RB, CB, bh, bw]
        out = fn(xb, scale[..., None, None])
        rb, cb, bh, bw = out.shape
        return out.transpose(1, 2).reshape(rb * bh, cb * bw)[: shape[0], : shape[1]]
    if s == Strategy.GROUP:
        g = spec.group_size
        if x.shape[-1] >= g and x.shape[-1] % g:
            raise FP8ProbeError(f"group quantization needs the last dim ({x.shape[-1]}) to be a multiple of {g}")
        xg = x.unflatten(-1, (math.ceil(x.shape[-1] / g), g))
        return fn(xg, scale[..., None]).flatten(-2)
    return fn(x, scale)


def quantize(x: torch.Tensor, scale: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """FP8 codes of x: float8(clamp(x / scale)). The division runs in x's dtype (promoted with scale's)."""

    def q(v, s):
        return torch.clamp(v / s, -spec.max, spec.max).to(spec.torch_dtype)

    return _apply(x, scale, spec, q)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """codes * scale in scale's dtype (pass an fp32 scale for the exact product vLLM's GEMMs use)."""
    return _apply(codes, scale, spec, lambda c, s: c.to(s.dtype) * s)


def fake_quant(
    x: torch.Tensor,
    scheme: "str | Scheme | KVCacheScheme | QuantSpec",
    role: str = "weight",
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Quantize then dequantize x as `scheme` does for `role` ("weight" or "input"; ignored for KV).

    Computes in x's dtype exactly as compressed-tensors' fake quantization does. `scale` overrides the
    scale computed from x (for a static input scale calibrated on other data). Returns x's dtype.
    """
    spec = _spec_for(scheme, role)
    if scale is None:
        scale = compute_scale(x, spec)
    codes = quantize(x, scale, spec)
    # compressed-tensors returns codes.to(x.dtype).to(scale.dtype) * scale; the first cast is exact
    return dequantize(codes, scale, spec).to(x.dtype)


def _spec_for(scheme, role: str) -> QuantSpec:
    if isinstance(scheme, QuantSpec):
        return scheme
    if isinstance(scheme, KVCacheScheme):
        return scheme.spec
    s = Scheme.from_name(scheme)
    if role == "weight":
        return s.weight
    if role == "input":
        return s.input
    raise FP8ProbeError(f"unknown role {role!r}; supported: weight, input")


def quantize_weight(
    w: torch.Tensor, scheme: "str | Scheme", storage_dtype: torch.dtype = STORAGE_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 codes and scales a compressed-tensors checkpoint stores for weight w.

    w is first cast to the checkpoint's dtype (BF16 by default), then scales and codes are computed
    in that dtype, as llm-compressor does on a BF16 model. Returns (codes [fp8], scale [storage_dtype]).
    """
    spec = Scheme.from_name(scheme).weight
    wq = w.detach().to(storage_dtype)
    scale = compute_scale(wq, spec)
    return quantize(wq, scale, spec), scale


def simulate_weight(
    w: torch.Tensor, scheme: "str | Scheme", storage_dtype: torch.dtype = STORAGE_DTYPE
) -> torch.Tensor:
    """The weight vLLM computes with: checkpoint codes x checkpoint scales, exact in fp32, in w's dtype."""
    spec = Scheme.from_name(scheme).weight
    codes, scale = quantize_weight(w, scheme, storage_dtype)
    return dequantize(codes, scale.float(), spec).to(w.dtype)


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB, torchao's definition: 20 log10(||ref|| / ||ref - approx||)."""
    ref = ref.float()
    return sqnr_db_from_energy(energy(ref), energy(ref - approx.float()))


def energy(x: torch.Tensor) -> float:
    """sum(x^2), the same to the bit whatever the thread count: each row is reduced in float64 by one thread
    and the rows are added exactly (math.fsum), so a sweep spread over workers with fewer threads each writes
    the same SQNR as one process."""
    x = x.double()
    rows = x.pow(2).reshape(-1, x.shape[-1]).sum(-1) if x.ndim else x.pow(2).reshape(1)
    return math.fsum(rows.tolist())


def sqnr_db_from_energy(signal: float, noise: float) -> float:
    """The same SQNR from summed energies (sum ref^2, sum (ref - approx)^2), e.g. accumulated over batches."""
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf
