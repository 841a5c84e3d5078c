"""In-context costs: what each group costs at the operating point, with the rest of a candidate recipe in FP8.

Three ways to price a group g, from cheap to exact at the operating point R (a candidate recipe):

    single        m({g}) − m(∅): the sweep's row, every other group BF16 (selection.group_scores)
    in context    m(R) − m(R \\ {g}) for g in R, m(R ∪ {g}) − m(R) for g outside R: one measured pass per group,
                  the marginal cost of g where the recipe will run (leave_one_out, add_one)
    path          the Aumann–Shapley attribution along t·δ from BF16 to a set in FP8, every group at once from a few
                  forward and backward passes (measurement/attribution.py); its shares add up to the set's mismatch

A group that costs little alone and much beside its neighbours is cheap by its single row and dear by the other two.
Selection ranks groups by any of these per byte (score_as swaps a GroupScore's score).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, Iterable

log = logging.getLogger(__name__)

COSTS = ("single", "context", "path")  # how a group is priced (recipe --costs)


def _m(measure: Callable, groups) -> float:
    r = measure(list(groups))
    return float(r[0] if isinstance(r, tuple) else r)


def in_context_costs(current: Iterable, pool: Iterable, measure: Callable) -> dict[str, float]:
    """Each group's marginal cost at the operating point `current` (GroupScores, or anything with `.group`):
    leave-one-out for its members, add-one for the groups of `pool` outside it. measure(groups) -> the excess
    mismatch (or a tuple whose first item is), one measured pass per call; len(pool ∪ current) + 1 passes."""
    cur = list(current)
    names = {g.group for g in cur}
    base = _m(measure, cur)
    out = {}
    for g in cur:
        out[g.group] = base - _m(measure, [x for x in cur if x.group != g.group])
    for g in pool:
        if g.group not in names and g.group not in out:
            out[g.group] = _m(measure, cur + [g]) - base
    log.info("in-context costs: %d groups priced at an operating point of %d groups (%.4g)", len(out), len(cur), base)
    return out


def score_as(groups: list, costs: dict[str, float], floor: float = 0.0) -> list:
    """The GroupScores with `costs` as their scores (a cost below `floor` is taken as the floor: a group whose
    marginal cost measures negative is free, not a gain the knapsack should chase)."""
    return [replace(g, score=max(float(costs[g.group]), floor)) for g in groups]


def operating_point_costs(costs: str, current: list, pool: list, measure: Callable, path: Callable) -> dict[str, float]:
    """Every group of `pool` priced at the operating point `current` (a recipe the single scores chose):

        context  in_context_costs: one measured pass per group
        path     two path attributions (measurement/attribution.py): `current`'s groups from BF16 to FP8 (their shares
                 of its mismatch), then the rest from BF16 to FP8 with `current` fixed in FP8 (what each adds to it)

    path(groups, fixed) -> {group: share} runs one attribution (selection.py binds the student and its rollouts)."""
    if costs not in COSTS:
        raise ValueError(f"costs {costs!r}: one of {', '.join(COSTS)}")
    if costs == "single":
        return {g.group: g.score for g in pool}
    if costs == "context":
        return in_context_costs(current, pool, measure)
    inside = {g.group: g.units for g in current}
    outside = {g.group: g.units for g in pool if g.group not in inside}
    out = path(inside, {}) if inside else {}
    if outside:
        out.update(path(outside, inside))
    return out
