"""The headroom: a deliberately expensive search for the best recipe of a size, to read every selection against (a
benchmark's reference, not a product feature: the peer table in vs_modelopt.py runs it).

A (1+λ) evolutionary search in the spirit of EvoPress (arXiv 2410.14649): one parent recipe (a set of groups in FP8
that meets a memory target); each generation makes λ offspring by mutation (take out a random number of the parent's
groups, 1 + a geometric count, and put in random kept groups until the target is met again), measures each once
(memoised: a set measured before costs nothing) and keeps the best offspring if it is no worse than the parent (ties
move the search along a plateau). Fitness is whatever the caller measures, on the search prompts; the result is judged
elsewhere, on held-out prompts. The search knows nothing of per-group scores, so it cannot inherit their blind spots:
that is what makes it a reference for the selections that use them. It spends `evaluations` measured candidates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np

from fp8probe.core.errors import FP8ProbeError

log = logging.getLogger(__name__)

LAMBDA = 8  # offspring per generation
MEAN_SWAPS = 1.5  # mean number of groups taken out per mutation (1 + geometric)


@dataclass(frozen=True)
class Strategy:
    """The search's own settings: `lam` offspring per generation, `mean_swaps` groups out per mutation on average
    (1 + geometric; at least 1), the random `seed`."""

    lam: int = LAMBDA
    mean_swaps: float = MEAN_SWAPS
    seed: int = 0

    def __post_init__(self):
        if self.mean_swaps < 1:
            raise ValueError("evolve: mean_swaps is at least 1 (one group out per mutation)")


@dataclass
class Evolved:
    best: frozenset
    fitness: float
    evaluations: int  # distinct candidates measured
    history: list = field(default_factory=list)  # per generation: (evaluations so far, the parent's fitness)


def evolve(
    items: Sequence[Hashable],
    value: Callable[[frozenset], float],
    need: float,
    fitness: Callable[[frozenset], float],
    start: frozenset,
    evaluations: int,
    strategy: Strategy = Strategy(),
) -> Evolved:
    """Minimise fitness(set) over subsets of `items` with value(set) >= need, from `start` (which must meet it),
    measuring at most `evaluations` distinct sets."""
    lam, seed, mean_swaps = strategy.lam, strategy.seed, strategy.mean_swaps
    if value(start) < need:
        raise FP8ProbeError("evolve: the starting recipe does not meet the memory target")
    rng = np.random.default_rng(seed)
    items = list(items)
    seen: dict[frozenset, float] = {}

    def measure(s: frozenset) -> float:
        if s not in seen:
            seen[s] = float(fitness(s))
        return seen[s]

    parent, f_parent = frozenset(start), measure(frozenset(start))
    out = Evolved(parent, f_parent, 0, [(1, f_parent)])
    stale = 0
    while len(seen) < evaluations and stale < 50:
        before = len(seen)
        best, f_best = None, np.inf
        for _ in range(lam):
            child = _mutate(parent, items, value, need, rng, mean_swaps)
            if child is None:
                continue
            if child not in seen and len(seen) >= evaluations:
                break
            f = measure(child)
            if f < f_best:
                best, f_best = child, f
        stale = stale + 1 if len(seen) == before else 0  # every mutation landed on a measured set
        if best is not None and f_best <= f_parent:
            parent, f_parent = best, f_best
        out.history.append((len(seen), f_parent))
    out.best, out.fitness, out.evaluations = parent, f_parent, len(seen)
    log.info("evolve: %d candidates measured, best %.4g (start %.4g)", len(seen), f_parent, out.history[0][1])
    return out


def _mutate(parent: frozenset, items: list, value, need: float, rng, mean_swaps: float) -> frozenset | None:
    """Take out 1 + Geometric members, then add random non-members until the target is met; None if it cannot be."""
    members = list(parent)
    n_out = min(len(members), int(rng.geometric(1 / mean_swaps))) if members else 0
    out = set(rng.choice(len(members), size=n_out, replace=False).tolist()) if n_out else set()
    child = {m for i, m in enumerate(members) if i not in out}
    removed = {members[i] for i in out}
    pool = [x for x in items if x not in child and x not in removed]
    rng.shuffle(pool)
    for x in pool:
        if value(frozenset(child)) >= need:
            break
        child.add(x)
    if value(frozenset(child)) < need:  # only the removed ones can make it up: put some back
        back = list(removed)
        rng.shuffle(back)
        for x in back:
            if value(frozenset(child)) >= need:
                break
            child.add(x)
    child = frozenset(child)
    return child if value(child) >= need and child != parent else None
