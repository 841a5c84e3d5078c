"""KV-cache capacity, exact to vLLM's own accounting (V1 engine, vLLM 0.32), from a model config alone.

vLLM sizes its KV cache like this (vllm/v1/core/kv_cache_utils.py):

    page (one block of one layer)  = block_size x kv_heads_per_rank x ((head_size_k + head_size_v) x dtype bytes
                                     + 2 x 4 bytes of fp32 scales for the *_per_token_head dtypes)
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
from typing import NamedTuple

from ..core.errors import FP8ProbeError
from ..core.records import CapacityRecord
from ..core.schemes import VLLM_VERSION, num_scales
from ..core.units import GiB
from ..model.structure import kv_geometry, layer_attention_types, list_units, meta_model, text_config
from ..model.student import load_config
from ..recipe.recipe import Recipe
from .serving import KV_DTYPE_BYTES, KV_SCALE_BYTES, NON_TORCH_BYTES, Serving


def _storage_bytes(cfg) -> int:
    """Bytes per element of the model dtype vLLM serves the config in (`dtype auto`): the config's, but a float32
    config downcast to the platform's first dtype, bfloat16 on the GPUs of the table (vllm/config/model.py
    _resolve_auto_dtype: "Downcast for float32 models")."""
    import torch

    dt = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None) or torch.bfloat16
    if isinstance(dt, str):
        dt = getattr(torch, dt.replace("torch.", ""), torch.bfloat16)
    return 2 if dt == torch.float32 else torch.empty(0, dtype=dt).element_size()


def weight_bytes_per_gpu(model, recipe=None, tp: int = 1) -> int:
    """Weight memory one tensor-parallel rank holds in vLLM with `recipe` (None: all BF16); see the docstring."""
    return int(sum(w.bytes for w in weight_records(model, recipe, tp)))


@dataclass(frozen=True)
class Weight:
    """One parameter as one tensor-parallel rank holds it in vLLM: its share of the values and bytes (scales
    included), whether it is FP8, and what a decode step does with it (throughput.py reads these)."""

    name: str
    kind: str | None  # the unit's kind (q, down, expert, embed, lm_head, router), None for norms and biases
    params: float  # values on this rank
    bytes: float  # bytes on this rank, FP8 scales included
    fp8: bool
    experts: int = 0  # a fused expert tensor [E, ...]: E (a token reads num_experts_per_tok of them)
    matmul: bool = True  # multiplies every token's activations (False: norms, biases, the input embedding lookup)


def weight_records(model, recipe=None, tp: int = 1) -> list[Weight]:
    """Every parameter of `model` (tied ones once) as one rank holds it with `recipe`'s FP8 units (see the module
    docstring for the rules)."""
    cfg = text_config(model.config)
    store = _storage_bytes(cfg)
    units = {u.name: u for u in list_units(model)}
    fp8 = {u.name for u in recipe.fp8_units(list(units.values()))} if recipe is not None else set()
    scheme = recipe.preset if recipe is not None else None
    kv_heads = kv_geometry(cfg).num_kv_heads
    kv_rank = max(1, kv_heads // tp) if kv_heads else None
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    out: list[Weight] = []
    counted = set()
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in counted:
                continue  # tied embeddings: once
            counted.add(id(p))
            unit = units.get(name)
            kind = unit.kind if unit is not None else None
            n = p.numel()
            if kind in ("embed", "lm_head"):
                padded = math.ceil(cfg.vocab_size / 64) * 64
                per_rank = padded * p.shape[1] / tp
                out.append(Weight(name, kind, per_rank, per_rank * store, False, matmul=kind == "lm_head" or tied))
                continue
            shard = tp
            if kind in ("k", "v") and kv_heads:
                shard = kv_heads / kv_rank  # K/V heads are replicated when tp > kv_heads
            if unit is None or kind == "router" or p.ndim < 2:  # norms, routers, biases: replicated
                out.append(Weight(name, kind, n, n * store, False, matmul=kind == "router"))
                continue
            experts = p.shape[0] if p.ndim == 3 else 0
            if name in fp8:
                mats = p.shape[0] if p.ndim == 3 else 1
                scales = mats * num_scales(tuple(p.shape[-2:]), scheme.weight)
                b = (n * 1 + scales * 4) / shard
                if scheme.static_input and pname in ("weight", "gate_up_proj"):
                    b += 4
                out.append(Weight(name, kind, n / shard, b, True, experts))
            else:
                out.append(Weight(name, kind, n / shard, n * store / shard, False, experts))
    return out


def kv_layout(
    cfg, kv_dtype: str, tp: int = 1, block_size: int = 16, hybrid: bool = True, skip: tuple[int, ...] = ()
) -> dict:
    """Per-layer page size, groups and bytes per token, as vLLM lays out the KV cache; `skip`: layers whose KV
    cache stays in the model dtype (vLLM's kv_cache_dtype_skip_layers, a mixed cache: _mixed_layout)."""
    cfg = text_config(cfg)
    if kv_dtype not in KV_DTYPE_BYTES:
        raise FP8ProbeError(f"unknown KV-cache dtype {kv_dtype!r}; supported: {', '.join(KV_DTYPE_BYTES)}")
    dtype_bytes = KV_DTYPE_BYTES[kv_dtype] or _storage_bytes(cfg)
    geo = kv_geometry(cfg)
    kv_heads, head_dim = geo.num_kv_heads, geo.head_dim
    kv_rank = max(1, kv_heads // tp)
    per_head_token = int(2 * head_dim * dtype_bytes) + 2 * KV_SCALE_BYTES.get(kv_dtype, 0)  # K and V of one head
    types = layer_attention_types(cfg, hybrid)
    if skip and not hybrid and any(w is not None for w in layer_attention_types(cfg, True)):
        raise FP8ProbeError(
            "a mixed KV cache with sliding-window layers is modelled with vLLM's hybrid KV-cache manager only; "
            "drop --disable-hybrid-kv-cache-manager or read vLLM's own `KV cache size` log line"
        )
    if skip and KV_DTYPE_BYTES[kv_dtype] is not None:
        model_token = int(2 * head_dim * _storage_bytes(cfg))  # a skipped layer: K and V of one head, model dtype
        return _mixed_layout(types, set(skip), kv_rank, per_head_token, model_token, block_size, dtype_bytes, head_dim)
    page = block_size * kv_rank * per_head_token
    groups, group_size = _vllm_groups([(t, False, block_size) for t in types])
    return {
        "page_bytes": page,
        "groups": groups,
        "group_size": group_size,
        "block_size": block_size,
        "dtype_bytes": dtype_bytes,
        "kv_heads_per_rank": kv_rank,
        "head_dim": head_dim,
        "bytes_per_token": len(types) * kv_rank * per_head_token,
        "bytes_per_block": max(len(g.layers) for g in groups) * page,
    }


SMALLEST_KERNEL_BLOCK = 16  # the smallest block vLLM's CUDA attention backends take (FlashAttention, Triton:
# MultipleOf(16); FlashInfer: 16, 32, 64): what a mixed cache's block size is aligned with


class KVGroup(NamedTuple):
    """One KV-cache group as vLLM's block tables hold it: its attention (None: full, else the sliding window), its
    layers, and the tokens one of its blocks holds."""

    window: int | None
    layers: list[int]
    block_size: int


def _vllm_groups(specs: list[tuple]) -> tuple[list[KVGroup], int]:
    """vLLM's KV-cache groups (v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size) from each layer's
    spec, a (window, skipped, block size) tuple: layers of one spec form a bucket; the group size is the smallest
    bucket's (the largest's when under 1.5x of it), and a bucket of n layers makes ceil(n / size) groups, layers[i::k]
    each. Returns (the groups, the group size)."""
    buckets: dict = {}
    for i, spec in enumerate(specs):
        buckets.setdefault(spec, []).append(i)
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    groups = []
    for (window, _, block), layers in buckets.items():
        k = math.ceil(len(layers) / group_size)
        groups += [KVGroup(window, layers[j::k], block) for j in range(k)]
    return groups, group_size


def _mixed_layout(
    types, skip: set, kv_rank: int, fp8_token: int, model_token: int, block_size: int, dtype_bytes, head_dim
):
    """A mixed KV cache as vLLM 0.32 lays it out on a CUDA platform, Triton's or FlashAttention's kernel blocks
    (MultipleOf(16)). platforms/interface.py _align_heterogeneous_kv_block_size: with the primary (FP8) page per
    token P1 and the skipped layers' P2 > P1, the block size grows to A x ceil(16 P2 / (A P1)), A = max(16,
    block_size), so that one FP8 page covers a 16-token page of the model dtype; the shared page is block x P1.

    Full attention only: every layer has that block size and its own page (block x its per-token bytes), all in one
    group (UniformTypeKVCacheSpecs: its page is their sum), and a request needs ceil(max_model_len / block) blocks.

    With sliding-window layers (model_executor/layers/attention/attention.py get_kv_cache_spec): every sliding layer,
    FP8 or skipped, pads its page to the shared page and takes the largest multiple of 16 tokens whose page fits it
    (_largest_kernel_block_within); v1/core/kv_cache_utils.py then unifies the page sizes (a page that divides the
    largest grows its block; a padded page cannot grow: vLLM 0.32 fails an assertion, so a skipped full-attention
    layer, whose unpadded page is twice the shared one, is refused here) and groups layers of identical specs
    (_get_kv_cache_groups_uniform_page_size: the smallest bucket's size, or the largest's when under 1.5x of it;
    layers[i::k] per group); a block is group size x the shared page."""
    n = len(types)
    bad = sorted(i for i in skip if not 0 <= i < n)
    if bad:
        raise FP8ProbeError(f"the KV map skips layer {bad[0]}, but the model has {n} layers (0..{n - 1})")
    p1, p2 = kv_rank * fp8_token, kv_rank * model_token
    if p2 > p1:
        a = max(SMALLEST_KERNEL_BLOCK, block_size)
        block_size = max(block_size, a * math.ceil(p2 * SMALLEST_KERNEL_BLOCK / (a * p1)))
    per_token = sum(p2 if i in skip else p1 for i in range(n))
    common = {
        "block_size": block_size,
        "dtype_bytes": dtype_bytes,
        "kv_heads_per_rank": kv_rank,
        "head_dim": head_dim,
        "bytes_per_token": per_token,
        "skipped_layers": sorted(skip),
    }
    if all(t is None for t in types):
        return common | {
            "page_bytes": block_size * p1,
            "groups": [KVGroup(None, list(range(n)), block_size)],
            "group_size": n,
            "bytes_per_block": block_size * per_token,
        }
    shared = block_size * p1 if p2 > p1 else None
    specs = []  # per layer: (window, skipped, block, page bytes, padded)
    for i, w in enumerate(types):
        per = p2 if i in skip else p1
        if w is None:
            specs.append((w, i in skip, block_size, block_size * per, False))
            continue
        budget = shared or per * block_size
        fit = max(SMALLEST_KERNEL_BLOCK, budget // per // SMALLEST_KERNEL_BLOCK * SMALLEST_KERNEL_BLOCK)
        sw_block = fit if fit * per <= budget else SMALLEST_KERNEL_BLOCK
        specs.append((w, i in skip, sw_block, shared or sw_block * per, shared is not None))
    largest = max(s[3] for s in specs)
    unified = []
    for i, (w, sk, blk, page, padded) in enumerate(specs):
        if page < largest and largest % page == 0:
            if padded:
                raise FP8ProbeError(
                    f"vLLM {VLLM_VERSION} cannot lay out this KV map: layer {i}'s sliding-window page is padded to "
                    f"{page:,} bytes while a skipped full-attention layer's page is {largest:,} (an assertion in "
                    "unify_kv_cache_spec_page_size); on a model with sliding-window layers keep every full-attention "
                    "layer's KV cache in FP8"
                )
            blk, page = blk * (largest // page), largest
        unified.append((w, sk, blk))
    groups, group_size = _vllm_groups(unified)
    return common | {
        "page_bytes": largest,
        "groups": groups,
        "group_size": group_size,
        "bytes_per_block": group_size * largest,
    }


def kv_capacity(layout: dict, kv_memory_bytes: int, max_model_len: int, max_in_flight_tokens: int = 8192) -> dict:
    """Blocks, tokens and concurrency for a KV memory budget (vLLM's get_kv_cache_capacity)."""
    num_blocks = max(0, int(kv_memory_bytes) // layout["bytes_per_block"])
    per_request = 0
    for window, _, bs in layout["groups"]:
        if window is None:
            per_request += math.ceil(max_model_len / bs)
        else:
            per_request += math.ceil(min(window - 1 + max_in_flight_tokens, max_model_len) / bs) + 1
    conc = num_blocks / per_request
    return {
        "num_blocks": num_blocks,
        "blocks_per_request": per_request,
        "max_concurrency": conc,
        "kv_tokens": int(conc * max_model_len),
    }


def reserve_estimate(cfg, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> int:
    cfg = text_config(cfg)
    inter = getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size
    act = max_num_batched_tokens * (2 * inter + 4 * cfg.hidden_size) * 2
    sampler = max_num_seqs * cfg.vocab_size * 4 * 2
    return act + sampler + NON_TORCH_BYTES


def capacity(
    model=None,
    recipe=None,
    kv_cache_dtype: str = "fp8",
    serving: Serving | None = None,
    trust_remote_code: bool = False,
    **serving_fields,
) -> CapacityRecord:
    """BF16 (auto KV) vs a candidate (the recipe's FP8 units, KV in `kv_cache_dtype`), side by side.

    `model` is anything student.load_config takes (a bare config.json too), or a loaded transformers config.
    Without a recipe, the candidate puts every quantizable unit in FP8_DYNAMIC. vLLM's knobs come as a
    Serving, or as its fields (gpu="H200", max_model_len=32768, ...).
    """
    serving = serving or Serving(**serving_fields)
    cfg = model if hasattr(model, "model_type") else load_config(model, trust_remote_code)
    tcfg = text_config(cfg)
    tp = serving.tensor_parallel_size
    if tcfg.num_attention_heads % tp:
        raise FP8ProbeError(f"{tcfg.num_attention_heads} attention heads do not split over {tp} ranks")
    max_len = int(serving.max_model_len or getattr(tcfg, "max_position_embeddings", 0) or 0)
    if max_len < 1:
        raise FP8ProbeError("the config has no max_position_embeddings; pass `max_model_len`")
    meta = meta_model(cfg)
    units = list_units(meta)
    if recipe is None:
        recipe = Recipe.whole_model(units, "FP8_DYNAMIC")
    sides = {
        side: kv_pool(tcfg, meta, rec, kvd, serving, max_len, side)
        for side, rec, kvd in (("baseline", None, "auto"), ("candidate", recipe, kv_cache_dtype))
    }
    for side, rec in (("baseline", None), ("candidate", recipe)):
        sides[side]["fp8_units"] = len(rec.fp8_units(units)) if rec is not None else 0
        sides[side]["scheme"] = rec.scheme if rec is not None else None
        del sides[side]["groups"], sides[side]["block_size"]  # the layout, for throughput.simulate only
    b, c = sides["baseline"], sides["candidate"]
    gpu = serving.gpu
    return CapacityRecord(
        vllm_version=VLLM_VERSION,
        model_type=tcfg.model_type,
        max_model_len=max_len,
        block_size=serving.block_size,
        tensor_parallel_size=tp,
        gpu=None
        if serving.kv_cache_memory is not None
        else (f"{serving.gpu_memory_gib} GiB" if serving.gpu_memory_gib else gpu),
        gpu_memory_utilization=serving.gpu_memory_utilization,
        baseline=b,
        candidate=c,
        ratio_kv_tokens=c["kv_tokens"] / b["kv_tokens"] if b["kv_tokens"] else math.inf,
        ratio_concurrency=c["max_concurrency"] / b["max_concurrency"] if b["max_concurrency"] else math.inf,
    )


def kv_pool(tcfg, meta, recipe, kv_cache_dtype: str, serving: Serving, max_len: int, side: str = "candidate") -> dict:
    """One configuration's weights, KV layout and KV pool (blocks, tokens, concurrency at `max_len`) as vLLM sizes
    them: the weights of `recipe` (None: BF16) on `meta` (the model on the meta device), the KV cache in
    `kv_cache_dtype`, vLLM started as `serving`."""
    tp = serving.tensor_parallel_size
    in_flight = (
        serving.max_in_flight_tokens if serving.max_in_flight_tokens is not None else serving.max_num_batched_tokens
    )
    weights = weight_bytes_per_gpu(meta, recipe, tp)
    skip = tuple(recipe.kv_skip_layers) if recipe is not None else ()
    layout = kv_layout(tcfg, kv_cache_dtype, tp, serving.block_size, serving.hybrid, skip)
    if serving.kv_cache_memory is not None:
        kv_mem = int(serving.kv_cache_memory)
        source = "kv_cache_memory"
    else:
        reserve = (
            serving.reserve_bytes
            if serving.reserve_bytes is not None
            else reserve_estimate(tcfg, serving.max_num_batched_tokens, serving.max_num_seqs)
        )
        kv_mem = int(serving.total_bytes * serving.gpu_memory_utilization - weights - reserve)
        source = "estimate"
        if kv_mem <= 0:
            raise FP8ProbeError(
                f"the {side} weights ({weights / GiB:.1f} GiB per GPU) leave no room for a KV "
                "cache; use more GPUs (`tensor_parallel_size`) or a larger `gpu_memory_gib`"
            )
    cap = kv_capacity(layout, kv_mem, max_len, in_flight)
    return {
        "weight_bytes": weights,
        "kv_bytes_per_token": layout["bytes_per_token"],
        "kv_memory_bytes": kv_mem,
        "num_blocks": cap["num_blocks"],
        "kv_tokens": cap["kv_tokens"],
        "max_concurrency": cap["max_concurrency"],
        "kv_cache_dtype": kv_cache_dtype,
        "blocks_per_request": cap["blocks_per_request"],
        "bytes_per_block": layout["bytes_per_block"],
        "kv_memory_source": source,
        "groups": layout["groups"],
        "block_size": layout["block_size"],
        **({"kv_skip_layers": layout["skipped_layers"], "kv_block_size": layout["block_size"]} if skip else {}),
    }


def format_report(rep: CapacityRecord) -> str:
    """The side-by-side table `fp8probe capacity` prints."""
    b, c = rep.baseline, rep.candidate
    cand = f"{c['scheme'] or 'BF16'} ({c['fp8_units']} units) + {c['kv_cache_dtype']} KV"
    where = rep.gpu or "--kv-cache-memory"
    lines = [
        f"{rep.model_type}, max_model_len {rep.max_model_len:,}, block size {rep.block_size}, "
        f"TP {rep.tensor_parallel_size}, {where}; vLLM {rep.vllm_version} accounting",
        f"{'':<24}{'BF16 + auto KV':>20}{cand:>40}{'ratio':>9}",
    ]

    def row(name, key, fmt, ratio=False):
        r = f"{c[key] / b[key]:>8.2f}x" if ratio and b[key] else ""
        lines.append(f"{name:<24}{fmt(b[key]):>20}{fmt(c[key]):>40}{r:>9}")

    row("weights per GPU", "weight_bytes", lambda v: f"{v / GiB:.2f} GiB")
    row("KV bytes per token", "kv_bytes_per_token", lambda v: f"{v:,}")
    row("KV memory", "kv_memory_bytes", lambda v: f"{v / GiB:.2f} GiB")
    row("KV blocks", "num_blocks", lambda v: f"{v:,}")
    row("KV tokens", "kv_tokens", lambda v: f"{v:,}", ratio=True)
    row("max concurrency", "max_concurrency", lambda v: f"{v:.2f}x", ratio=True)
    if c.get("kv_skip_layers"):
        lines.append(
            f"the candidate's KV cache is mixed: layers {', '.join(map(str, c['kv_skip_layers']))} BF16, so vLLM "
            f"aligns its blocks to {c['kv_block_size']} tokens (an FP8 page covers a 16-token BF16 page)"
        )
    return "\n".join(lines)
