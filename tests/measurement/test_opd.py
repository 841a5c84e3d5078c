"""The OPD-signal distortion figures (opd.distortion) on synthetic log-probabilities with known ratios, by hand."""

import math

import numpy as np
import pytest

from fp8probe.measurement.opd import OPENRLHF_RANGE, VERL_TRUNCATION, distortion

# pi_train / pi_rollout = p / q per token, and the sequence of each token; none sits on a boundary
RATIOS = [0.4, 1.0, 2.5, 6.0, 0.3, 1.99, 2.01, 4.99, 5.01, 0.49, 0.51, 1.2]
SEQ = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
LOGP = [-0.5, -1.0, -2.0, -0.1, -3.0, -0.7, -1.5, -0.2, -2.5, -0.9, -1.1, -0.4]  # log p of the sampled tokens
TEACHER = [-0.8, -0.6, -2.4, -0.3, -2.0, -1.1, -1.0, -0.5, -3.1, -0.2, -1.6, -0.9]


def test_distortion_by_hand():
    logq = [lp - math.log(r) for lp, r in zip(LOGP, RATIOS)]
    got = distortion(TEACHER, LOGP, logq, SEQ)
    assert (VERL_TRUNCATION, OPENRLHF_RANGE) == (2.0, (0.5, 5.0))
    # verl truncates ratios above 2: 2.5, 6.0, 2.01, 4.99, 5.01
    assert got["ratio_out_verl"] == pytest.approx(5 / 12, abs=1e-15)
    # OpenRLHF keeps [0.5, 5]: out are 0.4, 6.0, 0.3, 5.01, 0.49 (1.99, 4.99 and 0.51 are inside)
    assert got["ratio_out_openrlhf"] == pytest.approx(5 / 12, abs=1e-15)
    # the reward r = log teacher - log policy changes by log p - log q = log ratio on each token
    assert got["mean_abs_reward_delta"] == pytest.approx(sum(abs(math.log(r)) for r in RATIOS) / 12, rel=1e-12)
    # per sequence, sum_t (log q - log p) = -sum_t log ratio: seq 0 -1.791759, seq 1 -1.789729, seq 2 -0.407066
    per_seq = [-sum(math.log(r) for r, s in zip(RATIOS, SEQ) if s == k) for k in range(3)]
    assert per_seq[0] == pytest.approx(-math.log(6.0), rel=1e-12)  # 0.4 x 2.5 = 1: only the 6 is left
    assert all(x < 0 for x in per_seq)  # q gives the sampled tokens less probability: the estimate falls
    assert got["seq_rkl_delta"] == pytest.approx(sum(per_seq) / 3, rel=1e-12)
    assert got["seq_rkl_delta"] == pytest.approx(-1.329518, abs=1e-6)
    r_p = np.array(TEACHER) - np.array(LOGP)
    r_q = np.array(TEACHER) - np.array(logq)
    assert got["reward_corr"] == pytest.approx(float(np.corrcoef(r_p, r_q)[0, 1]), rel=1e-12)


def test_no_mismatch_and_the_sign_of_the_sequence_change():
    same = distortion(TEACHER, LOGP, LOGP, SEQ)
    assert same == {
        "mean_abs_reward_delta": 0.0,
        "reward_corr": pytest.approx(1.0),
        "seq_rkl_delta": 0.0,
        "ratio_out_verl": 0.0,
        "ratio_out_openrlhf": 0.0,
    }
    higher = distortion(TEACHER, LOGP, [x + 0.1 for x in LOGP], SEQ)  # q gives every sampled token more
    assert higher["seq_rkl_delta"] == pytest.approx(0.4, rel=1e-12)  # 4 tokens per sequence x 0.1
    assert higher["ratio_out_verl"] == 0 and higher["ratio_out_openrlhf"] == 0  # ratio exp(-0.1) = 0.905
