"""The one vocabulary for a rollout configuration (sources/config.py): its text round-trips, vLLM's two names of one
KV format are one configuration, and a recipe of every unit is the calibration level fp8:SCHEME."""

import pytest
from conftest import tiny_student

from fp8probe.core.errors import FP8ProbeError
from fp8probe.recipe.recipe import Recipe
from fp8probe.sources import sources
from fp8probe.sources.config import RolloutConfig


@pytest.mark.parametrize(
    "text",
    [
        "0",
        "0.01",
        "fp8:FP8_DYNAMIC",
        "kv:fp8",
        "kv:fp8@calibrated",
        "stale:2",
        "stale:?",
        "fp8:FP8[3 of 9 units ab]+kv:fp8",
    ],
)
def test_the_text_round_trips(text):
    assert RolloutConfig.parse(text).name == text and RolloutConfig.parse(
        RolloutConfig.parse(text).name
    ) == RolloutConfig.parse(text)


def test_one_configuration_one_name():
    """fp8_e4m3 is vLLM's other name of fp8; the KV scales of no KV cache and the units of no FP8 weights say nothing.
    Seen failing without the normalisation (a whole-model recipe, whose record says kv_scale calibrated without a KV
    cache, was not the calibration's fp8 level)."""
    assert RolloutConfig(kv="fp8_e4m3") == RolloutConfig(kv="fp8")
    assert RolloutConfig(fp8="FP8_DYNAMIC", kv_scale="calibrated") == RolloutConfig(fp8="FP8_DYNAMIC")
    st = tiny_student("llama")
    whole = sources.recipe(st, Recipe.whole_model(st.units, "FP8_DYNAMIC"))
    assert whole.config == sources.parse_source("fp8").config
    with_kv = sources.recipe(st, Recipe.whole_model(st.units, "FP8_DYNAMIC", kv_cache_dtype="fp8"))
    assert with_kv.config == RolloutConfig(fp8="FP8_DYNAMIC", kv="fp8", kv_scale="calibrated")
    half = Recipe.from_groups(st.units, "FP8_DYNAMIC", list(st.groups())[:2])
    assert sources.recipe(st, half).config.fp8_units.startswith(
        f"{len(sources.recipe(st, half).perturbation.units)} of "
    )
    assert sources.kv_cache(st, "fp8").config == sources.parse_source("kv").config
    for bad in ("fp9", "kv:int4", "stale:0", "stale:x", "fp8+fp8", "-1"):
        with pytest.raises(FP8ProbeError):
            RolloutConfig.parse(bad)
