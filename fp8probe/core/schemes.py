"""What the FP8 schemes are, as data: formats, strategies, the compressed-tensors presets, KV-cache schemes.

    scheme        weights                              input activations
    FP8           e4m3, one scale per tensor, static    e4m3, one scale per tensor, static (calibrated)
    FP8_DYNAMIC   e4m3, one scale per output channel    e4m3, one scale per token, dynamic
    FP8_BLOCK     e4m3, one scale per 128x128 block     e4m3, one scale per 128 inputs of a token, dynamic
    FP8_TENSOR_DYNAMIC  e4m3, one scale per tensor      e4m3, one scale per tensor, dynamic
    KV cache      e4m3 (or e5m2), per tensor or per head, after RoPE

The first three are compressed-tensors presets (a recipe names them as `scheme:`). FP8_TENSOR_DYNAMIC is
what vLLM does with `quantization="fp8"` on a BF16 model (online FP8, as SkyRL's rollout engines run it):
not a preset, so a recipe spells it out as one config group (recipe.py).

Frozen dataclasses, validated on construction, with `from_name` for the names users type (the CLI's
choices come from PRESETS and KV_CACHE_DTYPES). This module imports no torch, so that `fp8probe --help`
stays instant; the arithmetic on tensors is fp8.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from .errors import FP8ProbeError

if TYPE_CHECKING:
    import torch

FP8_FORMATS = {
    # name: (torch dtype name, largest finite value)
    "e4m3": ("float8_e4m3fn", 448.0),
    "e5m2": ("float8_e5m2", 57344.0),
}


class Strategy(str, Enum):
    """Over what one scale is shared (compressed-tensors' QuantizationStrategy names; a str, so it compares with and
    serializes as its name)."""

    TENSOR = "tensor"  # one scale for the whole tensor
    CHANNEL = "channel"  # a weight's output channel (row)
    BLOCK = "block"  # a 2-D block of a weight (128 x 128)
    TOKEN = "token"  # an activation's token (its last dim)
    GROUP = "group"  # groups of 128 along an activation's last dim
    HEAD = "head"  # a K or V head

    def __str__(self) -> str:
        return self.value


STRATEGIES = tuple(s.value for s in Strategy)


@dataclass(frozen=True)
class QuantSpec:
    """How one tensor (a weight, an input activation, a K or V) is quantized."""

    strategy: Strategy  # a Strategy (or its name)
    dynamic: bool = False  # scales computed per forward from the tensor itself
    block: tuple[int, int] = (128, 128)  # rows x cols, for strategy="block"
    group_size: int = 128  # along the last dim, for strategy="group"
    fmt: str = "e4m3"  # "e4m3" or "e5m2"

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise FP8ProbeError(f"unknown strategy {self.strategy!r}; supported: {', '.join(STRATEGIES)}")
        object.__setattr__(self, "strategy", Strategy(self.strategy))
        if self.fmt not in FP8_FORMATS:
            raise FP8ProbeError(f"unknown FP8 format {self.fmt!r}; supported: {', '.join(FP8_FORMATS)}")

    @property
    def torch_dtype(self) -> "torch.dtype":
        import torch

        return getattr(torch, FP8_FORMATS[self.fmt][0])

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
        if key not in SCHEMES:
            raise FP8ProbeError(f"unknown scheme {name!r}; supported: {', '.join(SCHEMES)}")
        return SCHEMES[key]

    @classmethod
    def from_specs(cls, weight: dict, input: dict | None) -> "Scheme":
        """The scheme whose weight and input specs a compressed-tensors config group spells out."""
        for s in SCHEMES.values():
            if input is not None and _same(weight, s.weight) and _same(input, s.input):
                return s
        raise FP8ProbeError(
            f"no FP8 scheme has weights {weight} and input activations {input}; supported: {', '.join(SCHEMES)}"
        )

    @property
    def is_preset(self) -> bool:
        """A compressed-tensors preset name (what `scheme:` in an llm-compressor recipe takes)."""
        return self.name in PRESETS

    def config_group(self) -> dict:
        """This scheme as one compressed-tensors config group (targets, weights, input_activations); a static
        input scale calibrated as fp8probe measures it (STATIC_OBSERVER)."""
        inputs = _spec_dict(self.input) | ({"observer": STATIC_OBSERVER} if self.static_input else {})
        return {"targets": ["Linear"], "weights": _spec_dict(self.weight), "input_activations": inputs}

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
            raise FP8ProbeError(
                f"{self.name} needs input dims divisible by {g}; not: {', '.join(bad[:5])}"
                f"{' ...' if len(bad) > 5 else ''}; use FP8_DYNAMIC or keep these units in BF16"
            )


PRESETS: dict[str, Scheme] = {
    "FP8": Scheme("FP8", QuantSpec("tensor"), QuantSpec("tensor", dynamic=False)),
    "FP8_DYNAMIC": Scheme("FP8_DYNAMIC", QuantSpec("channel"), QuantSpec("token", dynamic=True)),
    "FP8_BLOCK": Scheme("FP8_BLOCK", QuantSpec("block"), QuantSpec("group", dynamic=True)),
}
# vLLM's online FP8 (quantization="fp8" on a BF16 model): Fp8LinearMethod quantizes each weight (a fused
# q/k/v or gate/up weight as one tensor) with one scale, and each input with one dynamic scale per forward
SCHEMES: dict[str, Scheme] = {
    **PRESETS,
    "FP8_TENSOR_DYNAMIC": Scheme("FP8_TENSOR_DYNAMIC", QuantSpec("tensor"), QuantSpec("tensor", dynamic=True)),
}


def _spec_dict(spec: QuantSpec) -> dict:
    """A QuantSpec as compressed-tensors' QuantizationArgs fields."""
    d = {"num_bits": 8, "type": "float", "strategy": spec.strategy.value, "dynamic": spec.dynamic, "symmetric": True}
    if spec.strategy == "block":
        d["block_structure"] = list(spec.block)
    if spec.strategy == "group":
        d["group_size"] = spec.group_size
    return d


