"""KV-cache capacity, exact to vLLM's own accounting (V1 engine, vLLM 0.32), from a model config alone.

vLLM sizes its KV cache like this (vllm/v1/core/kv_cache_utils.py):

    page (one block of one layer)  = block_size x kv_heads_per_rank x (head_size_k + head_size_v) x dtype bytes
    layers are grouped by attention type (full / sliding window); hybrid models get groups of equal size
    bytes_per_block                = largest group's layer count x page
    num_blocks                     = available_memory // bytes_per_block
    blocks a request needs         = sum over groups: full -> ceil(max_model_len / block_size);
                                     sliding window W -> ceil(min(W - 1 + in_flight, max_model_len) / block_size) + 1
    max_concurrency                = num_blocks / blocks a request needs
    KV cache size (tokens)         = int(max_concurrency x max_model_len)   (printed as "KV cache size: N tokens")

available_memory is --kv-cache-memory bytes when given (VLLM_CPU_KVCACHE_SPACE GiB on the CPU backend);
otherwise total x gpu_memory_utilization - weights - reserve, where fp8probe's reserve estimate is

    activations  max_num_batched_tokens x (2 x intermediate + 4 x hidden) x 2 bytes   (the widest transient
                 of a decoder block during vLLM's profiling run)
    sampler      max_num_seqs x vocab x 4 bytes x 2                                    (fp32 logits + probs)
    non-torch    0.5 GiB                                                              (CUDA context, NCCL, cuBLAS)

an estimate (vLLM profiles it); override it with reserve_bytes / --reserve-gib, or pass the exact KV bytes.

Weight bytes per GPU: FP8 units 1 byte per weight plus their fp32 scales as vLLM holds them (per tensor,
per output channel or per 128x128 block; one more per module for a static input scale), BF16 units 2
bytes, everything else (embeddings, lm_head, norms, routers) as stored, tied embeddings once; Linear
weights split over tensor-parallel ranks (K/V heads replicated when there are fewer than ranks), the
vocabulary padded to a multiple of 64 and split, norms replicated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import FP8ProbeError
from .fp8 import Scheme, num_scales

GiB = 1 << 30

# total device memory as nvidia-smi reports it (MiB)
GPUS = {
    "H100": 81559, "H100-80GB": 81559,
    "H200": 143771,
    "A100-40GB": 40960,
    "A100-80GB": 81920, "A100": 81920,
    "L40S": 46068,
    "B200": 183359,
    "RTX4090": 24564, "RTX-4090": 24564,
}

KV_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
NON_TORCH_BYTES = GiB // 2


@dataclass(frozen=True)
class Precision:
    """Which units are FP8, in which scheme (None: everything BF16)."""

    scheme: Scheme | None = None
    fp8_units: frozenset = frozenset()
    static_input: bool = False


def gpu_bytes(name: str) -> int:
    key = name.strip().upper().replace(" ", "-").replace("_", "-")
    key = {k.upper(): k for k in GPUS}.get(key)
    if key is None:
        raise FP8ProbeError(f"unknown GPU {name!r}; presets: {', '.join(sorted(set(GPUS)))}; or pass --gpu-memory GiB")
    return GPUS[key] * (1 << 20)


def load_config_only(model: str | None, trust_remote_code: bool = False, allow_pickle: bool = False):
    """A config from a model dir / id / .gguf, a bare config.json, or a directory holding only one."""
    from transformers import AutoConfig

    if model is not None:
        p = Path(model).expanduser()
        if p.is_file() and p.suffix == ".json":
            import json

            try:
                d = json.loads(p.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise FP8ProbeError(f"{model} is not valid JSON ({e}); pass a Hugging Face config.json") from e
            if not isinstance(d, dict) or "model_type" not in d:
                raise FP8ProbeError(f"{model} has no model_type; pass a Hugging Face config.json")
            from .student import one_line

            try:
                return AutoConfig.for_model(**d)
            except Exception as e:  # transformers validates configs with assorted exception types
                raise FP8ProbeError(f"{model} is not a config transformers accepts: {one_line(e)}") from e
    from .student import load_config

    return load_config(model, trust_remote_code, allow_pickle)


def _text_config(cfg):
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def meta_model(cfg):
    """The model built on the meta device: shapes and names, no memory, no weights."""
    from transformers import AutoModelForCausalLM

    from .student import check_supported

    check_supported(cfg)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def _storage_bytes(cfg) -> int:
    dt = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None) or torch.bfloat16
    if isinstance(dt, str):
        dt = getattr(torch, dt.replace("torch.", ""), torch.bfloat16)
    return torch.empty(0, dtype=dt).element_size()


def weight_bytes_per_gpu(model, precision: Precision, tp: int = 1) -> int:
    """Weight memory one tensor-parallel rank holds in vLLM (see module docstring)."""
    from .student import list_units

    cfg = _text_config(model.config)
    store = _storage_bytes(cfg)
    units = {u.name: u for u in list_units(model)}
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    kv_rank = max(1, kv_heads // tp) if kv_heads else None
    total = 0.0
    counted = set()
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in counted:
                continue  # tied embeddings: once
            counted.add(id(p))
            unit = units.get(name)
            n = p.numel()
            if unit is not None and unit.kind in ("embed", "lm_head"):
                padded = math.ceil(cfg.vocab_size / 64) * 64
                total += padded * p.shape[1] * store / tp
                continue
            shard = tp
            if unit is not None and unit.kind in ("k", "v") and kv_heads:
                shard = kv_heads / kv_rank  # K/V heads are replicated when tp > kv_heads
            if unit is None or unit.kind == "router" or p.ndim < 2:
                total += n * store  # norms, routers, biases: replicated
                continue
            if precision.scheme is not None and name in precision.fp8_units:
                spec = precision.scheme.weight
                mats = p.shape[0] if p.ndim == 3 else 1
                scales = mats * num_scales(tuple(p.shape[-2:]), spec)
                total += (n * 1 + scales * 4) / shard
                if precision.static_input and pname in ("weight", "gate_up_proj"):
                    total += 4
            else:
                total += n * store / shard
    return int(total)


def _layer_attention_types(cfg, hybrid: bool) -> list[int | None]:
    """Per layer: None for full attention, or the sliding window size as vLLM will use it."""
    n = cfg.num_hidden_layers
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        out = [window if t == "sliding_attention" else None for t in types]
        if any(t not in ("sliding_attention", "full_attention") for t in types):
            raise FP8ProbeError(f"layer types {sorted(set(types))} are not supported by the capacity model; "
                                "pass --kv-cache-memory and read vLLM's own log line")
    elif window and getattr(cfg, "use_sliding_window", True):
        out = [window] * n
    else:
        out = [None] * n
    if not hybrid:  # --disable-hybrid-kv-cache-manager: sliding layers are allocated as full attention
        out = [None] * n
    return out


def kv_layout(cfg, kv_dtype: str, tp: int = 1, block_size: int = 16, hybrid: bool = True) -> dict:
    """Per-layer page size, groups and bytes per token, as vLLM lays out the KV cache."""
    cfg = _text_config(cfg)
    if kv_dtype not in KV_DTYPE_BYTES:
        raise FP8ProbeError(f"unknown KV-cache dtype {kv_dtype!r}; supported: {', '.join(KV_DTYPE_BYTES)}")
    dtype_bytes = KV_DTYPE_BYTES[kv_dtype] or _storage_bytes(cfg)
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_rank = max(1, kv_heads // tp)
    page = block_size * kv_rank * 2 * head_dim * dtype_bytes
    types = _layer_attention_types(cfg, hybrid)
    buckets: dict = {}
    for i, t in enumerate(types):
        buckets.setdefault(t, []).append(i)
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    groups = []  # (window or None, layer indices)
    for t, layers in buckets.items():
        k = math.ceil(len(layers) / group_size)
        groups += [(t, layers[i::k]) for i in range(k)]
    return {"page_bytes": page, "groups": groups, "group_size": group_size, "block_size": block_size,
            "dtype_bytes": dtype_bytes, "kv_heads_per_rank": kv_rank, "head_dim": head_dim,
            "bytes_per_token": 2 * len(types) * kv_rank * head_dim * dtype_bytes,
            "bytes_per_block": max(len(layers) for _, layers in groups) * page}


def kv_capacity(layout: dict, kv_memory_bytes: int, max_model_len: int, max_in_flight_tokens: int = 8192) -> dict:
    """Blocks, tokens and concurrency for a KV memory budget (vLLM's get_kv_cache_capacity)."""
    bs = layout["block_size"]
    num_blocks = max(0, int(kv_memory_bytes) // layout["bytes_per_block"])
    per_request = 0
    for window, _ in layout["groups"]:
        if window is None:
            per_request += math.ceil(max_model_len / bs)
        else:
            per_request += math.ceil(min(window - 1 + max_in_flight_tokens, max_model_len) / bs) + 1
    conc = num_blocks / per_request
    return {"num_blocks": num_blocks, "blocks_per_request": per_request, "max_concurrency": conc,
            "kv_tokens": int(conc * max_model_len)}


def reserve_estimate(cfg, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> int:
    cfg = _text_config(cfg)
    inter = getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size
    act = max_num_batched_tokens * (2 * inter + 4 * cfg.hidden_size) * 2
    sampler = max_num_seqs * cfg.vocab_size * 4 * 2
    return act + sampler + NON_TORCH_BYTES


def capacity(model=None, precision: Precision | None = None, kv_cache_dtype: str = "fp8", gpu: str | None = "H100",
             gpu_memory_gib: float | None = None, gpu_memory_utilization: float = 0.9,
             kv_cache_memory: int | None = None, max_model_len: int | None = None, tensor_parallel_size: int = 1,
             block_size: int = 16, reserve_bytes: int | None = None, max_num_batched_tokens: int = 8192,
             max_num_seqs: int = 256, hybrid: bool = True, max_in_flight_tokens: int | None = None,
             trust_remote_code: bool = False) -> dict:
    """BF16 (auto KV) vs a candidate (FP8 units per `precision`, KV in `kv_cache_dtype`), side by side.

    `model` is anything load_config_only takes, or an already-loaded transformers config.
    Without `precision`, the candidate puts every quantizable unit in FP8_DYNAMIC.
    """
    cfg = model if hasattr(model, "model_type") else load_config_only(model, trust_remote_code)
    tcfg = _text_config(cfg)
    tp = int(tensor_parallel_size)
    if tp < 1:
        raise FP8ProbeError("--tensor-parallel-size must be at least 1")
    if tcfg.num_attention_heads % tp:
        raise FP8ProbeError(f"{tcfg.num_attention_heads} attention heads do not split over {tp} ranks")
    if not 0 < gpu_memory_utilization <= 1:
        raise FP8ProbeError("--gpu-memory-utilization must be in (0, 1]")
    max_len = int(max_model_len or getattr(tcfg, "max_position_embeddings", 0) or 0)
    if max_len < 1:
        raise FP8ProbeError("the config has no max_position_embeddings; pass --max-model-len")
    meta = meta_model(cfg)
    if precision is None:
        from .student import list_units

        precision = Precision(Scheme.from_name("FP8_DYNAMIC"),
                              frozenset(u.name for u in list_units(meta) if u.quantizable))
    in_flight = max_in_flight_tokens if max_in_flight_tokens is not None else max_num_batched_tokens
    sides = {}
    for side, prec, kvd in (("baseline", Precision(), "auto"), ("candidate", precision, kv_cache_dtype)):
        weights = weight_bytes_per_gpu(meta, prec, tp)
        layout = kv_layout(tcfg, kvd, tp, block_size, hybrid)
        if kv_cache_memory is not None:
            kv_mem = int(kv_cache_memory)
            source = "kv_cache_memory"
        else:
            total = (gpu_memory_gib * GiB) if gpu_memory_gib is not None else gpu_bytes(gpu or "H100")
            reserve = reserve_bytes if reserve_bytes is not None else reserve_estimate(tcfg, max_num_batched_tokens,
                                                                                     max_num_seqs)
            kv_mem = int(total * gpu_memory_utilization - weights - reserve)
            source = "estimate"
            if kv_mem <= 0:
                raise FP8ProbeError(f"the {side} weights ({weights / GiB:.1f} GiB per GPU) leave no room for a KV "
                                    "cache; use more GPUs (--tensor-parallel-size) or a larger --gpu-memory")
        cap = kv_capacity(layout, kv_mem, max_len, in_flight)
        sides[side] = {
            "weight_bytes": weights, "kv_bytes_per_token": layout["bytes_per_token"], "kv_memory_bytes": kv_mem,
            "num_blocks": cap["num_blocks"], "kv_tokens": cap["kv_tokens"],
            "max_concurrency": cap["max_concurrency"], "kv_cache_dtype": kvd,
            "blocks_per_request": cap["blocks_per_request"], "bytes_per_block": layout["bytes_per_block"],
            "kv_memory_source": source,
            "fp8_units": len(prec.fp8_units), "scheme": prec.scheme.name if prec.scheme else None,
        }
    b, c = sides["baseline"], sides["candidate"]
    return {
        "schema_version": 1, "model_type": tcfg.model_type, "max_model_len": max_len, "block_size": block_size,
        "tensor_parallel_size": tp,
        "gpu": None if kv_cache_memory is not None else (f"{gpu_memory_gib} GiB" if gpu_memory_gib else gpu),
        "gpu_memory_utilization": gpu_memory_utilization,
        "baseline": b, "candidate": c,
        "ratio_kv_tokens": c["kv_tokens"] / b["kv_tokens"] if b["kv_tokens"] else math.inf,
        "ratio_concurrency": c["max_concurrency"] / b["max_concurrency"] if b["max_concurrency"] else math.inf,
    }
