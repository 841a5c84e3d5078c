"""Demo students made from a teacher: a depth-pruned copy initialised from its weights (Minitron-style).

`pruned:K` names one wherever a model is asked for: the embedded student with every K-th decoder block kept
(`fp8probe calibrate --student pruned:K` trains it; `fp8probe check pruned:K` checks a configuration of it against
the budget calibrated on it)."""

from __future__ import annotations

import copy
import re

from torch import nn

from ..core.errors import FP8ProbeError
from .structure import decoder_layers, text_config


def depth_pruned(model: nn.Module, every: int = 2) -> nn.Module:
    """A depth-pruned copy of `model`, initialised from its weights (Minitron-style): decoder blocks 0, every,
    2·every, ... kept, the embeddings, final norm and head copied; the rest dropped. The teacher is untouched."""
    if every < 2:
        raise FP8ProbeError("a depth-pruned student keeps every k-th block for k >= 2")
    n = len(decoder_layers(model))
    keep = list(range(0, n, every))
    if len(keep) == n:
        raise FP8ProbeError(f"the teacher has {n} decoder block(s): too few to prune")
    pruned = copy.deepcopy(model)
    layers = decoder_layers(pruned)
    kept = nn.ModuleList([layers[i] for i in keep])
    pruned.model.layers = kept
    for j, layer in enumerate(kept):  # the KV cache is indexed by the attention's layer_idx
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = j
    prune_config(pruned.config, n, keep)
    return pruned


def prune_config(cfg, n: int, keep: list[int]):
    """`cfg` (of a model with n decoder blocks) edited in place to describe the blocks `keep`, renumbered."""
    text = text_config(cfg)
    text.num_hidden_layers = len(keep)
    if isinstance(getattr(text, "layer_types", None), list) and len(text.layer_types) == n:
        text.layer_types = [text.layer_types[i] for i in keep]
    if isinstance(getattr(text, "mlp_only_layers", None), list):  # block indices: renumbered
        text.mlp_only_layers = [keep.index(i) for i in text.mlp_only_layers if i in keep]
    return cfg


_SPEC = re.compile(r"^pruned(?::(.*))?$")


def is_pruned(spec) -> bool:
    """Whether a model name is `pruned[:K]` (the embedded student depth-pruned)."""
    return spec is not None and bool(_SPEC.match(str(spec).strip()))


def pruned_every(spec: str) -> int:
    """K of `pruned[:K]` (2 by default)."""
    m = _SPEC.match(str(spec).strip())
    k = (m.group(1) if m else None) or "2"
    try:
        every = int(k)
    except ValueError:
        every = 0
    if every < 2:
        raise FP8ProbeError(f"`student` {spec}: pruned:K takes a whole number K >= 2")
    return every


def pruned_config(spec: str, base):
    """The config of `pruned:K` from its teacher's config `base` (copied)."""
    every = pruned_every(spec)
    n = text_config(base).num_hidden_layers
    return prune_config(copy.deepcopy(base), n, list(range(0, n, every)))
