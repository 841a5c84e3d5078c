"""`fp8probe recipe`'s report of a per-layer KV map: its KV tokens against a BF16 cache's as vLLM lays them out
(apps/recipe.py kv_map_capacity on deploy/capacity.py, itself checked against vLLM 0.32's own code)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_student

from fp8probe.apps.recipe import RecipeResult, kv_map_capacity
from fp8probe.recipe.recipe import Recipe
from fp8probe.recipe.settings import RecipeSettings


def test_a_kv_maps_capacity_by_hand_and_in_the_recipes_line():
    """A tiny Llama of 3 layers, layer 1's KV cache kept BF16: a BF16 cache holds 2P bytes a token in each layer (P:
    an FP8 layer's), the map 2P + P + P = 4P, and vLLM grows the map's block from 16 to 32 tokens so one FP8 page
    covers a 16-token BF16 page: in the same memory the map holds 6P / 4P = 1.5x the tokens (8 GiB: the blocks'
    rounding below 1e-6), at the model's 256 positions. Without a map there is nothing to say. The recipe's line gives
    the figure. Seen failing with the map's skipped layers dropped (every layer FP8: 2.0x) and with the figure left
    out of the line."""
    st = tiny_student("llama")
    assert st.model.config.num_hidden_layers == 3
    recipe = Recipe.whole_model(st.units, "FP8_DYNAMIC", kv_cache_dtype="fp8")
    assert kv_map_capacity(st.model.config, recipe) is None
    recipe.kv_skip_layers, recipe.kv_tokens = [1], 4096
    ratio, max_len = kv_map_capacity(st.model.config, recipe)
    assert ratio == pytest.approx(1.5, rel=1e-6) and max_len == 256
    recipe.measured, recipe.predicted, recipe.metric, recipe.bytes_saved, recipe.effective_bits = (
        0.01,
        0.01,
        "kl_q_p",
        0,
        8,
    )
    line = RecipeResult(Path("out"), recipe, RecipeSettings(budget=0.02), 1.0, None, (ratio, max_len)).describe(1.0)
    assert "FP8 KV cache in all but 1 layers at 4,096 tokens in flight" in line
    assert "by vLLM's accounting 1.50x the KV tokens of BF16 (max_model_len 256)" in line
