"""Demo students made from a teacher: a depth-pruned copy initialised from its weights (Minitron-style)."""

from __future__ import annotations

from torch import nn

from ..core.errors import FP8ProbeError
from .structure import decoder_layers, text_config


def depth_pruned(model: nn.Module, every: int = 2) -> nn.Module:
    """A depth-pruned copy of `model`, initialised from its weights (Minitron-style): decoder blocks 0, every,
    2·every, ... kept, the embeddings, final norm and head copied; the rest dropped. The teacher is untouched."""
    import copy

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
    cfg = pruned.config
    text = text_config(cfg)
    text.num_hidden_layers = len(keep)
    if isinstance(getattr(text, "layer_types", None), list) and len(text.layer_types) == n:
        text.layer_types = [text.layer_types[i] for i in keep]
    if isinstance(getattr(text, "mlp_only_layers", None), list):  # block indices: renumbered
        text.mlp_only_layers = [keep.index(i) for i in text.mlp_only_layers if i in keep]
    return pruned
