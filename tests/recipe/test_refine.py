"""refine.refine on a synthetic measure function with a known interaction: it reaches the brute-force optimum,
and every logged `predicted` is its base's measured value plus the single scores added, minus those removed."""

import itertools
import re

import pytest

from fp8probe.recipe.refine import Goal, refine
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
    out = refine(
        start, list(GROUPS.values()), [], rec, passes=8, goal=Goal(budget=budget), start_measured=(1.0, {"kl_q_p": 1.0})
    )
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
    out = refine(start, list(GROUPS.values()), [], rec, passes=16, goal=Goal(min_value=20, value=nbytes_of))
    assert {g.group for g in out.groups} == best and out.measured == pytest.approx(2.5)
    assert rec.calls[0] == frozenset({"A", "B"})  # the start, measured first (not logged as a move)
    check_predictions(out.log, rec.calls[1:], start)


def nbytes_of(groups) -> int:
    return sum(g.bytes_saved for g in groups)


def test_forced_groups_stay_and_passes_are_a_bound():
    rec = Recorder()
    out = refine(
        [GROUPS["A"], GROUPS["B"]],
        list(GROUPS.values()),
        [GROUPS["B"]],
        rec,
        passes=2,
        goal=Goal(min_value=20, value=nbytes_of),
    )
    assert len(out.log) == 2 and "B" in {g.group for g in out.groups}
    assert not any(e["move"] == "leave out B" or e["move"].startswith("swap B ") for e in out.log)


# --- significance: moves are taken under a memory target only when the paired change is real ----------------------

PROMPTS, PER_PROMPT = 40, 10  # 400 tokens in 40 prompts


def _evidence(names, effect: float, noise: float):
    """A synthetic measurement of a set of groups: every token's KL = its prompt's difficulty (shared by every set,
    which pairing cancels) + `effect` (the set's true mean) + the set's own noise (seeded by the set)."""
    import zlib

    import torch

    from fp8probe.measurement.measure import Measured

    prompt = torch.arange(PROMPTS).repeat_interleave(PER_PROMPT)
    difficulty = torch.linspace(0.0, 4.0, PROMPTS)[prompt].double()  # prompts differ far more than sets do
    g = torch.Generator().manual_seed(zlib.crc32(",".join(sorted(names)).encode()))
    kl = difficulty + effect + noise * torch.randn(len(prompt), generator=g, dtype=torch.float64)
    m = float(kl.mean())
    return m, {"kl_q_p": m}, Measured({"kl_q_p": m}, {"kl_q_p": kl}, prompt)


def test_pure_noise_takes_no_move():
    """Every set of groups has the same true mismatch; what differs is noise. Without the paired test the first
    lower draw would be taken (seen: the mutation that skips the test takes one); with it, none is, and the moves
    that measured lower are logged as noise."""

    def noisy(groups):
        return _evidence([g.group for g in groups], effect=1.0, noise=0.3)

    start = [GROUPS["A"], GROUPS["B"]]
    out = refine(start, list(GROUPS.values()), [], noisy, passes=16, goal=Goal(min_value=20, value=nbytes_of))
    assert {g.group for g in out.groups} == {"A", "B"}
    assert not any(e["outcome"] == "taken" for e in out.log)
    lower = [e for e in out.log if e["measured"] < noisy(start)[0] and e["groups_fp8"] == 2]
    assert lower and all(e["outcome"] == "noise" for e in lower), out.log
    assert all(lo < 0 < hi for lo, hi in (e["change_interval"] for e in lower))


def test_a_real_interaction_is_found_through_the_noise():
    """The interaction of test_memory_mode_reaches_the_optimum, under per-token noise: the optimum {A, C} is still
    reached, every taken move with a change interval wholly below zero."""

    def real(groups):
        return _evidence([g.group for g in groups], effect=measured([g.group for g in groups]), noise=0.3)

    start = [GROUPS["A"], GROUPS["B"]]
    out = refine(start, list(GROUPS.values()), [], real, passes=16, goal=Goal(min_value=20, value=nbytes_of))
    assert {g.group for g in out.groups} == {"A", "C"}
    taken = [e for e in out.log if e["outcome"] == "taken"]
    assert taken and all(e["change_interval"][1] < 0 for e in taken)


def test_paired_change_by_hand():
    """Shifting every token by 0.01 changes the mean by exactly 0.01 in every resample (the paired interval is the
    point), while each measurement's own interval, driven by how prompts differ, is fifty times wider or more."""
    import torch

    from fp8probe.measurement.measure import Measured

    _, _, old = _evidence(["A"], effect=1.0, noise=0.0)
    kl = old.stats["kl_q_p"] + 0.01
    new = Measured({"kl_q_p": float(kl.mean())}, {"kl_q_p": kl}, old.prompt)
    point, lo, hi = new.change_from(old, "kl_q_p")
    assert point == pytest.approx(0.01) and lo == pytest.approx(0.01) and hi == pytest.approx(0.01)
    a, b = old.interval("kl_q_p")
    assert b - a > 50 * 0.01  # 0.65 here
    point, lo, hi = old.change_from(new, "kl_q_p")
    assert point == pytest.approx(-0.01)
    # top1_agree: lower is worse, so a rise in agreement is a fall in mismatch
    t_old = Measured({}, {"top1": torch.zeros(len(old.prompt))}, old.prompt)
    t_new = Measured({}, {"top1": torch.ones(len(old.prompt))}, old.prompt)
    assert t_new.change_from(t_old, "top1_agree")[0] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="same tokens"):
        new.change_from(Measured({}, {"kl_q_p": kl[:10]}, old.prompt[:10]), "kl_q_p")
