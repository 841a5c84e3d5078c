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

Only measured improvements are accepted, so the result is never worse than the start (measured). Under a memory
target the improvement must also be real: when the measure function returns the per-token statistics behind its
figure (selection._Search does), a move is taken only if the 90 % paired bootstrap interval of the change (the same
tokens under both recipes, prompts resampled: measurement.measure.Measured.change_from) lies wholly below zero, a
one-sided test at 5 %; a lower figure whose interval reaches zero is logged as noise and not taken. Differences that
small come from per-sequence sampling noise and from fp32 roundings that flip FP8 codes between machines, and accepting
them lowers the search set's figure without lowering the mismatch (issue 27's table). Under a budget the gain is
bytes, which are exact, and a move is taken when it measures within the budget (the recipe's held-out figure says
whether that holds on other rollouts: selection.py).

Every measured pass is logged with its predicted value (start's measured value plus the single scores added and
minus those removed), so the additivity of the scores is visible per recipe, and with what became of it: `taken`,
`not better`, `noise` (with the change's interval) or `probe` (a leave-one-out that only measures a cost).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)

WIDTH = 3  # leave-one-out candidates per round, and kept candidates tried per swap
DEFAULT_REFINE_PASSES = 8  # measured passes spent on interactions after a budget's selection (`recipe --refine`)


def default_passes(memory_target: bool) -> int:
    """`fp8probe recipe`'s refinement when not told: DEFAULT_REFINE_PASSES under a budget, where a move's gain is
    bytes (exact) and the bisection may stop one group short; none under a memory target, where a move's gain is a
    lower measured mismatch on the search set, which did not carry over to held-out prompts (docs/modelopt.md,
    "The default path": of six recipes at three sizes on two students, refinement moved three, within the noise
    each time, two of them to a higher held-out KL, for 61 % of the recipe's time)."""
    return 0 if memory_target else DEFAULT_REFINE_PASSES


def _three(result) -> tuple:
    """(excess, metrics, evidence or None) from what a measure function returned."""
    return (*result, None)[:3] if len(result) == 2 else tuple(result)


@dataclass
class Refined:
    groups: list  # the GroupScores in FP8
    measured: float  # its measured metric (excess over the zero point)
    metrics: dict  # every metric of that pass
    log: list = field(default_factory=list)  # one entry per measured pass


def _bytes(groups) -> float:
    return sum(g.bytes_saved for g in groups)


@dataclass(frozen=True)
class Goal:
    """What "better" means to a refinement: under a `budget`, more bytes saved with the measured excess within it;
    with a memory target, value(groups) at least `min_value` (MemoryTarget.amount and .value) and a lower measured
    excess. Exactly one of `budget` and `min_value`."""

    budget: float | None = None
    min_value: float | None = None
    value: Callable = _bytes

    def __post_init__(self):
        if (self.budget is None) == (self.min_value is None):
            raise ValueError("Goal: exactly one of `budget` and `min_value`")


def refine(
    start: list,
    pool: list,
    forced: list,
    measure_groups,
    passes: int,
    *,
    goal: Goal,
    start_measured: tuple | None = None,
    metric: str = "kl_q_p",
) -> Refined:
    """Improve `start` (GroupScores in FP8, `forced` among them never removed) with kept groups from `pool`.

    measure_groups(groups) -> (excess, metrics) or (excess, metrics, evidence) runs one measured pass; evidence (a
    measurement.measure.Measured on the same tokens for every set) lets a memory-target move be tested for
    significance (module docstring). The `goal` says what "better" means: a budget (maximize bytes with the measured
    excess <= budget) or a memory target (minimize the measured excess with value(groups) >= min_value).
    """
    r = _Refiner(
        start,
        pool,
        {g.group for g in forced},
        measure_groups,
        passes,
        goal.budget,
        goal.min_value,
        goal.value,
        start_measured,
        metric,
    )
    while r.left > 0 and (r.add_one() or r.swap_one()):
        pass
    r.out.groups, r.out.measured, r.out.metrics = r.cur, r.m_cur, r.metrics
    return r.out


class _Refiner:
    """The state of one refinement: the current recipe, its measured value, the passes left, every set measured."""

    def __init__(
        self,
        start,
        pool,
        forced_names,
        measure_groups,
        passes,
        budget,
        min_value,
        value,
        start_measured,
        metric="kl_q_p",
    ):
        self.pool, self.forced_names, self.measure_groups, self.metric = pool, forced_names, measure_groups, metric
        self.budget, self.min_value, self.value = budget, min_value, value
        self.memory = min_value is not None
        self.cur = list(start)
        first = start_measured if start_measured is not None else measure_groups(self.cur)
        self.m_cur, self.metrics, self.ev_cur = _three(first)
        self.out = Refined(self.cur, self.m_cur, self.metrics)
        self.left = passes
        self.seen = {frozenset(g.group for g in self.cur): (self.m_cur, self.metrics, self.ev_cur)}  # measured once
        self.entries: dict = {}  # set -> its log entry

    def run(self, groups, move):
        key = frozenset(g.group for g in groups)
        if key in self.seen:
            return self.seen[key], None
        self.left -= 1
        m, met, ev = _three(self.measure_groups(groups))
        self.seen[key] = (m, met, ev)
        pred = (
            self.m_cur
            + sum(g.score for g in groups if g not in self.cur)
            - sum(g.score for g in self.cur if g not in groups)
        )
        entry = {
            "move": move,
            "groups_fp8": len(groups),
            "bytes_saved": sum(g.bytes_saved for g in groups),
            "predicted": pred,
            "measured": m,
            "outcome": "probe",
        }
        self.out.log.append(entry)
        self.entries[key] = entry
        return (m, met, ev), entry

    def better(self, groups, m, ev, entry) -> bool:
        """Budget: more bytes within the budget. Memory target: the target met and a lower mismatch, by more than
        the measurement's noise when the evidence allows the paired test."""
        if not self.memory:
            return m <= self.budget and sum(g.bytes_saved for g in groups) > sum(g.bytes_saved for g in self.cur)
        if self.value(groups) < self.min_value or m >= self.m_cur:
            return False
        if ev is None or self.ev_cur is None:
            return True

        _, lo, hi = ev.change_from(self.ev_cur, self.metric)
        if entry is not None:
            entry["change_interval"] = [lo, hi]
        if hi < 0:
            return True
        if entry is not None:
            entry["outcome"] = "noise"
        return False

    def accept(self, groups, move) -> bool:
        """Measure `groups` (one pass); take them when better."""
        (m, met, ev), entry = self.run(groups, move)
        entry = entry or self.entries.get(frozenset(g.group for g in groups))
        take = self.better(groups, m, ev, entry)
        if entry is not None:
            if entry["outcome"] == "probe":
                entry["outcome"] = "taken" if take else "not better"
            ci = entry.get("change_interval")
            log.info(
                "refine: tried %s -> %.4g (predicted %.4g): %s%s",
                move,
                m,
                entry["predicted"],
                entry["outcome"],
                f" (change {ci[0]:+.3g} .. {ci[1]:+.3g})" if ci else "",
            )
        if take:
            self.cur, self.m_cur, self.metrics, self.ev_cur = groups, m, met, ev
        return take

    def kept(self) -> list:
        return sorted((g for g in self.pool if g not in self.cur), key=lambda g: (g.per_byte, -g.block, g.group))

    def add_one(self) -> bool:
        """Budget mode: a kept group may still fit outright (the bisection stopped at the first that did not)."""
        if self.memory:
            return False
        for k in self.kept()[:WIDTH]:
            if self.left <= 0:
                return False
            if self.accept(self.cur + [k], f"add {k.group}"):
                return True
        return False

    def swap_one(self) -> bool:
        """The quantized groups that look worst, left out one at a time (their cost in context), then swapped, worst
        per byte first, for the best kept groups; the first move that improves is taken."""
        kept = self.kept()
        removable = sorted((g for g in self.cur if g.group not in self.forced_names), key=lambda g: -g.per_byte)[:WIDTH]
        contrib = {}
        for q in removable:
            if self.left <= 0:
                break
            without = [g for g in self.cur if g is not q]
            (m, met, ev), entry = self.run(without, f"leave out {q.group}")
            contrib[q.group] = (self.m_cur - m, q)
            if self.memory and self.value(without) >= self.min_value:
                if self.accept(without, f"leave out {q.group}"):  # dropping it alone already helps, target met
                    return True
            elif entry is not None:
                log.info("refine: measured leave out %s -> %.4g (its cost in context %.3g)", q.group, m, self.m_cur - m)
        for _, worst in sorted(contrib.values(), key=lambda cq: (-cq[0] / max(cq[1].bytes_saved, 1), cq[1].group)):
            rest = [g for g in self.cur if g is not worst]
            feasible = [
                k
                for k in kept
                if (self.value(rest + [k]) >= self.min_value if self.memory else k.bytes_saved > worst.bytes_saved)
            ]  # budget mode: save more
            for k in feasible[:WIDTH]:
                if self.left <= 0:
                    return False
                if self.accept(rest + [k], f"swap {worst.group} for {k.group}"):
                    return True
            if self.left <= 0:
                return False
        return False
