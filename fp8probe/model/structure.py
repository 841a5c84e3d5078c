"""A model's structure, from its config or its modules: the one source of units, fused groups, experts and KV geometry.

A *unit* is one weight that a recipe can put in FP8: a Linear inside a decoder block, or all experts of
one MoE layer (transformers stores them as one module holding 3-D weights). vLLM fuses some of them
(`packed_modules_mapping`): q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj, and every expert of a
layer shares one scheme. A recipe must keep each such *group* in one precision, so every unit carries
the name of its group. Embeddings, lm_head and MoE routers are listed too, but stay BF16. `meta_model`
gives the structure without weights (a bare config.json is enough), which is how bad input is refused
before any output exists.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch
from torch import nn

from ..core.errors import FP8ProbeError

log = logging.getLogger(__name__)


# model_type -> family; every one is tested on a tiny model built from its config (tests/model/test_student.py)
SUPPORTED = {
    "llama": "Llama / SmolLM",
    "mistral": "Mistral",
    "qwen2": "Qwen2 / Qwen2.5",
    "qwen3": "Qwen3",
    "gemma": "Gemma",
    "gemma2": "Gemma-2",
    "gemma3_text": "Gemma-3 (text)",
    "phi3": "Phi-3",
    "qwen3_moe": "Qwen3-MoE",
    "mixtral": "Mixtral",
}


# leaf module name -> (kind, the name vLLM's fused module gets, or None when it is not fused)
_KINDS = {
    "q_proj": ("q", "qkv_proj"),
    "k_proj": ("k", "qkv_proj"),
    "v_proj": ("v", "qkv_proj"),
    "qkv_proj": ("qkv", "qkv_proj"),
    "o_proj": ("o", None),
    "gate_proj": ("gate", "gate_up_proj"),
    "up_proj": ("up", "gate_up_proj"),
    "gate_up_proj": ("gate_up", "gate_up_proj"),
    "down_proj": ("down", None),
}


ROUTER_NAMES = ("gate", "router")  # leaf names of MoE routers (kept BF16 in every production FP8 setup)


EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")  # the Linears llm-compressor unpacks each expert into


@dataclass(frozen=True)
class Unit:
    """One weight a recipe can quantize (or, with quantizable=False, one that stays BF16)."""

    name: str  # module path, e.g. model.layers.0.self_attn.q_proj
    kind: str  # q k v o qkv gate up gate_up down expert | embed lm_head router
    block: int  # decoder block index; -1 outside the blocks
    group: str  # fused group as vLLM loads it, e.g. model.layers.0.self_attn.qkv_proj
    params: int
    shape: tuple[int, ...]  # weight shape: [out, in], or [experts, out, in] for an expert unit
    quantizable: bool = True


def fused_groups(units: list[Unit]) -> dict[str, list[Unit]]:
    """Fused group name (as vLLM loads it) -> its quantizable units, in model order."""
    out: dict[str, list[Unit]] = {}
    for u in units:
        if u.quantizable:
            out.setdefault(u.group, []).append(u)
    return out


def expert_linear_names(unit: str, num_experts: int) -> list[str]:
    """The Linear names llm-compressor gives the experts of one experts unit: `<unit>.<e>.<proj>`."""
    return [f"{unit}.{e}.{p}" for e in range(num_experts) for p in EXPERT_PROJS]


def expert_ignore_pattern(unit: str) -> str:
    """An llm-compressor ignore entry that keeps every expert of one experts unit in BF16."""
    return "re:^" + re.escape(unit) + r"\..*"


@dataclass(frozen=True)
class KVGeometry:
    """What the KV cache of one model looks like: per attention layer, K and V of kv_heads x head_dim."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def elements_per_token_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim  # K and V


def kv_geometry(config) -> KVGeometry:
    cfg = text_config(config)
    heads = cfg.num_attention_heads
    return KVGeometry(
        cfg.num_hidden_layers,
        getattr(cfg, "num_key_value_heads", None) or heads,
        getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
    )