_CT_DEFAULTS = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": False}  # QuantizationArgs defaults


def _same(d: dict, spec: QuantSpec) -> bool:
    if not isinstance(d, dict):
        return False
    return all(d.get(k, _CT_DEFAULTS.get(k)) == v for k, v in _spec_dict(spec).items())


# llm-compressor's observer for static scales: "static_minmax" = the amax over all calibration data, which is what
# fp8probe measures with. Its default ("minmax") is a moving average over the calibration samples (constant 0.01)
# that ends up below that amax. Measured on the embedded student (16 rollouts): with the default, the checkpoint's
# static input scales were up to 80 % below fp8probe's (median 6.6 %) and its k/v scales up to 35 % below; with
# static_minmax, within -2.3 % .. +5.3 % and -1.1 % .. +1.3 % (median 0: llm-compressor calibrates a bf16 copy).
STATIC_OBSERVER = "static_minmax"


VLLM_VERSION = "0.32.0"  # the vLLM whose KV-cache dtypes, layout and accounting fp8probe mirrors


@dataclass(frozen=True)
class KVDtype:
    """One KV-cache dtype as vLLM names it (--kv-cache-dtype): what it costs per element, how fp8probe measures it, and
    how a recipe writes it. Adding a KV dtype is an entry of KV_DTYPES (and its measurement where `fmt` is new)."""

    name: str
    element_bytes: float | None  # bytes per K or V element (None: the model's own dtype); vllm/utils/torch_utils.py
    fmt: str | None = None  # the FP8 format fp8probe simulates it with (e4m3, e5m2); None: not measured here
    # inline fp32 scales per token, KV head and side (the per-token-head dtypes: TritonAttentionBackend.customize_spec)
    scale_bytes: int = 0
    # what llm-compressor's QuantizationModifier takes as kv_cache_scheme (calibrated per-tensor k/v scales, which vLLM
    # reads as k_scale / v_scale): the dtypes a recipe can hold
    scheme: dict | None = None


# the one table of KV-cache dtypes, in vLLM's order; everything else about a KV dtype is read from here
KV_DTYPES = {
    d.name: d
    for d in (
        KVDtype("auto", None),
        KVDtype("bfloat16", 2),
        KVDtype("float16", 2),
        KVDtype(
            "fp8",
            1,
            "e4m3",
            scheme={
                "num_bits": 8,
                "type": "float",
                "strategy": "tensor",
                "dynamic": False,
                "symmetric": True,
                "observer": STATIC_OBSERVER,
            },
        ),
        KVDtype("fp8_e4m3", 1, "e4m3"),
        KVDtype("fp8_e5m2", 1, "e5m2"),
        KVDtype("fp8_per_token_head", 1, scale_bytes=4),
        KVDtype("int8_per_token_head", 1, scale_bytes=4),
        KVDtype("int4_per_token_head", 0.5, scale_bytes=4),
    )
}
# views of it: the FP8 KV caches fp8probe measures (vLLM's name -> our format name), and a recipe's KV-cache schemes
KV_CACHE_DTYPES = {n: d.fmt for n, d in KV_DTYPES.items() if d.fmt}
KV_CACHE_SCHEMES = {n: d.scheme for n, d in KV_DTYPES.items() if d.scheme}


def check_recipe_kv(kv_cache_dtype: str | None) -> None:
    """A recipe's FP8 KV cache is named as the engines name it (vLLM's --kv-cache-dtype) and written as
    llm-compressor's kv_cache_scheme (KV_CACHE_SCHEMES): only the dtypes with a kv_cache_scheme can be in a recipe."""
    if kv_cache_dtype is None or kv_cache_dtype in KV_CACHE_SCHEMES:
        return
    why = (
        "an engine setting with no calibrated scales in llm-compressor's kv_cache_scheme: measure it with "
        f"`fp8probe check --kv-cache-dtype {kv_cache_dtype}`"
        if kv_cache_dtype in KV_CACHE_DTYPES
        else "not a KV-cache dtype"
    )
    raise FP8ProbeError(f"`kv_cache_dtype` {kv_cache_dtype!r} is {why}; a recipe takes: {', '.join(KV_CACHE_SCHEMES)}")


def kv_cache_name(d: dict) -> str | None:
    """The KV_CACHE_SCHEMES name of a kv_cache_scheme mapping, whichever observer calibrates it."""
    strip = lambda m: {k: v for k, v in m.items() if k not in ("observer", "observer_kwargs")}  # noqa: E731
    return next((k for k, v in KV_CACHE_SCHEMES.items() if strip(v) == strip(d)), None)


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


def num_scales(shape: tuple[int, int], spec: QuantSpec) -> int:
    """How many scales a checkpoint stores for a weight of shape [out, in]."""
    rows, cols = shape
    count = {
        Strategy.TENSOR: lambda: 1,
        Strategy.CHANNEL: lambda: rows,
        Strategy.BLOCK: lambda: math.ceil(rows / spec.block[0]) * math.ceil(cols / spec.block[1]),
    }
    if spec.strategy not in count:
        raise FP8ProbeError(f"strategy {spec.strategy!r} is not a weight strategy")
    return count[spec.strategy]()
