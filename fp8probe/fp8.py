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
every other strategy, the results are bit-identical (tests/test_fp8.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .errors import FP8ProbeError

FP8_FORMATS = {
    # name: (torch dtype, largest finite value)
    "e4m3": (torch.float8_e4m3fn, 448.0),
    "e5m2": (torch.float8_e5m2, 57344.0),
}

STRATEGIES = ("tensor", "channel", "block", "token", "group", "head")


@dataclass(frozen=True)
class QuantSpec:
    """How one tensor (a weight, an input activation, a K or V) is quantized."""

    strategy: str  # one of STRATEGIES
    dynamic: bool = False  # scales computed per forward from the tensor itself
    block: tuple[int, int] = (128, 128)  # rows x cols, for strategy="block"
    group_size: int = 128  # along the last dim, for strategy="group"
    fmt: str = "e4m3"  # "e4m3" or "e5m2"

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise FP8ProbeError(f"unknown strategy {self.strategy!r}; supported: {', '.join(STRATEGIES)}")
        if self.fmt not in FP8_FORMATS:
            raise FP8ProbeError(f"unknown FP8 format {self.fmt!r}; supported: {', '.join(FP8_FORMATS)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return FP8_FORMATS[self.fmt][0]

    @property
    def max(self) -> float:
        return FP8_FORMATS[self.fmt][1]


@dataclass(frozen=True)
class Scheme:
    """A weight + input-activation FP8 scheme, as a compressed-tensors preset names it."""

    name: str
    weight: QuantSpec
    input: QuantSpec

    @classmethod
    def from_name(cls, name: "str | Scheme") -> "Scheme":
        if isinstance(name, Scheme):
            return name
        key = str(name).strip().upper()
        if key not in PRESETS:
            raise FP8ProbeError(f"unknown scheme {name!r}; supported: {', '.join(PRESETS)}")
        return PRESETS[key]

    @property
    def static_input(self) -> bool:
        """True when the input scale must be calibrated on data (the FP8 preset)."""
        return not self.input.dynamic

    def check_input_dims(self, dims: dict[str, int]) -> None:
        """Per-group input quantization needs inputs in whole groups (vLLM's block-FP8 kernels need them
        too): refuse, naming the units, when a unit's input dim (name -> dim) is not a multiple."""
        if self.input.strategy != "group":
            return
        g = self.input.group_size
        bad = [f"{n} ({d})" for n, d in dims.items() if d % g]
        if bad:
            raise FP8ProbeError(f"{self.name} needs input dims divisible by {g}; not: {', '.join(bad[:5])}"
                                f"{' ...' if len(bad) > 5 else ''}; use FP8_DYNAMIC or keep these units in BF16")


PRESETS: dict[str, Scheme] = {
    "FP8": Scheme("FP8", QuantSpec("tensor"), QuantSpec("tensor", dynamic=False)),
    "FP8_DYNAMIC": Scheme("FP8_DYNAMIC", QuantSpec("channel"), QuantSpec("token", dynamic=True)),
    "FP8_BLOCK": Scheme("FP8_BLOCK", QuantSpec("block"), QuantSpec("group", dynamic=True)),
}


# vLLM's --kv-cache-dtype names of the FP8 KV caches -> our format names
KV_CACHE_DTYPES = {"fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}


@dataclass(frozen=True)
class KVCacheScheme:
    """FP8 KV cache: the format and whether K/V get one scale per layer or one per KV head.

    `scale` is "calibrated" (amax / fmt max over calibration data, what llm-compressor's
    kv_cache_scheme stores) or "unit" (scale 1.0: what vLLM uses with --kv-cache-dtype fp8 on a
    checkpoint without KV scales).
    """

    fmt: str = "e4m3"
    strategy: str = "tensor"  # "tensor" or "head"
    scale: str = "calibrated"  # "calibrated" or "unit"

    def __post_init__(self):
        if self.fmt not in FP8_FORMATS:
            raise FP8ProbeError(f"unknown KV-cache format {self.fmt!r}; supported: {', '.join(FP8_FORMATS)}")
        if self.strategy not in ("tensor", "head"):
            raise FP8ProbeError(f"unknown KV-cache strategy {self.strategy!r}; supported: tensor, head")
        if self.scale not in ("calibrated", "unit"):
            raise FP8ProbeError(f"unknown KV-cache scale mode {self.scale!r}; supported: calibrated, unit")

    @classmethod
    def from_name(cls, name: "str | KVCacheScheme") -> "KVCacheScheme":
        """Accepts vLLM's --kv-cache-dtype names: fp8, fp8_e4m3, fp8_e5m2."""
        if isinstance(name, KVCacheScheme):
            return name
        key = str(name).strip().lower()
        fmt = KV_CACHE_DTYPES.get(key) or {"e4m3": "e4m3", "e5m2": "e5m2"}.get(key)
        if fmt is None:
            raise FP8ProbeError(f"unknown KV-cache dtype {name!r}; supported: {', '.join(KV_CACHE_DTYPES)}")
        return cls(fmt=fmt)

    @property
    def spec(self) -> QuantSpec:
        return QuantSpec(self.strategy, dynamic=False, fmt=self.fmt)


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


def _amax(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """max(|min(x,0)|, |max(x,0)|) reduced as the strategy says, shaped to broadcast against x."""
    a = x.abs()
    s = spec.strategy
    if s == "tensor":
        return a.amax().reshape(1)
    if s in ("channel", "token"):
        # channel: weight [out, in] -> [out, 1]; token: activation [..., hidden] -> [..., 1]
        return a.amax(dim=-1, keepdim=True)
    if s == "block":
        if x.ndim != 2:
            raise FP8ProbeError(f"block quantization needs a 2-D weight, got shape {tuple(x.shape)}")
        return _blocks(_pad_to_blocks(a, spec.block), spec.block).amax(dim=(-1, -2))  # [R/bh, C/bw]
    if s == "group":
        g = spec.group_size
        return a.unflatten(-1, (math.ceil(x.shape[-1] / g), g)).amax(dim=-1)  # [..., G]
    if s == "head":
        # K/V as attention sees them: [batch, kv_heads, seq, head_dim] -> [1, kv_heads, 1, 1]
        if x.ndim != 4:
            raise FP8ProbeError(f"per-head quantization needs [batch, heads, seq, dim], got {tuple(x.shape)}")
        return a.amax(dim=(0, 2, 3), keepdim=True)
    raise FP8ProbeError(f"unknown strategy {s!r}")


def compute_scale(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """scale = amax / fmt max in x's dtype, zeros replaced by that dtype's eps (as compressed-tensors)."""
    amax = _amax(x, spec)
    scale = amax / torch.tensor(spec.max, dtype=amax.dtype, device=amax.device)
    eps = torch.tensor(torch.finfo(scale.dtype).eps, dtype=scale.dtype, device=scale.device)
    return torch.where(scale == 0, eps, scale)


# ---------------------------------------------------------------------------------------------------
# quantize / dequantize


def _apply(x: torch.Tensor, scale: torch.Tensor, spec: QuantSpec, fn) -> torch.Tensor:
    """Reshape x so that `scale` broadcasts, apply fn(x, scale), and restore x's shape."""
    s = spec.strategy
    if s == "block":
        shape = x.shape
        xb = _blocks(_pad_to_blocks(x, spec.block), spec.block)  # [RB, CB, bh, bw]
        out = fn(xb, scale[..., None, None])
        rb, cb, bh, bw = out.shape
        return out.transpose(1, 2).reshape(rb * bh, cb * bw)[: shape[0], : shape[1]]
    if s == "group":
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
    w: torch.Tensor, scheme: "str | Scheme", storage_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 codes and scales a compressed-tensors checkpoint stores for weight w.

    w is first cast to the checkpoint's dtype (BF16 by default), then scales and codes are computed
    in that dtype, as llm-compressor does on a BF16 model. Returns (codes [fp8], scale [storage_dtype]).
    """
    spec = Scheme.from_name(scheme).weight
    wq = w.detach().to(storage_dtype)
    scale = compute_scale(wq, spec)
    return quantize(wq, scale, spec), scale


def simulate_weight(w: torch.Tensor, scheme: "str | Scheme", storage_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The weight vLLM computes with: checkpoint codes x checkpoint scales, exact in fp32, in w's dtype."""
    spec = Scheme.from_name(scheme).weight
    codes, scale = quantize_weight(w, scheme, storage_dtype)
    return dequantize(codes, scale.float(), spec).to(w.dtype)


def num_scales(shape: tuple[int, int], spec: QuantSpec) -> int:
    """How many scales a checkpoint stores for a weight of shape [out, in]."""
    rows, cols = shape
    if spec.strategy == "tensor":
        return 1
    if spec.strategy == "channel":
        return rows
    if spec.strategy == "block":
        return math.ceil(rows / spec.block[0]) * math.ceil(cols / spec.block[1])
    raise FP8ProbeError(f"strategy {spec.strategy!r} is not a weight strategy")


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB, torchao's definition: 20 log10(||ref|| / ||ref - approx||)."""
    ref = ref.float()
    noise = torch.linalg.vector_norm(ref - approx.float())
    signal = torch.linalg.vector_norm(ref)
    if noise == 0:
        return float("inf")
    return float(20 * torch.log10(signal / noise))
