"""Where and in which dtype a student runs: a device that exists here, a dtype by name."""

from __future__ import annotations

import torch

from ..core.errors import FP8ProbeError


def check_device(device: str) -> torch.device:
    """A torch device that exists here; a one-line refusal otherwise."""
    if device == "auto":  # Accelerate's device_map: the model spread over this machine's GPUs
        if not torch.cuda.is_available():
            raise FP8ProbeError(
                "`device` auto spreads the model over CUDA GPUs, and none is available here; use `device` cpu"
            )
        return torch.device("cuda", 0)
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise FP8ProbeError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise FP8ProbeError(f"`device` {device}: no CUDA device is available here; use `device` cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise FP8ProbeError(f"`device` {device}: only {torch.cuda.device_count()} CUDA devices here")
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise FP8ProbeError(f"unsupported device {device!r}; use cpu or cuda")
    return dev


def parse_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "fp32": torch.float32,
        "float32": torch.float32,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }
    if str(dtype).lower() not in table:
        raise FP8ProbeError(f"unknown dtype {dtype!r}; supported: float32, bfloat16, float16")
    return table[str(dtype).lower()]
