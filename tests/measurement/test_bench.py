"""The measurement bench (measurement/bench.py): what it takes from the rollouts' settings, the reference pass it makes
once and hands to every verb given it, and a bench around a given reference."""

from __future__ import annotations

import pytest
from conftest import tiny_student

from fp8probe.core.schemes import KVCacheScheme, Scheme
from fp8probe.measurement import reference as reference_module
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.measure import measure
from fp8probe.measurement.perturbation import Perturbation
from fp8probe.model.rollouts import make_rollouts
from fp8probe.model.settings import RolloutSettings
from fp8probe.recipe.selection import make_recipe
from fp8probe.recipe.settings import RecipeSettings
from fp8probe.sweeps.sweep import sweep


@pytest.fixture(scope="module")
def setup():
    st = tiny_student("llama")
    return st, make_rollouts(st, num_prompts=5, max_new_tokens=8, seed=0)


def test_of_takes_the_rollouts_settings_and_the_length_falls_back_to_the_rollouts(setup):
    st, r = setup
    b = Bench.of(st, r, RolloutSettings(batch_size=3, seed=7, max_new_tokens=11))
    assert (b.batch_size, b.seed, b.max_new_tokens, b.response_tokens) == (3, 7, 11, 11)
    plain = Bench.of(st, r)
    assert (plain.batch_size, plain.seed) == (8, 0)
    assert plain.response_tokens == r.meta.sampling["max_new_tokens"] == 8  # the rollouts' own length
    with pytest.raises(ValueError, match="batch_size"):
        Bench(st, r, 0)


def test_one_reference_pass_serves_every_measurement_and_verb_on_a_bench(setup, made_references):
    """A sweep, two measurements and an unsplit recipe search on one bench make one reference pass between them
    (seen failing with the bench's cache removed: four passes); a per-head KV strategy is a reference of its own, and
    a request for any strategy gets the one held."""
    st, r = setup
    bench = Bench(st, r)
    table = sweep(bench).table
    fp8 = Perturbation(tuple(st.unit_names[:2]), Scheme.from_name("FP8_DYNAMIC"))
    first, again = measure(bench, fp8), measure(bench, fp8)
    assert first.metrics == again.metrics
    whole = float(table[table.unit == "model.fp8_all"].kl_q_p.iloc[0])
    make_recipe(table, bench, RecipeSettings(budget=whole / 2, holdout=0, refine=0, engine="none"))
    assert made_references == [(r.num_sequences, "tensor")]
    head = Perturbation(kv_layers=tuple(st.layers), kv=KVCacheScheme(strategy="head"))
    measure(bench, head)
    assert made_references == [(r.num_sequences, "tensor"), (r.num_sequences, "head")]
    assert bench.reference() is bench.reference("tensor") is not bench.reference("head")


def test_the_same_figure_on_a_fresh_bench_and_around_a_given_reference(setup, made_references):
    """A bench around a reference hands that one to every request, whatever the strategy (its caller's to match);
    its figures are a fresh bench's, to the bit."""
    st, r = setup
    given = reference_module.Reference(st, r)
    around = Bench.around(given, st, r)
    assert around.reference("head", per_sequence=True) is given and around.reference() is given
    p = Perturbation(tuple(st.unit_names), Scheme.from_name("FP8"), tuple(st.layers), KVCacheScheme())
    assert measure(around, p).metrics == measure(Bench(st, r), p).metrics
    assert len(made_references) == 2  # the given one and the fresh bench's


def test_a_held_out_split_measures_on_its_own_prompts(setup):
    """Bench.on: the same bench on other rollouts, none of the first one's references."""
    st, r = setup
    bench = Bench(st, r, 4, seed=3)
    bench.reference()
    other = bench.on(r.subset(range(3)))
    assert (other.batch_size, other.seed) == (4, 3) and not other.holds_reference() and bench.holds_reference()
    assert other.reference().prompt.unique().numel() == 3
