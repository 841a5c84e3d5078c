"""The static scales a calibration measured (`Calibration`: input amax per unit and per expert input, K/V amax per
layer) and the real-token part of a padded batch they are measured on (`without_padding`). Data only: the
quantizers (quantize.py, attention.py) read it and calibration.py records it, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.errors import FP8ProbeError
from ..core.numerics import STORAGE_DTYPE, compute_scale
from ..core.schemes import QuantSpec


@dataclass
class Calibration:
    """Static scales measured on the rollouts: input amax per module (and per expert input), KV amax per layer.

    `valid` ([B, T] bool, set by whoever runs the batches while recording) marks the batch's real tokens: the
    left padding of a batch is not calibration data (llm-compressor calibrates on each sequence alone). `sequences`
    (set beside it) and `per_sequence`: record_calibration's per-sequence amax, where it was asked to keep them."""

    input_amax: dict[str, torch.Tensor]
    k_amax: dict[int, torch.Tensor]
    v_amax: dict[int, torch.Tensor]
    valid: torch.Tensor | None = field(default=None, repr=False, compare=False)
    sequences: torch.Tensor | None = field(default=None, repr=False, compare=False)  # the batch's sequence indices
    per_sequence: SequenceAmax | None = field(default=None, repr=False, compare=False)  # each sequence's own amax

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


SCALES_FILE = "scales.safetensors"  # a sweep directory's per-sequence static amax (SequenceAmax)
_SCALES_KIND, _SCALES_VERSION = "fp8probe per-sequence amax", "1"


@dataclass
class SequenceAmax:
    """The static amax of a calibration, kept per sequence of the rollouts it ran on: the Calibration of any subset
    of those sequences is their maximum (max is exact: bit for bit what a pass over the subset records, up to the
    fp32 rounding of the other sequences a batch pads them beside). `fp8probe sweep` keeps it (DIR/scales.safetensors)
    so that `fp8probe recipe` calibrates its search set without a pass of its own.

    input_amax: key (unit, or unit:which for an expert input) -> [N] per-tensor amax of each sequence's real tokens;
    k_amax / v_amax: layer -> [N, *the KV strategy's amax shape]; `rollouts`: the digest of the rollouts (sha256 of
    their tensors) the N sequences are."""

    input_amax: dict[str, torch.Tensor]
    k_amax: dict[int, torch.Tensor]
    v_amax: dict[int, torch.Tensor]
    kv_strategy: str
    rollouts: str

    def calibration(self, sequences) -> Calibration:
        """The Calibration of these sequences (indices into the rollouts) alone."""
        idx = torch.as_tensor(list(sequences), dtype=torch.int64)
        if idx.numel() == 0:
            raise ValueError("SequenceAmax.calibration: no sequences")

        def top(d):
            return {k: v[idx].amax(0) for k, v in d.items()}

        return Calibration(top(self.input_amax), top(self.k_amax), top(self.v_amax))

    def covers(self, units, kv_layers=(), kv_strategy: str = "tensor") -> bool:
        """Whether it holds every input amax these units (names) need and, with `kv_layers`, their K/V amax in
        `kv_strategy`."""
        kept = {k.split(":", 1)[0] for k in self.input_amax}  # a unit, or the expert unit of unit:which
        if not all(u in kept for u in units):
            return False
        layers = list(kv_layers)
        return not layers or (
            kv_strategy == self.kv_strategy and all(i in self.k_amax and i in self.v_amax for i in layers)
        )

    def write(self, path) -> None:
        from safetensors.torch import save

        from ..core.files import atomic_write_bytes

        tensors = {f"input/{k}": v.contiguous() for k, v in self.input_amax.items()}
        tensors |= {f"k/{i}": v.contiguous() for i, v in self.k_amax.items()}
        tensors |= {f"v/{i}": v.contiguous() for i, v in self.v_amax.items()}
        meta = {"kind": _SCALES_KIND, "version": _SCALES_VERSION, "kv_strategy": self.kv_strategy}
        atomic_write_bytes(path, save(tensors, metadata=meta | {"rollouts": self.rollouts}))

    @classmethod
    def read(cls, path) -> "SequenceAmax":
        """The file `write` wrote; FP8ProbeError if it is not one (unreadable, another kind or version)."""
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), "pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except (SafetensorError, OSError) as e:
            raise FP8ProbeError(f"{path} is unreadable ({e})") from e
        if (meta.get("kind"), meta.get("version")) != (_SCALES_KIND, _SCALES_VERSION):
            raise FP8ProbeError(f"{path} is not a per-sequence amax file of this fp8probe ({meta.get('kind')!r})")
        by = {"input": {}, "k": {}, "v": {}}
        for name, t in tensors.items():
            kind, _, key = name.partition("/")
            if kind not in by or t.ndim < 1:
                raise FP8ProbeError(f"{path} holds {name!r}, which a per-sequence amax file does not")
            by[kind][key if kind == "input" else int(key)] = t
        sizes = {t.shape[0] for d in by.values() for t in d.values()}
        if len(sizes) > 1:
            raise FP8ProbeError(f"{path} holds tensors of {len(sizes)} different numbers of sequences")
        return cls(by["input"], by["k"], by["v"], meta.get("kv_strategy", "tensor"), meta.get("rollouts", ""))

    @property
    def num_sequences(self) -> int:
        return next((t.shape[0] for d in (self.input_amax, self.k_amax, self.v_amax) for t in d.values()), 0)
