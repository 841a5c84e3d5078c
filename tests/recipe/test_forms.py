"""The form registry: what each shape of recipe lets the search choose among, and which forms a framework of each
form can also write, against tables and a brute force written here."""

from __future__ import annotations

import itertools
import random
from collections import namedtuple

import pytest

from fp8probe.recipe.forms import FORMS, narrower

G = namedtuple("G", "group block score")


def test_the_registry_holds_the_five_forms_and_what_each_refuses():
    assert list(FORMS) == ["free", "keywords", "first-last", "all", "none"]
    assert [f for f in FORMS if FORMS[f].fixed] == ["all", "none"]  # no keep/force, no sweep needed
    assert [f for f in FORMS if not FORMS[f].weights] == ["none"]
    assert [f for f in FORMS if FORMS[f].chooses] == ["free", "keywords"]  # refinable


def test_a_framework_writes_its_form_and_the_narrower_ones():
    # an ignore list (free) or keywords express any set of kept modules; first-last only whole edge blocks
    table = {
        "free": {"free", "keywords", "first-last", "all", "none"},
        "keywords": {"free", "keywords", "first-last", "all", "none"},
        "first-last": {"first-last", "all", "none"},
        "all": {"all", "none"},
        "none": {"none"},
    }
    assert {f: set(narrower(f)) for f in FORMS} == table


def test_free_candidates_are_the_ranked_prefixes_and_all_is_all_or_nothing():
    free = [G("a", 0, 3.0), G("b", 1, 1.0), G("c", 2, 2.0)]
    rank = lambda gs: sorted(gs, key=lambda g: g.score)  # noqa: E731
    got = FORMS["free"].candidates(free, rank, 3, 0, 0)
    assert [[g.group for g in c] for c in got] == [[], ["b"], ["b", "c"], ["b", "c", "a"]]
    assert FORMS["all"].candidates(free, rank, 3, 0, 0) == [[], free]
    assert FORMS["none"].candidates(free, rank, 3, 0, 0) == [[]]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("keep_first,keep_last", [(0, 0), (1, 0), (0, 2), (1, 1)])
def test_first_last_candidates_are_the_cheapest_split_for_each_size(seed, keep_first, keep_last):
    """For each number of BF16 edge blocks, the FP8 middle is the split (first N >= keep_first, last M >= keep_last)
    whose groups score least: checked against every split."""
    rng, n = random.Random(seed), 6
    free = [G(f"b{b}.{i}", b, rng.random()) for b in range(n) for i in range(2)]
    got = FORMS["first-last"].candidates(free, None, n, keep_first, keep_last)
    assert len(got) == n - keep_first - keep_last + 1
    for cand in got:
        blocks = {g.block for g in cand}
        kept = n - len(blocks)
        best = min(
            sum(g.score for g in free if first <= g.block < n - last)
            for first, last in itertools.product(range(n + 1), repeat=2)
            if first + last == kept and first >= keep_first and last >= keep_last
        )
        assert sum(g.score for g in cand) == pytest.approx(best)
        assert blocks == set(range(min(blocks), max(blocks) + 1)) if blocks else True  # one contiguous middle
