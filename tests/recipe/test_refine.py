"""refine.refine on a synthetic measure function with a known interaction: it reaches the brute-force optimum,
and every logged `predicted` is its base's measured value plus the single scores added, minus those removed."""

import itertools
import re

import pytest

from fp8probe.recipe.refine import refine
from fp8probe.recipe.selection import GroupScore, rank_groups

# five groups of 10-12 bytes; A and B interact: together they cost 3.0 more than their single scores
SCORES = {"A": (1.0, 10), "B": (1.05, 10), "C": (1.5, 10), "D": (2.0, 10), "E": (1.6, 12)}
PENALTY = 3.0
GROUPS = {n: GroupScore(n, [n], i, s, b) for i, (n, (s, b)) in enumerate(SCORES.items())}


def measured(names) -> float:
    """The "measured" mismatch of a set of groups in FP8: single scores add up, except A with B."""
    names = set(names)
    return sum(SCORES[n][0] for n in names) + (PENALTY if {"A", "B"} <= names else 0.0)


def nbytes(names) -> int:
    return sum(SCORES[n][1] for n in names)


def optimum(feasible, key):
    sets = [set(c) for k in range(len(SCORES) + 1) for c in itertools.combinations(SCORES, k)]
    best = min((s for s in sets if feasible(s)), key=key)
    assert sum(1 for s in sets if feasible(s) and key(s) == key(best)) == 1, "the optimum must be unique"
    return best


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, groups):
        names = frozenset(g.group for g in groups)
        self.calls.append(names)
        m = measured(names)
        return m, {"kl_q_p": m}


def _base(move: str, groups: frozenset) -> tuple[frozenset, list, list]:
    """The recipe a logged move started from, and the groups it added and removed."""
    added, removed = [], []
    if m := re.fullmatch(r"add (\w+)", move):
        added = [m.group(1)]
    elif m := re.fullmatch(r"leave out (\w+)", move):
        removed = [m.group(1)]
    elif m := re.fullmatch(r"swap (\w+) for (\w+)", move):
        removed, added = [m.group(1)], [m.group(2)]
    else:
        raise AssertionError(f"unknown move {move!r}")
    return (groups - set(added)) | set(removed), added, removed


def check_predictions(log, calls, start):
    """Each pass: predicted = measured(its base) + sum of added single scores - sum of removed ones, where the
    base (read back from the move) is the start or a recipe measured before it."""
    known = {frozenset(g.group for g in start)}
    assert len(log) == len(calls)
    for entry, groups in zip(log, calls):
        base, added, removed = _base(entry["move"], groups)
        assert base in known, (entry["move"], "its base was never measured")
        want = measured(base) + sum(SCORES[n][0] for n in added) - sum(SCORES[n][0] for n in removed)
        assert entry["predicted"] == pytest.approx(want, rel=1e-12), entry
        assert entry["measured"] == pytest.approx(measured(groups), rel=1e-12)
        assert (entry["groups_fp8"], entry["bytes_saved"]) == (len(groups), nbytes(groups))
        known.add(groups)


def test_budget_mode_reaches_the_optimum():
    """Budget 3.5: the ranking's prefix {A, B} measures 5.05 (the interaction), so selection stops at {A}, 10 bytes.
    The most bytes within 3.5 is {A, E}: 22 bytes, measured 2.6."""
    budget = 3.5
    best = optimum(lambda s: measured(s) <= budget, key=lambda s: (-nbytes(s), measured(s)))
    assert best == {"A", "E"}
    ranked = rank_groups(list(GROUPS.values()))
    assert [g.group for g in ranked[:2]] == ["A", "B"] and measured({"A", "B"}) > budget
    start = [GROUPS["A"]]
    rec = Recorder()
    out = refine(start, list(GROUPS.values()), [], rec, passes=8, budget=budget, start_measured=(1.0, {"kl_q_p": 1.0}))
    assert {g.group for g in out.groups} == best and out.measured == pytest.approx(2.6)
    assert len(out.log) <= 8
    check_predictions(out.log, rec.calls, start)


def test_memory_mode_reaches_the_optimum():
    """At least 20 bytes with the least mismatch: the ranked prefix {A, B} measures 5.05; the best is {A, C}, 2.5
    (a swap away from the first swap it finds, {A, E} at 2.6)."""
    best = optimum(lambda s: nbytes(s) >= 20, key=lambda s: (measured(s), -nbytes(s)))
    assert best == {"A", "C"}
    start = [GROUPS["A"], GROUPS["B"]]
    rec = Recorder()
    out = refine(start, list(GROUPS.values()), [], rec, passes=16, min_value=20, value=nbytes_of)
    assert {g.group for g in out.groups} == best and out.measured == pytest.approx(2.5)
    assert rec.calls[0] == frozenset({"A", "B"})  # the start, measured first (not logged as a move)
    check_predictions(out.log, rec.calls[1:], start)


def nbytes_of(groups) -> int:
    return sum(g.bytes_saved for g in groups)


def test_forced_groups_stay_and_passes_are_a_bound():
    rec = Recorder()
    out = refine([GROUPS["A"], GROUPS["B"]], list(GROUPS.values()), [GROUPS["B"]], rec, passes=2, min_value=20,
                 value=nbytes_of)
    assert len(out.log) == 2 and "B" in {g.group for g in out.groups}
    assert not any(e["move"] == "leave out B" or e["move"].startswith("swap B ") for e in out.log)
