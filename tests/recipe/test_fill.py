"""A memory target lands on the asked bytes: the ranked prefix's last group, which may overshoot the target by a
whole group, is replaced by the set of the next ranked groups that meets it closest (#76)."""

from __future__ import annotations

import pytest

from fp8probe.core.schemes import Scheme
from fp8probe.recipe.selection import GroupScore, _Plan, _Search, rank_groups
from fp8probe.recipe.settings import MemoryTarget


def _search(groups):
    free = rank_groups(groups)
    plan = _Plan(
        groups, {g.group: g.units for g in groups}, {}, set(), [], free, [free[:k] for k in range(len(free) + 1)]
    )
    return _Search(plan, None, Scheme.from_name("FP8_DYNAMIC"), "kl_q_p", None)


def _g(name, block, score, nbytes):
    return GroupScore(name, [name], block, score, nbytes, params=nbytes)


# ranked by score per byte: g1 (0.001), g2 (0.002), g3 (0.003), g4 (0.004), g5 (0.005)
GROUPS = [
    _g("g1", 0, 0.5, 500),
    _g("g2", 1, 2.0, 1000),
    _g("g3", 2, 0.3, 100),
    _g("g4", 3, 1.6, 400),
    _g("g5", 4, 1.5, 300),
]


@pytest.mark.parametrize(
    "need, want",
    [
        # the prefix g1 + g2 saves 1500 for 900; the 400 missing after g1: g4 (400, predicted 1.6) and g3 + g5 (400,
        # 1.8) land on it, g4 predicts less
        (900, ["g1", "g4"]),
        # two groups: g1 + g2 saves 1500 for 1000; the 500 missing after g1: g3 + g4 (500) lands on it, g4 + g5 is
        # 200 over, g2 500 over
        (1000, ["g1", "g3", "g4"]),
        # the prefix lands exactly: nothing to fill
        (1500, ["g1", "g2"]),
        (500, ["g1"]),
    ],
)
def test_the_last_groups_land_on_the_target(need, want):
    search = _search(GROUPS)
    k = search.reach(MemoryTarget("bytes_saved", need), sum(g.params for g in GROUPS), _form())
    chosen = [g.group for g in search.plan.chosen(k)]
    assert sorted(chosen) == want
    assert sum(g.bytes_saved for g in search.plan.chosen(k)) >= need


def test_slack_trades_a_few_bytes_for_a_lower_prediction(monkeypatch):
    """Within FILL_SLACK of what FP8 can reach (0.5 % of 2705 = 13.5 here) above the closest fit, the least
    predicted set: 400 missing after g1; g4 (predicted 1.6) lands on it, gA (405 bytes, predicted 1.0) 5 over."""
    import fp8probe.recipe.selection as selection

    groups = [*GROUPS, _g("gA", 5, 1.0, 405)]  # 0.00247 per byte: ranked between g2 and g3
    search = _search(groups)
    k = search.reach(MemoryTarget("bytes_saved", 900), 0, _form())
    assert sorted(g.group for g in search.plan.chosen(k)) == ["g1", "gA"]
    monkeypatch.setattr(selection, "FILL_SLACK", 0.0)  # no slack: the closest fit
    search = _search(groups)
    k = search.reach(MemoryTarget("bytes_saved", 900), 0, _form())
    assert sorted(g.group for g in search.plan.chosen(k)) == ["g1", "g4"]


def _form():
    from fp8probe.recipe.forms import FORMS

    return FORMS["free"]
