"""Refining a recipe with measured passes, so that interactions between units count.

Selection (selection.py) ranks groups by their *single-unit* scores, which do not add up exactly: units
interact through the residual stream, and a group's cost inside a recipe differs from its cost alone. The
refinement starts from the selected recipe R and spends a bounded number of measured passes:

1. in-context cost: for the few quantized groups that look worst (single score per byte), measure R
   without each (leave-one-out): c_q = m(R) - m(R \\ q), what q really costs *inside* R;
2. swap the groups with the largest in-context cost per byte, in that order, for the best kept groups
   (single score per byte), one measured pass each, and keep the first swap that improves the objective:
     memory target (bytes saved >= target): a lower measured mismatch, bytes still >= target;
     budget (measured mismatch <= budget):  more bytes saved, measured still <= budget
   (in budget mode, adding a kept group outright is tried first);
3. repeat from the new recipe until no tried move improves or the passes are spent (a set of groups
   measured once is not measured again: a move back costs nothing and is never taken).

Only measured improvements are accepted, so the result is never worse than the start (measured). Every
measured pass is logged with its predicted value (start's measured value plus the single scores added and
minus those removed) so the additivity of the scores is visible per recipe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

WIDTH = 3  # leave-one-out candidates per round, and kept candidates tried per swap
DEFAULT_REFINE_PASSES = 8  # measured passes spent on interactions after the selection (`fp8probe recipe --refine`)


@dataclass
class Refined:
    groups: list  # the GroupScores in FP8
    measured: float  # its measured metric (excess over the zero point)
    metrics: dict  # every metric of that pass
    log: list = field(default_factory=list)  # one entry per measured pass


def refine(start: list, pool: list, forced: list, measure_groups, passes: int, *, budget: float | None = None,
           min_value: float | None = None, value=lambda gs: sum(g.bytes_saved for g in gs),
           start_measured: tuple[float, dict] | None = None) -> Refined:
    """Improve `start` (GroupScores in FP8, `forced` among them never removed) with kept groups from `pool`.

    measure_groups(groups) -> (excess, metrics) runs one measured pass. Exactly one of `budget` (maximize
    bytes with the measured excess <= budget) or `min_value` (minimize the measured excess with
    value(groups) >= min_value) says what "better" means.
    """
    memory = min_value is not None
    cur = list(start)
    m_cur, metrics = start_measured if start_measured is not None else measure_groups(cur)
    out = Refined(cur, m_cur, metrics)
    left = passes

    seen = {frozenset(g.group for g in cur): (m_cur, metrics)}  # a set measured once is never measured again

    def run(groups, move):
        nonlocal left
        key = frozenset(g.group for g in groups)
        if key in seen:
            return seen[key]
        left -= 1
        m, met = measure_groups(groups)
        seen[key] = (m, met)
        pred = m_cur + sum(g.score for g in groups if g not in cur) - sum(g.score for g in cur if g not in groups)
        out.log.append({"move": move, "groups_fp8": len(groups), "bytes_saved": sum(g.bytes_saved for g in groups),
                        "predicted": pred, "measured": m})
        log.info("refine: %s -> %.4g (predicted %.4g)", move, m, pred)
        return m, met

    def better(groups, m):
        if memory:
            return value(groups) >= min_value and m < m_cur
        return m <= budget and sum(g.bytes_saved for g in groups) > sum(g.bytes_saved for g in cur)

    forced_names = {g.group for g in forced}
    while left > 0:
        kept = sorted((g for g in pool if g not in cur), key=lambda g: (g.per_byte, -g.block, g.group))
        improved = False
        if not memory:  # a kept group may still fit outright: the bisection stopped at the first that did not
            for k in kept[:WIDTH]:
                if left <= 0:
                    break
                cand = cur + [k]
                m, met = run(cand, f"add {k.group}")
                if better(cand, m):
                    cur, m_cur, metrics, improved = cand, m, met, True
                    break
            if improved:
                continue
        removable = sorted((g for g in cur if g.group not in forced_names), key=lambda g: -g.per_byte)[:WIDTH]
        contrib = {}
        for q in removable:
            if left <= 0:
                break
            without = [g for g in cur if g is not q]
            m, met = run(without, f"leave out {q.group}")
            contrib[q.group] = (m_cur - m, q)
            if memory and better(without, m):  # dropping it alone already helps and still meets the target
                cur, m_cur, metrics, improved = without, m, met, True
                break
        if improved:
            continue
        if not contrib:
            break
        # the groups that cost most in context, per byte, each against the best kept groups
        for _, worst in sorted(contrib.values(), key=lambda cq: (-cq[0] / max(cq[1].bytes_saved, 1), cq[1].group)):
            feasible = [k for k in kept if (value([g for g in cur if g is not worst] + [k]) >= min_value if memory
                                            else k.bytes_saved > worst.bytes_saved)]  # budget mode: save more
            for k in feasible[:WIDTH]:
                if left <= 0:
                    break
                cand = [g for g in cur if g is not worst] + [k]
                m, met = run(cand, f"swap {worst.group} for {k.group}")
                if better(cand, m):
                    cur, m_cur, metrics, improved = cand, m, met, True
                    break
            if improved or left <= 0:
                break
        if not improved:
            break
    out.groups, out.measured, out.metrics = cur, m_cur, metrics
    return out
