"""verl's rollout-correction screens predicted on a configuration's own samples (measurement/screens.py): by hand on
five tokens, and against verl's own functions in the released wheel (network)."""

import json
import math
import subprocess

import numpy as np
import pytest

from fp8probe.measurement.screens import K3_REJECTION, TOKEN_TIS, Screen, keep_threshold, outcome, rs_metrics

# two sequences' log-ratios r = log p - log q: A (0, 0.1, -0.2), B (0.5, -0.5)
R = np.array([0.0, 0.1, -0.2, 0.5, -0.5])
LENGTHS = [3, 2]


def _k3(r):
    return math.exp(r) - 1 - r


def test_the_k3_rejection_preset_and_token_tis_by_hand():
    """seq_mean_k3 of A: (0 + (e^0.1 - 1.1) + (e^-0.2 - 0.8)) / 3 = 0.00797 <= 0.01, kept; of B: ((e^0.5 - 1.5) +
    (e^-0.5 - 0.5)) / 2 = 0.1276, masked: 2 of 5 tokens and 1 of 2 sequences masked. Token TIS at 2: every e^r within
    [0.5, 2], so nothing clipped and the mean weight is the mean of e^r (1.0358). The threshold that keeps half of the
    sequences is numpy's median of the two sequence means. Seen failing with seq_sum in place of seq_mean (A's 0.0239
    masked too)."""
    mean_a = (_k3(0.0) + _k3(0.1) + _k3(-0.2)) / 3
    mean_b = (_k3(0.5) + _k3(-0.5)) / 2
    assert mean_a == pytest.approx(0.0079672, abs=1e-7) and mean_b == pytest.approx(0.127626, abs=1e-6)
    q = np.zeros(5)
    got = outcome(K3_REJECTION, q, R, LENGTHS, keep=0.5, draws=50)
    assert got["rollout_rs_masked_fraction"] == pytest.approx(0.4)
    assert got["rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    assert got["threshold_to_keep"] == pytest.approx((mean_a + mean_b) / 2)
    lo, hi = got["seq_masked_interval"]
    assert 0 <= lo <= 0.5 <= hi <= 1
    tis = outcome(TOKEN_TIS, q, R, LENGTHS)
    assert tis["rollout_is_mean"] == pytest.approx(np.exp(R).mean())
    assert tis["rollout_is_ratio_fraction_high"] == 0 and tis["rollout_is_ratio_fraction_low"] == 0
    clipped = outcome(Screen(rollout_is="token", rollout_is_threshold=1.5), q, R, LENGTHS)
    assert clipped["rollout_is_ratio_fraction_high"] == pytest.approx(0.2)  # e^0.5 = 1.65 > 1.5
    assert clipped["rollout_is_max"] == pytest.approx(1.5)
    seq = np.repeat([0, 1], LENGTHS)
    assert rs_metrics(Screen("token_k1", 2.0), R, seq, 2)["rollout_rs_masked_fraction"] == 0  # |r| <= log 2
    assert keep_threshold(Screen("token_k3", 0.1), R, seq, 2, 0.9) is None  # token level: no sequence threshold


SCRIPT = """
import json, sys, torch
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask, compute_rollout_correction_weights
job = json.loads(sys.stdin.read())
lr = torch.tensor(job["log_ratio"], dtype=torch.float64)
mask = torch.tensor(job["mask"], dtype=torch.float64)
out = {}
for rs, th in job["rs"]:
    _, m = compute_rollout_rejection_mask(lr, mask, rollout_rs=rs, rollout_rs_threshold=th)
    out[rs] = {k: m[k] for k in ("rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction")}
for level, th in job["is"]:
    _, m = compute_rollout_correction_weights(lr, mask, rollout_is=level, rollout_is_threshold=th)
    out[level + str(th)] = {k: m[k] for k in ("rollout_is_mean", "rollout_is_max", "rollout_is_ratio_fraction_high",
                                           "rollout_is_ratio_fraction_low", "rollout_is_eff_sample_size",
                                           "rollout_is_seq_fraction_high")}
print(json.dumps(out))
"""


@pytest.mark.network
@pytest.mark.slow
def test_the_screens_equal_verls_own_functions(verl_python):
    """Random log-ratios of 12 sequences of unequal length (heavy tails, some beyond the ±20 clamp), padded as verl
    pads them: every rejection option and IS level computed by verl 0.9.1's compute_rollout_rejection_mask and
    compute_rollout_correction_weights equals fp8probe's. Seen failing with the k1 bounds taken as [0, log u]."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 9, 12)
    flat = rng.standard_t(2, lengths.sum()) * 0.3
    flat[3] = 25.0
    width = int(lengths.max())
    lr = np.zeros((12, width))
    mask = np.zeros((12, width))
    i = 0
    for s, n in enumerate(lengths):
        lr[s, :n], mask[s, :n] = flat[i : i + n], 1
        i += n
    rs = [
        ("token_k1", "0.5_2.0"),
        ("token_k3", 0.05),
        ("seq_mean_k3", 0.01),
        ("seq_sum_k2", 0.2),
        ("seq_max_k3", 0.3),
        ("seq_mean_k1", 2.0),
        ("token_k2,seq_mean_k3", "0.1,0.02"),
    ]
    iss = [("token", 2.0), ("token", "0.5_2.0"), ("sequence", 5.0)]
    job = {"log_ratio": lr.tolist(), "mask": mask.tolist(), "rs": rs, "is": iss}
    r = subprocess.run([str(verl_python), "-c", SCRIPT], input=json.dumps(job), capture_output=True, text=True)
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    seq = np.repeat(np.arange(12), lengths)
    for opt, th in rs:
        mine = rs_metrics(Screen(opt, th), flat, seq, 12)
        assert mine == pytest.approx(theirs[opt], rel=1e-6, abs=1e-9), opt  # verl takes some means in float32
    for level, th in iss:
        mine = outcome(Screen(rollout_is=level, rollout_is_threshold=th), np.zeros_like(flat), flat, lengths)
        for k, v in theirs[level + str(th)].items():
            assert mine[k] == pytest.approx(v, rel=1e-6, abs=1e-9), (level, th, k)
