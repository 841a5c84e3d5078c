"""Every recipe shipped in recipes/ parses with llm-compressor's own parser and says what its recipe.json says."""

import json
from pathlib import Path

import pytest

from fp8probe.recipe import read_recipe

SHIPPED = sorted((Path(__file__).resolve().parents[1] / "recipes").rglob("recipe.yaml"))


def test_there_are_recipes():
    assert len(SHIPPED) >= 3


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.parent.name))
def test_parsed_by_llmcompressor(path):
    from llmcompressor.recipe import Recipe

    (mod,) = Recipe.create_instance(str(path)).modifiers
    ours = read_recipe(path)
    assert type(mod).__name__ == "QuantizationModifier"
    assert mod.scheme == ours.scheme and mod.ignore == ours.ignore and "lm_head" in mod.ignore
    meta = json.loads((path.parent / "recipe.json").read_text())
    kept = [u for g in meta["kept"] for u in meta["group_units"][g]]
    assert set(kept) <= set(mod.ignore)
    assert meta["measured"] <= meta["budget"]
