"""The runs as a design (budget/design.py): the gain response by hand, the seed's variance components recovered, the
baseline chosen by them, and an interval that covers a known truth when every level shares its seed's twin."""

import numpy as np
import pandas as pd
import pytest

from fp8probe.budget.design import Design, choose_pairing, components, losses, response, twins_of


def test_the_gain_response_by_hand_in_both_directions():
    """Lower is better: before training 8.0, the twin reached 4.0, the run 4.2: it lost 0.2 of a 4.0 gain, 5 %.
    Higher is better: 0.30 before, the twin 0.60, the run 0.55: 0.05 of 0.30, 16.7 %. The relative response of the
    first is 0.2 / 4.0 = 5 % too (a score whose shared part is its step-0 value would dilute it; the gain does not)."""
    assert response(4.0, 4.2, 8.0, False, "gain") == pytest.approx(0.05)
    assert response(0.60, 0.55, 0.30, True, "gain") == pytest.approx(0.05 / 0.30)
    assert response(4.0, 4.2, 8.0, False, "relative") == pytest.approx(0.05)
    # a score that adds the same step-0 evaluation (weight 1/8) to every run: the gain is unchanged, the relative
    # loss is diluted
    shared = 8.0 / 8
    assert response(4.0 * 7 / 8 + shared, 4.2 * 7 / 8 + shared, 8.0, False, "gain") == pytest.approx(0.05)
    assert response(4.0 * 7 / 8 + shared, 4.2 * 7 / 8 + shared, 8.0, False, "relative") < 0.045


def _layout(rng, su, s0, s1, seeds=7, levels=6):
    """Pair A's layout: twins at every seed, most levels at 3 seeds, one at all."""
    present = np.zeros((levels, seeds), bool)
    present[0] = True
    present[1:, :3] = True
    present[3] = True
    m = np.linspace(4.0, 4.5, levels)
    q = (
        m[:, None]
        + rng.normal(0, su, (1, seeds))
        + rng.normal(0, 1, (levels, seeds)) * np.where(np.arange(levels)[:, None] == 0, s0, s1)
    )
    return Design(np.arange(levels) * 0.1, np.where(present, q, np.nan), tuple(range(seeds)), 8.0, False)


def test_the_variance_components_are_recovered_on_average():
    """Quality = level mean + a seed's shift (sd 0.3) + a run's own noise (twins 0.1, perturbed runs 0.2), in pair
    A's unbalanced layout: Henderson's moments (unclipped), averaged over 1,000 draws, land within 10 % of the truth
    (0.09, 0.01, 0.04); the clipped variances are never negative and err high, not low."""
    rng = np.random.default_rng(1)
    comps = [components(_layout(rng, 0.3, 0.1, 0.2)) for _ in range(1000)]
    assert np.mean([c.raw for c in comps], axis=0) == pytest.approx([0.09, 0.01, 0.04], rel=0.1)
    clipped = np.array([[c.seed, c.twin, c.run] for c in comps])
    assert (clipped >= 0).all() and (clipped.mean(0) >= np.array([0.09, 0.01, 0.04]) * 0.95).all()
    # the seed component the budget uses (clipped at 0, rarely here): its residual part taken out
    assert clipped.mean(0)[0] == pytest.approx(0.09, rel=0.15)
    # a small seed effect (sd 0.05: 0.0025) beside the runs' noise: the reduction is mostly the residuals' part; with
    # it taken out the clipped estimate averages 0.0037 (clipping raises it), without it 0.011 (4.4x)
    small = [components(_layout(rng, 0.05, 0.1, 0.2)).seed for _ in range(1000)]
    assert 0.0025 <= np.mean(small) < 0.005