def text_config(config):
    """The language model's config (multimodal configs nest it)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def layer_attention_types(cfg, hybrid: bool) -> list[int | None]:
    """Per layer: None for full attention, or the sliding window size as vLLM will use it."""
    n = cfg.num_hidden_layers
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        out = [window if t == "sliding_attention" else None for t in types]
        if any(t not in ("sliding_attention", "full_attention") for t in types):
            raise FP8ProbeError(
                f"layer types {sorted(set(types))} are not supported by the capacity model; "
                "pass `kv_cache_memory` and read vLLM's own log line"
            )
    elif window and getattr(cfg, "use_sliding_window", True):
        out = [window] * n
    else:
        out = [None] * n
    if not hybrid:  # --disable-hybrid-kv-cache-manager: sliding layers are allocated as full attention
        out = [None] * n
    return out


def meta_model(config):
    """The model built on the meta device: shapes and names, no memory, no weights."""
    from transformers import AutoModelForCausalLM

    check_supported(config)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _supported_list() -> str:
    return ", ".join(f"{v} ({k})" for k, v in SUPPORTED.items())


# config fields fp8probe computes with: each must be a positive integer when present (required: True)
_CONFIG_INTS = {
    "num_hidden_layers": True,
    "hidden_size": True,
    "num_attention_heads": True,
    "vocab_size": True,
    "num_key_value_heads": False,
    "head_dim": False,
    "intermediate_size": False,
    "max_position_embeddings": False,
    "sliding_window": False,
}


def check_supported(config) -> str:
    """The config's model_type, if fp8probe supports it and its sizes are sane; a one-line refusal otherwise."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        raise FP8ProbeError(f"unsupported architecture {model_type!r}; fp8probe supports {_supported_list()}")
    cfg = text_config(config)
    for key, required in _CONFIG_INTS.items():
        v = getattr(cfg, key, None)
        if v is None and not required:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise FP8ProbeError(
                f"the model config's {key} is {v!r}; it must be a positive integer: "
                "is this a real Hugging Face config.json?"
            )
    return model_type


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise FP8ProbeError(f"{type(model).__name__} has no model.layers; fp8probe supports {_supported_list()}")
    return layers


def list_units(model: nn.Module) -> list[Unit]:
    """Every quantizable weight in the decoder blocks, plus embeddings / lm_head / routers (kept BF16)."""
    check_supported(model.config)
    layers = decoder_layers(model)
    prefix = _module_path(model, layers)
    units: list[Unit] = []
    emb = model.get_input_embeddings()
    units.append(_unit(_module_path(model, emb), "embed", -1, emb.weight, quantizable=False))
    for b, layer in enumerate(layers):
        for sub, mod in layer.named_modules():
            if not sub:
                continue
            name = f"{prefix}.{b}.{sub}"
            leaf = sub.rsplit(".", 1)[-1]
            parent = name.rsplit(".", 1)[0]
            if is_experts(mod):
                params = mod.gate_up_proj.numel() + mod.down_proj.numel()
                units.append(Unit(name, "expert", b, name, params, tuple(mod.gate_up_proj.shape)))
            elif isinstance(mod, nn.Linear) and not _inside_experts(layer, sub):
                if leaf in _KINDS:
                    kind, fused = _KINDS[leaf]
                    group = f"{parent}.{fused}" if fused else name
                    units.append(_unit(name, kind, b, mod.weight, group=group))
                elif leaf in ROUTER_NAMES:
                    units.append(_unit(name, "router", b, mod.weight, quantizable=False))
                else:
                    units.append(_unit(name, "other", b, mod.weight))
            elif leaf in ROUTER_NAMES and hasattr(mod, "weight") and isinstance(mod.weight, nn.Parameter):
                units.append(_unit(name, "router", b, mod.weight, quantizable=False))
    head = model.get_output_embeddings()
    if head is not None and head.weight is not emb.weight:
        units.append(_unit(_module_path(model, head), "lm_head", -1, head.weight, quantizable=False))
    elif head is not None:
        # tied embeddings: listed (it is a GEMM in vLLM) but its weight is the embedding's
        units.append(
            Unit(
                _module_path(model, head),
                "lm_head",
                -1,
                _module_path(model, emb),
                0,
                tuple(head.weight.shape),
                quantizable=False,
            )
        )
    return units


