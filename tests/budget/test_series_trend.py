"""The trend across checkpoints (budget/series.py) read in all three directions, on measurements made by hand."""

import numpy as np
import pytest
import torch

from fp8probe.budget.series import summarize_series
from fp8probe.measurement.measure import Measured


def _measured(kl: np.ndarray) -> Measured:
    """16 prompts of 4 tokens each, the per-token KL(q||p) given."""
    prompt = torch.arange(16).repeat_interleave(4)
    stats = {"kl_q_p": torch.tensor(kl, dtype=torch.float64)}
    return Measured({"kl_q_p": float(kl.mean())}, stats, prompt)


BASE = 0.01 * (1.0 + 0.5 * np.sin(np.arange(64)))  # 0.005 .. 0.015: prompts differ, none by much


@pytest.mark.parametrize("scale, reading", [(4.0, "grows"), (0.25, "falls"), (1.0, "cannot be told from flat")])
def test_the_trend_reads_growth_fall_and_flat(scale, reading):
    """last / first is `scale` exactly (the same tokens' KL times it); each bootstrap draw resamples the two sets of
    prompts independently, so the interval spreads about it: x4 and x0.25 lie far outside a draw's spread (the
    prompts' means vary by about 10 % here), x1 straddles 1. Seen failing with "grows" read off the interval's
    upper end (the flat series then read "grows")."""
    rows = [{"checkpoint": "a", "verdict": "ADMIT"}, {"checkpoint": "b", "verdict": "ADMIT"}]
    out = summarize_series(rows, _measured(BASE), _measured(BASE * scale), "kl_q_p")
    t = out["trend"]
    assert t["ratio_last_first"] == pytest.approx(scale, rel=1e-12)
    lo, hi = t["interval"]
    assert lo <= scale <= hi
    assert t["reading"] == reading
    if scale == 1.0:
        assert lo < 1 < hi
    assert out["first_outside"] is None


def test_the_first_rejected_checkpoint_is_where_the_configuration_leaves_the_budget():
    rows = [
        {"checkpoint": c, "verdict": v}
        for c, v in (("a", "ADMIT"), ("b", "UNCERTAIN"), ("c", "REJECT"), ("d", "REJECT"))
    ]
    out = summarize_series(rows, _measured(BASE), _measured(BASE * 4), "kl_q_p")
    assert out["first_outside"] == "c" and out["first_uncertain"] == "b"
