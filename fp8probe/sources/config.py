"""A rollout configuration, named once: what the rollout engine does differently from the trainer.

`RolloutConfig` is the one vocabulary for a configuration. A calibration level is one (`calibrate --levels`), a
`check` builds one from its flags, and the verdict compares them: a configuration a calibration trained with is
judged on that level's own measured loss, so two configurations must be equal exactly when the engine runs the same
thing. Its parts:

    part       text                  what differs
    fp8        fp8[:SCHEME]          every unit the scheme fits in FP8 (default FP8_DYNAMIC); a recipe's subset is
                                     written `fp8:SCHEME[N of M units <digest>]`
    kv         kv[:DTYPE][@SCALES]   an FP8 KV cache in every attention layer; scales `unit` (1.0: what vLLM and the
               [skip:L,L...]         RL frameworks' online quantization run unless given scales; the default) or
                                     `calibrated` (llm-compressor's kv_cache_scheme, stored in a checkpoint); with
                                     [skip:...], those layers' KV cache stays in the model dtype (a per-layer map,
                                     vLLM's kv_cache_dtype_skip_layers)
    stale      stale:K               the weights of K optimizer steps ago (stale:? a checkpoint of unknown lag)
    noise      a number σ            Gaussian weight noise, σ x each tensor's std (0: nothing differs)

Parts join with "+" ("fp8:FP8_DYNAMIC+kv:fp8"), in this order. The text is what budget.json, calibrate.json and
check.json write; `parse(config.name) == config`. Light: no torch.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from ..core.errors import FP8ProbeError
from ..core.schemes import KV_CACHE_DTYPES

ALL = "all"  # fp8_units of a configuration that puts every unit its scheme fits in FP8
KV_SCALES = ("unit", "calibrated")  # unit: scale 1.0 (online engines' default); calibrated: stored amax / 448
STALE_UNKNOWN = 0  # stale: a checkpoint given without its lag in optimizer steps
HELP = (
    "a number: weight noise σ (x each tensor's std; 0: no mismatch); fp8[:SCHEME] (every unit in FP8, "
    "default FP8_DYNAMIC); kv[:DTYPE] (FP8 KV cache at scale 1.0, default fp8; kv:fp8@calibrated with "
    "calibrated scales); stale:K (rollouts from the weights of K updates ago); parts joined with '+'"
)


@dataclass(frozen=True)
class RolloutConfig:
    """What the rollout engine does differently (module docstring); every field's default is "nothing differs"."""

    fp8: str | None = None  # the weights' FP8 scheme (compressed-tensors preset name)
    fp8_units: str = ALL  # ALL, or "N of M units <digest>" for a recipe's subset
    kv: str | None = None  # the KV cache's dtype (vLLM's --kv-cache-dtype name)
    kv_scale: str = "unit"  # KV_SCALES
    kv_skip: tuple[int, ...] = ()  # layers whose KV cache stays in the model dtype (sorted)
    stale: int | None = None  # the lag in optimizer steps (STALE_UNKNOWN: not given)
    noise: float = 0.0  # σ

    def __post_init__(self):
        if self.kv is not None and self.kv not in KV_CACHE_DTYPES:
            raise FP8ProbeError(f"unknown KV-cache dtype {self.kv!r}; one of {', '.join(KV_CACHE_DTYPES)}")
        if self.kv == "fp8_e4m3":  # vLLM's two names of one format: one configuration
            object.__setattr__(self, "kv", "fp8")
        if self.kv is None:  # scales (and skipped layers) of no KV cache say nothing
            object.__setattr__(self, "kv_scale", "unit")
            object.__setattr__(self, "kv_skip", ())
        if any(not isinstance(i, int) or i < 0 for i in self.kv_skip):
            raise FP8ProbeError(f"KV layers to skip are layer indices >= 0, got {list(self.kv_skip)}")
        object.__setattr__(self, "kv_skip", tuple(sorted(set(self.kv_skip))))
        if self.fp8 is None:
            object.__setattr__(self, "fp8_units", ALL)
        if self.kv_scale not in KV_SCALES:
            raise FP8ProbeError(f"unknown KV-cache scales {self.kv_scale!r}; one of {', '.join(KV_SCALES)}")
        if self.stale is not None and self.stale < 0:
            raise FP8ProbeError(f"a stale lag is a whole number of steps >= 1, got {self.stale}")
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise FP8ProbeError(f"a noise level must be a finite number >= 0, got {self.noise}")

    def kinds(self) -> tuple[str, ...]:
        """The kinds of mismatch it holds, in the text's order: fp8, kv, stale, noise (() : nothing differs)."""
        return tuple(
            k
            for k, on in (
                ("fp8", self.fp8 is not None),
                ("kv", self.kv is not None),
                ("stale", self.stale is not None),
                ("noise", self.noise > 0),
            )
            if on
        )

    @property
    def name(self) -> str:
        parts = []
        if self.fp8 is not None:
            parts.append(f"fp8:{self.fp8}" + ("" if self.fp8_units == ALL else f"[{self.fp8_units}]"))
        if self.kv is not None:
            parts.append(
                f"kv:{self.kv}"
                + ("" if self.kv_scale == "unit" else f"@{self.kv_scale}")
                + (f"[skip:{','.join(map(str, self.kv_skip))}]" if self.kv_skip else "")
            )
        if self.stale is not None:
            parts.append(f"stale:{self.stale or '?'}")
        if self.noise > 0:
            parts.append(f"{self.noise:g}")
        return "+".join(parts) or "0"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str) -> RolloutConfig:
        """The configuration a text names (module docstring); a bad one fails in one line naming what is taken."""
        fields: dict = {}
        for part in str(text).strip().split("+"):
            _parse_part(part.strip(), text, fields)
        return cls(**fields)


