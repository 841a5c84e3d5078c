"""Public model shapes, config only: what `capacity` and `plan` model for students whose weights are not here.

`load_config("shape:qwen3-8b")` gives the transformers config of that architecture (no weights: the shape is all the
capacity and throughput models read). The numbers are those of each model's config.json on the Hugging Face hub
(Qwen/Qwen3-1.7B, -8B, -14B, -32B, -30B-A3B; late 2026).
"""

from __future__ import annotations

from ..core.errors import FP8ProbeError

PREFIX = "shape:"
_QWEN3 = {
    "model_type": "qwen3",
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "dtype": "bfloat16",
    "hidden_act": "silu",
}
SHAPES: dict[str, dict] = {
    "qwen3-1.7b": {
        **_QWEN3,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
    },
    "qwen3-8b": {
        **_QWEN3,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "qwen3-14b": {
        **_QWEN3,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "qwen3-32b": {
        **_QWEN3,
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "qwen3-30b-a3b": {
        **_QWEN3,
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
}


def is_shape(name: str | None) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def shape_config(name: str):
    """The transformers config of `shape:NAME`; an unknown NAME lists the known ones."""
    from transformers import AutoConfig

    key = name[len(PREFIX) :].strip().lower()
    if key not in SHAPES:
        raise FP8ProbeError(f"unknown shape {name!r}; known: {', '.join(PREFIX + k for k in SHAPES)}")
    return AutoConfig.for_model(**SHAPES[key])
