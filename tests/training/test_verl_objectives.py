"""verl's OPD losses as calibration objectives (training/verl_losses.py, runs.OBJECTIVES opd-k3, opd-topk:K, opd-pg).

Two kinds of evidence: the per-token losses equal verl 0.9.1's own functions, lifted from the released wheel
(core_algos.kl_penalty, compute_policy_loss_vanilla with agg_loss, distillation/fsdp/losses.compute_forward_kl_topk on
verl's nested layout), on random log-probs that reach every clamp; and the trainers take those losses: the first
step's loss of an opd-k3 and an opd-pg run on the tiny pair equals the loss written out by hand from plain forwards of
the student before the update, the teacher and (opd-pg) the perturbed student that sampled the tokens.
"""

from __future__ import annotations

import copy
import types
from typing import Any, Optional

import pytest
import torch
from conftest import lift, tiny_pair

from fp8probe.core.errors import FP8ProbeError
from fp8probe.model.prompts import BUILTIN_PROMPTS
from fp8probe.model.structure import list_units
from fp8probe.model.student import Student
from fp8probe.sources.sources import parse_source
from fp8probe.training import verl_losses
from fp8probe.training.runs import check_objectives, parse_objective, trainer_maker
from fp8probe.training.settings import TrainerRun, TrainSettings

TRAIN = TrainSettings(steps=1, batch_size=4, group_size=2, max_new_tokens=6, learning_rate=1e-3, iterations=2)


def _logps(shape, seed):
    g = torch.Generator().manual_seed(seed)
    s = -torch.rand(shape, generator=g) * 8
    t = s + torch.randn(shape, generator=g) * 6  # |t - s| past 10 and 20 on some tokens: every clamp acts
    return s, t


def _verl_functional(root):
    f = lift(root, "verl/utils/torch_functional.py", ("masked_sum", "masked_mean"), {"torch": torch})
    return types.SimpleNamespace(masked_sum=f["masked_sum"], masked_mean=f["masked_mean"])


@pytest.mark.network
def test_k3_and_k1_losses_equal_verls_kl_penalty(released):
    verl = lift(
        released["verl"],
        "verl/trainer/ppo/core_algos.py",
        ("kl_penalty", "kl_penalty_forward"),
        {"torch": torch},
    )
    s, t = _logps((6, 50), 0)
    assert (t - s).abs().max() > 20
    clamp = verl_losses.LOSS_MAX_CLAMP  # distillation_loss's clamp of every estimator (losses.py)
    for mode, ours in (("k3", verl_losses.k3_losses), ("k1", verl_losses.k1_losses)):
        want = verl["kl_penalty"](logprob=s, ref_logprob=t, kl_penalty=mode).clamp(-clamp, clamp)
        assert torch.allclose(ours(s, t), want), mode


@pytest.mark.network
def test_topk_forward_kl_equals_verls_on_its_nested_layout(released):
    verl = lift(
        released["verl"],
        "verl/trainer/distillation/fsdp/losses.py",
        ("kl_divergence", "compute_forward_kl_topk"),
        {
            "torch": torch,
            "F": torch.nn.functional,
            "get_ulysses_sequence_parallel_world_size": lambda: 1,
            "DistillationConfig": object,
            "DistillationLossConfig": object,
        },
    )
    g = torch.Generator().manual_seed(1)
    lengths, vocab, k = (5, 9, 3), 40, 8
    student = [torch.randn(n, vocab, generator=g) * 4 for n in lengths]
    teacher = [torch.randn(n, vocab, generator=g) * 4 for n in lengths]
    top = [torch.log_softmax(x, -1).topk(k, -1) for x in teacher]  # the teacher server's top-k log-probs and ids
    config = types.SimpleNamespace(
        distillation_loss=types.SimpleNamespace(use_chunked_topk=False, log_prob_min_clamp=-10.0)
    )
    out = verl["compute_forward_kl_topk"](
        torch.cat(student)[None],
        torch.nested.nested_tensor([v for v, _ in top], layout=torch.jagged),
        torch.nested.nested_tensor([i for _, i in top], layout=torch.jagged),
        config,
        "thd",
    )
    want = out["distillation_losses"][0].clamp_min(0.0)  # compute_forward_kl_topk's caller clamps at 0 (losses.py)
    got = torch.cat([verl_losses.topk_forward_kl(s, t, k) for s, t in zip(student, teacher)])
    assert torch.allclose(got, want, atol=1e-6) and want.max() > 0


@pytest.mark.network
def test_policy_gradient_loss_equals_verls_vanilla_ppo_with_a_k1_advantage(released):
    verl_f = _verl_functional(released["verl"])
    verl = lift(
        released["verl"],
        "verl/trainer/ppo/core_algos.py",
        ("agg_loss", "compute_policy_loss_vanilla"),
        {
            "torch": torch,
            "verl_F": verl_f,
            "Optional": Optional,
            "Any": Any,
            "ActorConfig": object,
            "AlgoConfig": type("AlgoConfig", (), {}),  # asserted not to be the config it gets
            "register_policy_loss": lambda name: lambda f: f,
        },
    )
    s, t = _logps((4, 30), 2)
    g = torch.Generator().manual_seed(3)
    rollout = s + torch.randn(s.shape, generator=g) * 0.8  # the engine's log-probs, off the trainer's
    mask = torch.rand(s.shape, generator=g) > 0.2
    config = types.SimpleNamespace(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, global_batch_info={})
    config.get = lambda key, default: default  # clip_ratio_c: ActorConfig's 3.0
    advantages = -verl_losses.k1_losses(s, t)  # distillation_loss: -(clamped k1), detached
    assert (((s - rollout).exp() > 3) & (advantages < 0) & mask).any()  # the dual clip binds somewhere
    want, metrics = verl["compute_policy_loss_vanilla"](
        old_log_prob=rollout, log_prob=s, advantages=advantages, response_mask=mask, config=config
    )
    got, clipfrac = verl_losses.pg_loss(s, t, rollout, mask)
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    assert clipfrac == pytest.approx(metrics["actor/pg_clipfrac"], rel=1e-6) and clipfrac > 0