def units_subset(units, every=None) -> str:
    """fp8_units of a configuration putting `units` (names) of `every` (the units the scheme fits; None: unknown) in
    FP8: ALL when it is all of them, else "N of M units <digest>" (the digest: sha256 of the sorted names, 8 hex
    digits)."""
    chosen = set(units)
    digest = hashlib.sha256("\n".join(sorted(chosen)).encode()).hexdigest()[:8]
    if every is None:
        return f"{len(chosen)} units {digest}"
    every = set(every)
    if chosen >= every:
        return ALL
    return f"{len(chosen & every)} of {len(every)} units {digest}"


def noise_level(part: str, text: str) -> float | None:
    """A bare number is a noise level (σ, each tensor's std times it): the number, None for any other text; a
    negative or infinite one is refused, naming `text` (the whole configuration)."""
    try:
        value = float(part)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        raise FP8ProbeError(f"`levels` {text}: a noise level must be a finite number >= 0")
    return value


def _parse_part(part: str, text: str, fields: dict) -> None:
    value = noise_level(part, text)
    if value is not None:
        _put(fields, "noise", value, text)
        return
    kind, _, arg = part.partition(":")
    if kind == "fp8":
        scheme, _, units = arg.partition("[")
        _put(fields, "fp8", scheme or "FP8_DYNAMIC", text)
        if units:
            fields["fp8_units"] = units.rstrip("]")
    elif kind == "kv":
        arg, _, skip = arg.partition("[")
        if skip:
            layers = skip.rstrip("]").removeprefix("skip:").split(",")
            if not skip.startswith("skip:") or not skip.endswith("]") or not all(s.isdigit() for s in layers):
                raise FP8ProbeError(f"`levels` {text}: a KV map is kv:DTYPE[skip:L,L,...] with layer indices L")
            fields["kv_skip"] = tuple(int(s) for s in layers)
        dtype, _, scale = arg.partition("@")
        _put(fields, "kv", dtype or "fp8", text)
        if scale:
            fields["kv_scale"] = scale
    elif kind == "stale":
        try:
            k = STALE_UNKNOWN if arg == "?" else int(arg)
        except ValueError:
            k = -1
        if k < 0 or (k == 0 and arg != "?"):
            raise FP8ProbeError(f"`levels` {text}: stale:K needs a whole number of steps K >= 1")
        _put(fields, "stale", k, text)
    else:
        raise FP8ProbeError(f"`levels` {text}: not a configuration; {HELP}")


def _put(fields: dict, key: str, value, text: str) -> None:
    if key in fields:
        raise FP8ProbeError(f"`levels` {text}: names {key} twice")
    fields[key] = value
