"""What a calibration's design can decide before it trains (budget/sizing.py): hand-computed against Student-t and
the square-root law, and printed by calibrate before its first run."""

import math

import pytest
from scipy import stats

from fp8probe.budget.sizing import PAIR_A_OPD, Components, level_halfwidth, runs_for_x3, seeds_to_show, sizing_lines


def test_one_levels_interval_and_the_seeds_to_show_it_within_the_tolerance_by_hand():
    """Pair A's OPD components: a paired loss's sd is sqrt(0.0155 + 0.0499) / 3.21 = 7.97 % of the gain; three seeds
    give ±t_0.95,2 x 7.97 % / sqrt(3) = ±13.4 %; showing a level that lost nothing within 2 % 9 times in 10 takes the
    least n with (t_0.95,n-1 + z_0.9) x sd / sqrt(n) <= 2 % (found here by scanning n by hand: 137). Seen failing with
    z in place of t (the halfwidth 7.6 %)."""
    sd = math.sqrt(0.0155 + 0.0499) / 3.21
    assert PAIR_A_OPD.sd_pair == pytest.approx(sd)
    assert level_halfwidth(PAIR_A_OPD, 3) == pytest.approx(stats.t.ppf(0.95, 2) * sd / math.sqrt(3))
    assert level_halfwidth(PAIR_A_OPD, 3) == pytest.approx(0.134, abs=0.001)
    z = stats.norm.ppf(0.9)
    n = next(n for n in range(2, 10_000) if (stats.t.ppf(0.95, n - 1) + z) * sd / math.sqrt(n) <= 0.02)
    assert seeds_to_show(PAIR_A_OPD, 0.02) == n == 137
    assert seeds_to_show(PAIR_A_OPD, 0.10) < seeds_to_show(PAIR_A_OPD, 0.05) < n


def test_quiet_runs_decide_at_the_planned_size_and_noisy_ones_need_more():
    """With runs a hundred times quieter than the tolerance, the planned design's simulated interval is already
    within x3 (the planned runs suffice); with pair A's noise at 2 % it is not, and the runs it would take exceed the
    planned 12 (square-root law from a simulated size). Seen failing with the planned size never taken as enough."""
    quiet = Components(1e-8, 1e-8, 1e-8, "quiet")
    got = runs_for_x3(quiet, [0.1, 1.0, 5.0], 3, 0.02, draws=4)
    assert got["runs_for_x3"] == 12 and got["tried"][0]["median_width"] <= 3
    noisy = runs_for_x3(PAIR_A_OPD, [0.1, 1.0, 5.0], 3, 0.10, draws=4)
    assert noisy["tried"][0]["median_width"] > 3 and noisy["runs_for_x3"] > 12
    lines = sizing_lines(
        PAIR_A_OPD,
        3,
        [
            {
                "tolerance": 0.1,
                "level_halfwidth": 0.134,
                "seeds_to_show_a_level": 7,
                "median_width": 8.5,
                "runs": 12,
                "draws": 4,
                **noisy,
            }
        ],
    )
    assert lines[0].startswith("what this design can decide (MODELLED before training, from pair A's OPD")
    assert "at 10% of the gain: a level within it needs ~7 seeds" in lines[1]
