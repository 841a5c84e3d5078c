"""The recipe command's settings (recipe/settings.py) refuse a bad request when they are made (forms.check_request
first, then the fields' choices and bounds): make_recipe checks nothing again."""

import pytest

from fp8probe import FP8ProbeError
from fp8probe.recipe.settings import RecipeSettings


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"budget": 0.1, "form": "none"}, "`form` none .* add `kv_cache_dtype` fp8"),
        ({"budget": 0.1, "form": "all", "keep": ("model.layers.0.mlp",)}, "`form` all takes no `keep`"),
        ({"budget": 0.1, "kv_cache_dtype": "fp8_e5m2"}, "an engine setting .* a recipe takes: fp8"),
        ({"budget": 0.1, "fp8_share": 0.5}, "give exactly one of"),
        ({"budget": 0.1, "holdout": 1}, "would hold out every prompt"),
    ],
)
def test_a_bad_request_is_refused_by_the_settings(kw, match):
    with pytest.raises(FP8ProbeError, match=match):
        RecipeSettings(**kw)


def test_a_good_request_is_taken():
    s = RecipeSettings(fp8_share=0.5, form="none", kv_cache_dtype="fp8", keep=())
    assert s.memory.kind == "fp8_share" and s.kv_cache_dtype == "fp8"


def test_the_settings_check_without_torch():
    """The request rules run where the command's settings are made, before anything is loaded: no torch import."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom fp8probe.recipe.settings import RecipeSettings\nRecipeSettings(budget=0.1, form='all')\n"
        "try:\n    RecipeSettings(budget=0.1, form='none')\nexcept Exception:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_the_closing_line_times_the_search_not_the_command():
    """The line `fp8probe recipe` ends with names the search's own seconds (the student loaded and searched), not the
    whole command's the CLI passes; and what it chose, as the recipe says."""
    from types import SimpleNamespace

    from fp8probe.apps.recipe import RecipeResult

    recipe = SimpleNamespace(
        form="free",
        split=None,
        measured=0.012,
        measured_engine=None,
        quantized=["a", "b", "c"],
        kept=["d"],
        scheme="FP8_DYNAMIC",
        kv_cache_dtype=None,
        predicted=0.01,
        bytes_saved=3 * 2**20,
        effective_bits=10.0,
        search=[{}, {}],
    )
    line = RecipeResult("/tmp/r", recipe, RecipeSettings(budget=0.05), 12.4).describe(999.0)
    assert "3/4 fused groups in FP8_DYNAMIC" in line and "3.0 MiB saved" in line
    assert "2 measured passes in 12 s" in line and "999" not in line
