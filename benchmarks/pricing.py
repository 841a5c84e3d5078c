"""Groups priced at the operating point: what each costs with the rest of a candidate recipe in FP8 (the peer table's
`--costs path` and `--costs context` rows; they left the package, its evidence in docs/modelopt.md).

Three ways to price a group g, from cheap to exact at the operating point R (a candidate recipe):

    single        m({g}) − m(∅): the sweep's row, every other group BF16 (what `fp8probe recipe` ranks by)
    context       m(R) − m(R \\ {g}) for g in R, m(R ∪ {g}) − m(R) for g outside R: one measured pass per group,
                  the marginal cost of g where the recipe will run
    path          the Aumann–Shapley attribution along t·δ from BF16 to a set in FP8, every group at once from a few
                  forward and backward passes (attribution.py, beside this file); its shares add up to the set's
                  mismatch
    damage        the per-group terms u_i of a damage model (damage.py, beside this file) fitted on DAMAGE_RECIPES
                  random recipes measured around R (sizes spread about |R|): what `recipe --damage-model 40` ranked
                  by until it left the package

A group that costs little alone and much beside its neighbours is cheap by its single row and dear by the other two.
`priced_table` writes the prices into a group sweep's table, so that make_recipe ranks by them (a price below zero
counts as free, as make_recipe floors every score).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

log = logging.getLogger(__name__)

COSTS = ("single", "context", "path", "damage")  # how a group is priced
PATH_NODES = 4  # nodes of each path attribution when groups are priced along the path
DAMAGE_RECIPES = 40  # measured random recipes a `damage` price fits its model on


def _m(measure: Callable, groups) -> float:
    r = measure(list(groups))
    return float(r[0] if isinstance(r, tuple) else r)


def in_context_costs(current: Iterable, pool: Iterable, measure: Callable) -> dict[str, float]:
    """Each group's marginal cost at the operating point `current` (anything with `.group`): leave-one-out for its
    members, add-one for the groups of `pool` outside it. measure(groups) -> the excess mismatch (or a tuple whose
    first item is), one measured pass per call; len(pool ∪ current) + 1 passes."""
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


def operating_point_costs(costs: str, current: list, pool: list, measure: Callable, path: Callable) -> dict[str, float]:
    """Every group of `pool` priced at the operating point `current` (a recipe the single scores chose):

        context  in_context_costs: one measured pass per group
        path     two path attributions: `current`'s groups from BF16 to FP8 (their shares of its mismatch), then the
                 rest from BF16 to FP8 with `current` fixed in FP8 (what each adds to it)
        damage   a damage model's terms, fitted on DAMAGE_RECIPES random recipes of `pool` around len(current) groups
                 (damage.fit_around: one measured pass per recipe)

    path(groups, fixed) -> {group: share} runs one attribution (priced_table binds the student and its rollouts)."""
    if costs not in COSTS:
        raise ValueError(f"costs {costs!r}: one of {', '.join(COSTS)}")
    if costs == "single":
        return {g.group: g.score for g in pool}
    if costs == "context":
        return in_context_costs(current, pool, measure)
    if costs == "damage":
        from damage import fit_around  # beside this file

        model = fit_around(pool, [], lambda groups: _m(measure, groups), max(len(current), 1), DAMAGE_RECIPES)
        log.info("damage model fitted on %d random recipes (rho %.3g)", model.fitted_on, model.rho)
        return model.terms()
    inside = {g.group: g.units for g in current}
    outside = {g.group: g.units for g in pool if g.group not in inside}
    out = path(inside, {}) if inside else {}
    if outside:
        out.update(path(outside, inside))
    return out


def priced_table(table, costs: str, current: list, pool: list, bench, scheme):
    """(the group sweep's `table` with each group row's kl_q_p replaced by its price at `current`, what was priced):
    `current` and `pool` are GroupScores (fp8probe.recipe.selection.group_scores), measured on `bench` (a
    fp8probe.Bench; its reference's calibration gives the static scales). The prices: `operating_point_costs`."""
    from attribution import path_attribution  # beside this file

    from fp8probe.recipe.selection import measure_groups

    t0 = time.perf_counter()

    def measure(groups):
        return measure_groups(groups, bench, scheme, "kl_q_p", None)

    def path(groups, fixed):
        return path_attribution(
            bench.student, bench.rollouts, bench.reference(), groups, scheme, PATH_NODES, bench.batch_size, fixed=fixed
        ).shares

    prices = operating_point_costs(costs, current, pool, measure, path)
    out = table.copy()
    rows = out["group"].isin(list(prices)) & ~out["kind"].isin(["kv", "model"])
    if out[rows].groupby("group").size().max() != 1:
        raise ValueError("priced_table: a group sweep's table (one row per fused group)")
    out.loc[rows, "kl_q_p"] = [max(float(prices[g]), 0.0) for g in out.loc[rows, "group"]]
    info = {
        "method": costs,
        "operating_point": [g.group for g in current],
        "seconds": time.perf_counter() - t0,
        "scores": prices,
    }
    if costs == "path":
        info["nodes"] = PATH_NODES
    return out, info