def test_objectives_parse_and_refuse():
    assert parse_objective("opd-topk:64") == ("opd-topk", 64)
    assert parse_objective("opd-topk") == ("opd-topk", 128)  # verl's DistillationLossConfig.topk default
    assert parse_objective("opd-k3") == ("opd-k3", None)
    for bad, says in (("opd-k4", "unknown"), ("opd-k3:2", "only opd-topk"), ("opd-topk:0", "positive")):
        with pytest.raises(FP8ProbeError, match=says):
            parse_objective(bad)
    with pytest.raises(FP8ProbeError, match="--iterations 2"):
        check_objectives(["opd-k3", "opd-pg"], TrainSettings(iterations=1))
    check_objectives(["opd-k3", "opd-pg"], TrainSettings(iterations=2))
    from fp8probe.training.experiment import prepare
    from fp8probe.training.settings import CalibrateSettings

    comma = prepare(CalibrateSettings(objectives=("opd-k3,opd-pg", "opd")), TrainSettings(iterations=2))
    assert comma.objectives == ("opd-k3", "opd-pg", "opd")  # as the issue spells it, or one per argument


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def _first_loss(pair, tmp_path, objective, level):
    """(the first step's loss, the inputs it was taken on, the student before the update, the run's perturber)."""
    from fp8probe.training.opd import Perturber, trainable_student

    teacher, student = pair
    st = trainable_student(copy.deepcopy(student.model), student.tokenizer, objective)
    perturber = Perturber(st.model, parse_source(level).rollout(st, 0)) if level != "0" else None
    before = copy.deepcopy(st.model).eval()
    trainer = trainer_maker(objective)(
        st, teacher, list(BUILTIN_PROMPTS[:8]), TRAIN, TrainerRun(0, str(tmp_path / objective), perturber)
    )
    seen = []
    original = trainer._compute_loss

    def spy(*a):
        out = original(*a)
        seen.append(
            (
                dict(a[-2] if objective != "opd-pg" else a[-1]),
                float((out[0] if isinstance(out, tuple) else out).detach()),
            )
        )
        return out

    trainer._compute_loss = spy
    trainer.train()
    inputs, loss = seen[0]
    return loss, inputs, Student(before, student.tokenizer, list_units(before), "before", "", "llama"), perturber


def _by_hand(model, inputs) -> list[torch.Tensor]:
    """Each completion's token log-probs under `model`, one plain forward of its unpadded prompt and completion."""
    out = []
    for p, pm, c, cm in zip(
        inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"], inputs["completion_mask"]
    ):
        prompt, completion = p[pm.bool()], c[cm.bool()]
        ids = torch.cat([prompt, completion])[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        n = len(prompt)
        out.append(logp[n - 1 : -1].gather(-1, completion[:, None]).squeeze(-1))
    return out


@pytest.mark.slow
def test_opd_k3_trains_on_verls_k3_of_the_sampled_tokens(pair, tmp_path):
    teacher, _ = pair
    loss, inputs, before, _ = _first_loss(pair, tmp_path, "opd-k3", "0")
    s, t = torch.cat(_by_hand(before.model, inputs)), torch.cat(_by_hand(teacher.model, inputs))
    d = t - s
    assert loss == pytest.approx(float((d.exp() - d - 1).clamp(max=10).mean()), rel=1e-4)


@pytest.mark.slow
def test_opd_pg_clips_a_k1_advantage_against_the_rollouts_log_probs(pair, tmp_path):
    """At σ 0.3 the tokens come from q; the loss is verl's vanilla PPO with A = t − p (k1 negated) and r = p / q, by
    hand: the mean over tokens of max(−A r, −A clip(r, 0.8, 1.2)), capped at −3 A where A < 0."""
    from fp8probe.measurement.perturbed import apply_perturbation

    teacher, _ = pair
    loss, inputs, before, perturber = _first_loss(pair, tmp_path, "opd-pg", "0.3")
    p = torch.cat(_by_hand(before.model, inputs))
    with apply_perturbation(before, perturber.make(0), many_forwards=True):
        q = torch.cat(_by_hand(before.model, inputs))
    a = torch.cat(_by_hand(teacher.model, inputs)) - p
    r = (p - q).exp()
    worst = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
    want = torch.where(a < 0, torch.minimum(-a * 3.0, worst), worst).mean()
    assert (r - 1).abs().max() > 0.2  # the mismatch reaches the clip: not a test of ratio 1
    assert loss == pytest.approx(float(want), rel=1e-4)
