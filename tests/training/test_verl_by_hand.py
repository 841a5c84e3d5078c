"""Hand-computed fast cases for each verl figure, loss and run dose the network tests check against verl's released
code (tests/measurement/test_verl_metrics.py, tests/training/test_verl_objectives.py, test_verl_runs.py): a planted
sign or direction slip fails here without the wheels."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fp8probe.measurement.verl import verl_metrics
from fp8probe.training.verl_losses import k1_losses, k3_losses

# two sequences: log q (the rollout engine's) and log p (the trainer's) of each sampled token
Q = [-1.0, -2.0, -0.5, -3.0, -1.5]
P = [-1.2, -1.8, -0.5, -2.0, -1.5]
LENGTHS = [2, 3]


def test_verl_figures_by_hand():
    """Per token q - p = (0.2, -0.2, 0, -1, 0); kl = mean(q - p) = -0.2; k3_kl = mean(e^(p-q) - (p-q) - 1) with p - q
    = (-0.2, 0.2, 0, 1, 0): (0.018731 + 0.021403 + 0 + 0.718282 + 0) / 5 = 0.151683. Per sequence mean log q (-1.5,
    -5/3) and mean log p (-1.5, -4/3): log_ppl_diff = mean(mean q - mean p) = mean(0, -1/3) = -1/6; ppl_ratio = mean of
    exp: (1 + e^(-1/3)) / 2; |log_ppl_diff| 1/6; ppo_clip_share: |e^(p-q) - 1| > 0.2 for 0.2 (0.2214) and 1 (1.718): 2
    of 5. Seen failing with log_ppl_diff's sign turned (+1/6) and with ppl_ratio inverted."""
    m = verl_metrics(torch.tensor(Q), torch.tensor(P), torch.tensor(LENGTHS))
    assert m["rollout_corr/kl"] == pytest.approx(-0.2)
    d = [-0.2, 0.2, 0.0, 1.0, 0.0]
    assert m["rollout_corr/k3_kl"] == pytest.approx(sum(math.exp(x) - x - 1 for x in d) / 5)
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx(-1 / 6)
    assert m["rollout_corr/log_ppl_abs_diff"] == pytest.approx(1 / 6)
    assert m["rollout_corr/ppl_ratio"] == pytest.approx((1 + math.exp(-1 / 3)) / 2)
    assert m["rollout_corr/training_ppl"] == pytest.approx((math.exp(1.5) + math.exp(4 / 3)) / 2)
    assert m["ppo_clip_share"] == pytest.approx(2 / 5)
    # verl's pg_clipfrac counts the side the advantage binds: with either sign alike, half the tokens outside the
    # clip (here both above 1.2: e^0.2 and e^1), 1/5
    assert m["pg_clipfrac"] == pytest.approx(1 / 5)


def test_k3_runs_from_the_teacher_to_the_student_by_hand():
    """verl's kl_penalty(student, teacher, "k3"): kl = t - s, k3 = e^kl - kl - 1. Student -1, teacher -2: kl = -1,
    e^-1 + 1 - 1 = 0.367879; the other direction would give e - 2 = 0.718282. k1 = s - t = 1. Seen failing with the
    direction turned."""
    s, t = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert float(k3_losses(s, t)) == pytest.approx(math.exp(-1))
    assert float(k1_losses(s, t)) == pytest.approx(1.0)


def test_a_verl_runs_dose_is_the_mean_over_its_steps(tmp_path):
    """A run logging rollout_corr/kl 0.1, 0.2, 0.6 over three steps has the dose 0.3 (the mean over its steps), not its
    last step's 0.6; the twin's dose is 0. Seen failing with the last step's value."""
    from fp8probe.training.verl_runs import VerlRunsSettings, verl_runs_table

    def write(name, kls):
        lines = [{"step": 0, "data": {"val-core/x/acc": 0.4}}]
        for i, kl in enumerate(kls, 1):
            lines.append({"step": i, "data": {"rollout_corr/kl": kl, **({"val-core/x/acc": 0.5} if i == 3 else {})}})
        (tmp_path / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
        return str(tmp_path / name)

    twin = write("twin.jsonl", [1e-5, 1e-5, 1e-5])
    fp8 = write("fp8.jsonl", [0.1, 0.2, 0.6])
    specs = (f"{twin}:level=0,seed=0,objective=opd-k3", f"{fp8}:level=fp8,seed=0,objective=opd-k3")
    table = verl_runs_table(VerlRunsSettings(from_verl=specs))
    df = table[0] if isinstance(table, tuple) else table
    got = dict(zip(df["level"].astype(str), df["mismatch"]))
    assert got["fp8"] == pytest.approx(0.3) and got["0"] == 0.0