def test_the_parametric_draws_know_the_variances_only_from_their_degrees_of_freedom():
    """Components estimated on 2 degrees of freedom each (three seeds' worth) with 400 cells per draw, so each draw's
    own variance is read off it to a few percent: a draw's variance is σ² x 2 / χ²_2, so a share 1 - exp(-1/3) =
    0.283 of the draws have their runs' variance above 3 σ² (by hand from χ²_2's distribution function), not none.
    Seen failing with the variances treated as known (no draw above 1.2 σ²: a BMDL 31-42 % too high where that
    bootstrap sets the end)."""
    from fp8probe.budget.design import Components, parametric

    seeds = 400
    d = Design(np.array([0.0, 1.0]), np.full((2, seeds), 4.0), tuple(range(seeds)), 8.0, False)
    comp = Components(0.0, 1.0, 1.0, 2.0, 2.0, 2.0)
    q = parametric(d, np.array([4.0, 4.0]), comp, 2000, np.random.default_rng(5))
    drawn = np.var(q[:, 1, :], axis=1, ddof=1)  # the perturbed runs' variance of each draw
    assert np.mean(drawn > 3.0) == pytest.approx(1 - np.exp(-1 / 3), abs=0.04)


def test_the_baseline_follows_the_components():
    """A large seed effect (σ_u² 0.09 against a twin's 0.01): each seed's own twin; none (0 against 0.04): the
    twins' mean, where pairing would only add the twin's noise."""
    rng = np.random.default_rng(2)
    assert choose_pairing(components(_layout(rng, 0.3, 0.1, 0.2)), 7)[0] == "seed"
    assert choose_pairing(components(_layout(rng, 0.0, 0.3, 0.2)), 7)[0] == "mean"


def test_paired_losses_share_their_seeds_twin():
    """A seed-paired loss puts the twin's own noise into every level of that seed, alike: two levels' losses of one
    seed move together (the shared twin effect), against the twins' mean they do not."""
    rng = np.random.default_rng(3)
    a, b = [], []
    for _ in range(2000):
        d = _layout(rng, 0.0, 0.2, 0.2)
        y = losses(d, d.q, twins_of(d.q), "gain", "seed")
        z = losses(d, d.q, twins_of(d.q), "gain", "mean")
        a.append((y[1, 0], y[2, 0]))
        b.append((z[1, 0], z[2, 0]))
    assert np.corrcoef(np.array(a).T)[0, 1] == pytest.approx(0.5, abs=0.06)  # σ0² / (σ0² + σ1²)
    assert np.corrcoef(np.array(b).T)[0, 1] == pytest.approx(1 / 8, abs=0.06)  # the mean of 7 twins: (1/7) / (1/7 + 1)


@pytest.mark.slow
def test_the_interval_covers_a_known_truth_when_levels_share_their_twin():
    """Coverage with the seed as a random effect: a linear truth (2 % of the gain at dose 1.0) on six levels, three
    seeds each, every level's loss paired with its seed's twin, whose noise is half a paired loss's variance (GRPO's
    measured share, 0.52), per-run sd 5 % of the gain. Over 80 draws the 90 % interval holds the true BMD in at least
    85 % (measured 91 %). Seen failing (83 %) with budget.json 3's procedure planted back: the seed bootstrap's
    percentiles unwidened and a parametric part that draws each level's noise independently (the twin's folded in)."""
    from fp8probe.budget.fit import fit_budget
    from fp8probe.budget.settings import BudgetSettings

    rng = np.random.default_rng(4)
    hits, n = 0, 80
    for draw in range(n):
        rows = []
        for s in range(3):
            q0 = 4.0 + rng.normal(0, 0.2 * np.sqrt(0.5))
            rows.append({"level": "0", "kind": "none", "seed": s, "mismatch": 0.0, "quality": q0})
            for x in (0.1, 0.2, 0.4, 0.8, 1.6, 3.2):
                q = 4.0 + 0.02 * x * 4.0 + rng.normal(0, 0.2 * np.sqrt(0.5))
                rows.append({"level": str(x), "kind": "noise", "seed": s, "mismatch": x, "quality": q})
        df = pd.DataFrame(rows).assign(higher_is_better=False, quality_start=8.0)
        b = fit_budget(df, BudgetSettings(tolerance=0.02, bootstrap=200, seed=draw))
        lo, hi = b.interval
        hits += lo <= 1.0 and (1.0 <= hi or b.interval_censored)
    assert hits / n >= 0.85, hits