def input_dim(unit: Unit) -> int:
    """The smallest input dim among the unit's GEMMs (experts: gate_up [E, 2I, H] takes H, down takes I)."""
    if unit.kind == "expert":
        return min(unit.shape[-1], unit.shape[-2] // 2)
    return unit.shape[-1]


def fp8_fits(student, scheme) -> tuple[str, ...]:
    """The units `scheme` can put in FP8 (groups its kernels refuse stay BF16, as in a sweep): "every unit"."""
    blocked = scheme_blockers(student.quantizable, scheme)
    return tuple(u.name for u in student.quantizable if u.group not in blocked)


def scheme_blockers(units: list[Unit], scheme) -> dict[str, str]:
    """fused group -> why `scheme` cannot quantize it, for the groups whose shapes its kernels refuse.

    FP8_BLOCK (as vLLM's block-FP8 kernels): each input dim in whole groups of 128 (per-token-group activation
    quantization), and in a fused group (q/k/v, gate/up) every output but the last in whole 128-row blocks.
    Other schemes take every shape."""
    out = {}
    g_in = scheme.input.group_size if scheme.input.strategy == "group" else None
    bn = scheme.weight.block[0] if scheme.weight.strategy == "block" else None
    for g, us in fused_groups(units).items():
        bad = [f"{u.name.rsplit('.', 1)[-1]} input dim {input_dim(u)}" for u in us if g_in and input_dim(u) % g_in]
        bad += [
            f"{u.name.rsplit('.', 1)[-1]} output dim {u.shape[-2]} (fused)" for u in us[:-1] if bn and u.shape[-2] % bn
        ]
        if bad:
            out[g] = f"{bad[0]} not a multiple of {g_in or bn}"
    return out


def check_scheme(config, scheme, partial: bool = False) -> dict[str, str]:
    """Refuse, from the config alone, a scheme this model's shapes cannot take (FP8_BLOCK on dims that are not
    whole groups of 128), before any weight is loaded or any output exists. With partial=True (a sweep) only
    a scheme that can take no group at all is refused; returns the fused groups it cannot take (not swept,
    BF16 in every recipe), after a warning naming them."""
    units = [u for u in list_units(meta_model(config)) if u.quantizable]
    blocked = scheme_blockers(units, scheme)
    groups = fused_groups(units)
    if blocked and (not partial or len(blocked) == len(groups)):
        scheme.check_input_dims({u.name: input_dim(u) for u in units})
        g, why = next(iter(blocked.items()))
        raise FP8ProbeError(
            f"{scheme.name} cannot quantize {'any' if partial else len(blocked)} of this model's "
            f"fused groups ({g}: {why}); use FP8_DYNAMIC"
        )
    if blocked:
        g, why = next(iter(blocked.items()))
        log.warning(
            "%s cannot quantize %d of this model's %d fused groups (%s: %s); they are not swept and stay "
            "BF16 in every recipe",
            scheme.name,
            len(blocked),
            len(groups),
            g,
            why,
        )
    return blocked


def _unit(name, kind, block, weight, group=None, quantizable=True) -> Unit:
    return Unit(name, kind, block, group or name, weight.numel(), tuple(weight.shape), quantizable)


def is_experts(mod: nn.Module) -> bool:
    """transformers >= 5 keeps all experts of a layer in one module with 3-D gate_up_proj / down_proj."""
    gu, dn = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    return isinstance(gu, nn.Parameter) and isinstance(dn, nn.Parameter) and gu.ndim == 3


def _inside_experts(layer: nn.Module, sub: str) -> bool:
    parts = sub.split(".")
    return any(is_experts(layer.get_submodule(".".join(parts[:i]))) for i in range(1, len(parts)))


def _module_path(model: nn.Module, target: nn.Module) -> str:
    for name, mod in model.named_modules():
        if mod is target:
            return name
    raise FP8ProbeError(f"module {type(target).__name__} not found in the model")
