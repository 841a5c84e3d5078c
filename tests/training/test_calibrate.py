"""fp8probe calibrate: OPD and GRPO runs (TRL) whose rollouts come from a perturbed copy of the student, on a tiny
pair; the paired, adaptive ladder around them.

The tiny pair: a 4-block llama teacher (random weights) and its depth-pruned copy (blocks 0 and 2). A few
steps each: the same code as the demo, at a size CI runs in seconds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import pandas as pd
import pytest
import torch
from conftest import tiny_model, tiny_pair, tiny_tokenizer

from fp8probe.core.errors import FP8ProbeError
from fp8probe.measurement.perturbation import Perturbation
from fp8probe.model.prompts import BUILTIN_PROMPTS
from fp8probe.model.structure import list_units
from fp8probe.model.student import Student
from fp8probe.sources.sources import SourceSpec, parse_source
from fp8probe.training.experiment import Experiment
from fp8probe.training.opd import opd_config, prompt_dataset, trainable_student
from fp8probe.training.runs import run_dir, train_one
from fp8probe.training.settings import RunId, TrainerRun, TrainSettings

pytestmark = pytest.mark.slow  # TRL training runs

TRAIN = TrainSettings(steps=3, batch_size=4, max_new_tokens=6, learning_rate=1e-3, eval_every=1, eval_samples=1)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def _settings(levels=("0",), steps=TRAIN.steps, **train):
    return Experiment(
        None,
        "pruned",
        tuple(levels),
        2,
        TrainSettings(**{**TRAIN.__dict__, "steps": steps, **train}),
        tuple(BUILTIN_PROMPTS[:8]),
        tuple(BUILTIN_PROMPTS[8:10]),
    )


def test_depth_pruned_keeps_every_other_block_with_the_teachers_weights(pair):
    teacher, student = pair
    t, s = teacher.model, student.model
    assert s.config.num_hidden_layers == 2 and t.config.num_hidden_layers == 4
    for j, i in enumerate([0, 2]):
        assert torch.equal(s.model.layers[j].mlp.down_proj.weight, t.model.layers[i].mlp.down_proj.weight)
        assert s.model.layers[j].self_attn.layer_idx == j
    assert torch.equal(s.model.embed_tokens.weight, t.model.embed_tokens.weight)
    # a copy: training the student leaves the teacher alone
    assert s.model.layers[0].mlp.down_proj.weight.data_ptr() != t.model.layers[0].mlp.down_proj.weight.data_ptr()
    # the pruned model generates with a KV cache (layer_idx renumbered): same tokens as without a cache
    ids = torch.tensor([[1, 5, 9, 12]])
    a = s.generate(ids, max_new_tokens=5, do_sample=False, use_cache=True, pad_token_id=0)
    b = s.generate(ids, max_new_tokens=5, do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(a, b)


def test_zero_level_is_plain_trl_opd_and_perturbed_rollouts_change_the_run(pair, tmp_path):
    """Level 0 (with fp8probe's evaluation and callbacks) trains exactly as plain DistillationTrainer: same seed,
    same losses. A noise level's first loss differs, though its weights at step 1 are the same: its rollouts came
    from the perturbed copy."""
    from trl import DistillationTrainer

    teacher, student = pair
    s = _settings(("0", "0.3"))
    zero = train_one(teacher, student, RunId("opd", SourceSpec("none"), 0), s, tmp_path)
    plain_model = trainable_student(copy.deepcopy(student.model), student.tokenizer, "plain").model
    plain = DistillationTrainer(
        model=plain_model,
        teacher_model=teacher.model,
        args=opd_config(s.train, 0, str(tmp_path / "plain")),
        train_dataset=prompt_dataset(list(s.train_prompts)),
        processing_class=student.tokenizer,
    )
    plain.train()
    plain_losses = [h["loss"] for h in plain.state.log_history if "loss" in h]
    assert len(plain_losses) == TRAIN.steps
    assert zero.losses == plain_losses
    noisy = train_one(teacher, student, RunId("opd", parse_source("0.3"), 0), s, tmp_path)
    assert noisy.losses[0] != zero.losses[0]
    # the held-out evaluation is seeded: both runs start from the same student and score it the same
    assert zero.quality_start == noisy.quality_start


def test_measured_mismatch_is_positive_and_grows_with_the_level(pair, tmp_path):
    teacher, student = pair
    s = _settings(("0.05", "0.2", "0.8"), steps=2)
    got = [
        train_one(teacher, student, RunId("opd", parse_source(x), 0), s, tmp_path).mismatch["kl_q_p"] for x in s.levels
    ]
    assert 0 < got[0] < got[1] < got[2]
    steps = pd.read_csv(run_dir(tmp_path, "opd", parse_source("0.2"), 0) / "steps.csv")
    assert list(steps["step"]) == [1, 2] and (steps["kl_q_p"] > 0).all() and (steps["k3"] > 0).all()
    stale = train_one(teacher, student, RunId("opd", parse_source("stale:1"), 0), s, tmp_path)
    st = pd.read_csv(run_dir(tmp_path, "opd", parse_source("stale:1"), 0) / "steps.csv")
    # step 1: no update yet, the engine holds the trainer's weights; step 2: one update behind
    assert st["kl_q_p"].iloc[0] == 0 and st["kl_q_p"].iloc[1] > 0 and stale.mismatch["kl_q_p"] > 0
    # the rollout engine's FP8 weights and FP8 KV cache (scale 1.0) as levels: measured, above zero
    for name in ("fp8", "kv"):
        assert train_one(teacher, student, RunId("opd", parse_source(name), 0), s, tmp_path).mismatch["kl_q_p"] > 0


def test_a_level_the_student_cannot_take_is_refused(tmp_path):
    """FP8_BLOCK on dims that are not whole 128-groups: refused (calibrate checks every level before any run)."""
    m = tiny_model("llama", hidden_size=96, intermediate_size=192)
    narrow = Student(m, tiny_tokenizer(), list_units(m), "narrow", "", "llama")
    with pytest.raises(FP8ProbeError, match="FP8_BLOCK fits none"):
        parse_source("fp8:FP8_BLOCK").rollout(narrow, 0)
    assert parse_source("fp8").rollout(narrow, 0)(1).units


def test_levels_parse_and_refuse():
    assert parse_source("0") == SourceSpec("none") and parse_source("0.01") == SourceSpec("noise", 0.01)
    assert parse_source("fp8").scheme == "FP8_DYNAMIC" and parse_source("kv").scheme == "fp8"
    assert parse_source("stale:3") == SourceSpec("stale", 3.0)
    # names and run-directory slugs as the shipped calibration spells them (calibrate --resume finds runs by them)
    texts = ("0", "0.01", "fp8", "kv", "stale:3")
    assert [parse_source(t).name for t in texts] == ["0", "0.01", "fp8:FP8_DYNAMIC", "kv:fp8", "stale:3"]
    assert [parse_source(t).slug for t in texts] == ["0", "noise-0.01", "fp8-FP8_DYNAMIC", "kv-fp8", "stale-3"]
    for bad in ("-1", "nan", "fp8:FP8", "stale:0", "kv:int4", "hot"):
        with pytest.raises(FP8ProbeError):
            parse_source(bad)


def test_cli_runs_tables_budget_and_resume(tiny_dirs, tmp_path, cli):
    from fp8probe.budget.fit import fit_budget
    from fp8probe.budget.settings import BudgetSettings

    out = tmp_path / "cal"

    def args(steps=2):
        return [
            "calibrate",
            "--teacher",
            tiny_dirs["llama"],
            "--out",
            out,
            "--seeds",
            "2",
            "--steps",
            steps,
            "--batch-size",
            "4",
            "--max-new-tokens",
            "5",
            "--eval-every",
            "1",
            "--eval-samples",
            "1",
            "--max-added",
            "0",
        ]

    common = args()
    r = cli(*common, "--levels", "0", "0.2")
    assert r.code == 0, r.err
    runs = pd.read_csv(out / "runs.csv", dtype={"level": str})
    assert list(runs["level"]) == ["0", "0", "0.2", "0.2"] and (runs["mismatch"].iloc[:2] == 0).all()
    assert (runs["mismatch"].iloc[2:] > 0).all() and not runs["higher_is_better"].any()
    assert list(runs["paired_loss"].iloc[:2]) == [0.0, 0.0] and set(runs["objective"]) == {"opd"}
    # the table is what `fp8probe budget` reads, and gives the budget calibrate wrote (paired)
    b = json.loads((out / "budget.json").read_text())
    again = fit_budget(out / "runs.csv", BudgetSettings(tolerance=b["tolerance"]))
    assert again.value == b["value"] and again.paired and b["paired"] and b["tolerance"] == 0.02
    assert json.loads((out / "budget-opd.json").read_text()) == b
    assert (out / "calibration.png").stat().st_size > 0 and (out / "calibrate.json").exists()
    assert not (out / "calibrate.partial.json").exists()
    assert re.search(r"budget: kl_q_p (<=|>) [\d.]+", r.out) and "seeds alone spread" in r.out
    assert "for pruned:3 of " in r.out and b["student"]["name"].startswith("pruned:3 of "), r.out
    assert b["objective"] == "opd" and b["loss"].startswith("on-policy distillation: TRL's DistillationTrainer")
    assert ", objective opd (on-policy distillation: TRL's" in r.out  # the budget labelled with its loss
    assert json.loads((out / "doses.json").read_text())["0.2"]["dose"] == runs["mismatch"].iloc[2]
    # the same directory again: refused without --resume; with it, only the new level trains
    assert cli(*common, "--levels", "0", "0.2").code == 2
    before = (run_dir(out, "opd", parse_source("0.2"), 0) / "run.json").stat().st_mtime_ns
    r = cli(*common, "--levels", "0", "0.2", "0.5", "--resume")
    assert r.code == 0, r.err
    assert (run_dir(out, "opd", parse_source("0.2"), 0) / "run.json").stat().st_mtime_ns == before
    assert len(pd.read_csv(out / "runs.csv")) == 6
    # other training settings are refused on resume
    r = cli(*args(steps=3), "--levels", "0", "--resume")
    assert r.code == 2 and "another train" in r.err
    r = cli(*common, "--lr-schedule", "linear", "--levels", "0", "--resume")
    assert r.code == 2 and "another train" in r.err
    # a calibration written before lr_schedule and eval_seeds existed (they held today's defaults) resumes
    c = json.loads((out / "calibrate.json").read_text())
    for key in ("lr_schedule", "eval_seeds"):
        del c["train"][key]
    (out / "calibrate.json").write_text(json.dumps(c))
    assert cli(*common, "--levels", "0", "0.2", "0.5", "--resume").code == 0
    assert cli(*common, "--eval-seeds", "per-step", "--levels", "0", "--resume").code == 2


def test_learning_rate_schedules_reach_trl():
    """--lr-schedule is the scheduler TRL's trainers run: constant, or decaying linearly / as a cosine to 0 at the
    last step, with no warm-up (transformers' get_scheduler; the first step at the peak)."""
    import math

    from torch import nn, optim
    from transformers import get_scheduler

    from fp8probe.training.grpo import grpo_config

    for name in ("constant", "linear", "cosine"):
        tr = TrainSettings(**{**TRAIN.__dict__, "lr_schedule": name, "steps": 4, "group_size": 2})
        for cfg in (opd_config(tr, 0, "/tmp/x"), grpo_config(tr, 0, "/tmp/x")):
            assert cfg.lr_scheduler_type.value == name and cfg.warmup_steps == 0
        opt = optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
        sched = get_scheduler(name, opt, num_warmup_steps=0, num_training_steps=4)
        lrs = []
        for _ in range(4):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        want = {
            "constant": [1, 1, 1, 1],
            "linear": [1, 0.75, 0.5, 0.25],
            "cosine": [0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)],
        }[name]
        assert lrs == pytest.approx(want)


def test_cli_refusals_are_one_line(tmp_path, cli, monkeypatch):
    r = cli("calibrate", "--out", tmp_path / "a", "--levels", "0", "hot")
    assert r.code == 2 and len(r.lines) == 1 and "not a level" in r.err and not (tmp_path / "a").exists()
    r = cli("calibrate", "--out", tmp_path / "b", "--mark", tmp_path / "nothing.txt")
    assert r.code == 2 and len(r.lines) == 1 and not (tmp_path / "b").exists()
    monkeypatch.setitem(__import__("sys").modules, "trl", None)
    r = cli("calibrate", "--out", tmp_path / "c")
    assert r.code == 2 and len(r.lines) == 1 and "pip install 'fp8probe[calibrate]'" in r.err


def test_interrupted_calibration_keeps_finished_runs_and_resumes(tiny_dirs, tmp_path):
    """Ctrl-C half way: exit 130, the finished runs and the resume state stay; --resume trains only the rest."""
    import signal
    import time

    from conftest import cli_process

    out = tmp_path / "cal"
    common = [
        "calibrate",
        "--teacher",
        tiny_dirs["llama"],
        "--out",
        out,
        "--seeds",
        "2",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--max-new-tokens",
        "5",
        "--eval-every",
        "1",
        "--eval-samples",
        "1",
        "--levels",
        "0",
        "0.1",
        "0.4",
        "--max-added",
        "0",
    ]
    p = cli_process(*common)
    first = run_dir(out, "opd", parse_source("0"), 0) / "run.json"
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None and not first.exists():
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=120) == 130, p.stderr.read()
    assert first.exists() and (out / "calibrate.partial.json").exists() and not (out / "runs.csv").exists()
    before = first.stat().st_mtime_ns
    p = cli_process(*common, "--resume")
    assert p.wait(timeout=300) == 0, p.stderr.read()
    assert first.stat().st_mtime_ns == before and len(pd.read_csv(out / "runs.csv")) == 6
    assert not (out / "calibrate.partial.json").exists()


def test_grpo_at_level_zero_is_plain_trl_grpo_and_the_correction_weights_tokens(pair, tmp_path):
    """GRPO (reward: the teacher's log-likelihood) at level 0 trains exactly as plain GRPOTrainer with the same
    reward function: same seed, same losses. At a noise level, grpo and grpo-is see the same rollouts (the same
    seed and draws) but grpo-is weights each token by min(p/q, 2): their first losses differ."""
    from trl import GRPOTrainer

    from fp8probe.training.grpo import TeacherLikelihood, grpo_config

    teacher, student = pair
    s = _settings(("0", "0.3"), batch_size=4, group_size=2)
    zero = train_one(teacher, student, RunId("grpo", SourceSpec("none"), 0), s, tmp_path)
    plain_model = trainable_student(copy.deepcopy(student.model), student.tokenizer, "plain").model
    plain = GRPOTrainer(
        model=plain_model,
        reward_funcs=[TeacherLikelihood(teacher, student.tokenizer)],
        args=grpo_config(s.train, 0, str(tmp_path / "plain")),
        train_dataset=prompt_dataset(list(s.train_prompts)),
        processing_class=student.tokenizer,
    )
    plain.train()
    plain_losses = [h["loss"] for h in plain.state.log_history if "loss" in h]
    assert len(plain_losses) == TRAIN.steps and zero.losses == plain_losses
    noisy = train_one(teacher, student, RunId("grpo", parse_source("0.3"), 0), s, tmp_path)
    corrected = train_one(teacher, student, RunId("grpo-is", parse_source("0.3"), 0), s, tmp_path)
    first = [
        pd.read_csv(run_dir(tmp_path, o, parse_source("0.3"), 0) / "steps.csv").iloc[0] for o in ("grpo", "grpo-is")
    ]
    assert first[0]["kl_q_p"] == first[1]["kl_q_p"] > 0  # the same first rollouts, measured alike
    assert noisy.losses[0] != corrected.losses[0]


def test_grpo_bypass_anchors_the_ppo_ratio_at_the_rollouts_log_probs(pair, tmp_path, monkeypatch):
    """verl's bypass mode: the PPO ratio is π_θ / q. At the first step π_θ is p, so the loss TRL takes must be, by
    hand, Σ −min(r·A, clip(r, 0.8, 1.2)·A) over the completion tokens / TRL's token count, with r = exp(log p − log q)
    and q's log-probs recomputed here from the perturbed student on the very tokens TRL trained on. Plain grpo (the
    trainer's own anchor) takes r = 1 on the same rollouts, so its first loss is another number; at level 0 bypass
    is plain grpo, loss for loss."""
    from trl import GRPOTrainer

    from fp8probe.measurement.perturbed import apply_perturbation
    from fp8probe.model.rollouts import Rollouts
    from fp8probe.training.grpo import make_grpo_trainer
    from fp8probe.training.opd import Perturber, sampled_logps

    teacher, student = pair
    s = _settings(("0", "0.3"), steps=1, batch_size=4, group_size=2)
    seen = []
    original = GRPOTrainer._compute_loss

    def spy(self, model, inputs):
        loss = original(self, model, inputs)
        seen.append((dict(inputs), float(loss.detach())))
        return loss

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", spy)
    level = parse_source("0.3")
    losses = {}
    for name, bypass in (("grpo", False), ("grpo-bypass", True)):
        st = trainable_student(copy.deepcopy(student.model), student.tokenizer, name)
        perturber = Perturber(st.model, level.rollout(st, 0))
        probe = copy.deepcopy(st.model)  # p before the update (copied before TRL patches the model's LM head)
        trainer = make_grpo_trainer(
            st, teacher, list(s.train_prompts), s.train, TrainerRun(0, str(tmp_path / name), perturber), bypass=bypass
        )
        trainer.train()
        inputs, loss = seen[-1]
        losses[name] = loss
    prompts, completions, mask = inputs["prompt_ids"], inputs["completion_ids"], inputs["completion_mask"]
    lengths = mask.sum(1).tolist()
    seqs = Rollouts.from_sequences(
        [[t for t, m in zip(p, pm) if m] for p, pm in zip(prompts.tolist(), inputs["prompt_mask"].tolist())],
        [c[:n] for c, n in zip(completions.tolist(), lengths)],
        student.tokenizer.pad_token_id,
    )
    probe_student = Student(probe, student.tokenizer, list_units(probe), "probe", "", "llama")
    probe.eval()
    with torch.no_grad():
        lp, _ = sampled_logps(probe, seqs)
        with apply_perturbation(probe_student, perturber.make(0), many_forwards=True):
            lq, _ = sampled_logps(probe, seqs)
    r = torch.exp(lp - lq).split(lengths)
    adv = inputs["advantages"].flatten().tolist()
    total = sum(float(-torch.minimum(ri * a, ri.clamp(0.8, 1.2) * a).sum()) for ri, a in zip(r, adv))
    want = total / float(inputs["num_items_in_batch"])
    assert losses["grpo-bypass"] == pytest.approx(want, rel=1e-4, abs=1e-6)
    anchor = inputs["old_per_token_logps"]
    assert torch.cat([anchor[i, :n] for i, n in enumerate(lengths)]).tolist() == pytest.approx(lq.tolist(), abs=1e-4)
    assert abs(losses["grpo"] - losses["grpo-bypass"]) > 1e-4  # the anchor changed the loss
    zero = [
        train_one(teacher, student, RunId(o, SourceSpec("none"), 0), s, tmp_path).losses
        for o in ("grpo", "grpo-bypass")
    ]
    assert zero[0] == zero[1]


def test_heldout_quality_by_hand_with_each_steps_seed(pair):
    """The held-out reverse KL by hand (sum over the vocabulary of q (log q - log p) at every sampled response token,
    q the student, p the teacher) on responses sampled with the step's seed: eval_seed at every step (fixed, the
    default), eval_seed + step (per-step); the global random state is left as it was."""
    from fp8probe.model.rollouts import make_rollouts
    from fp8probe.training.opd import heldout_quality

    teacher, student = pair
    prompts = list(BUILTIN_PROMPTS[:3])
    tr = TrainSettings(**{**TRAIN.__dict__, "eval_samples": 2, "max_new_tokens": 5, "eval_seeds": "per-step"})

    def by_hand(seed):
        r = make_rollouts(
            student, prompts=prompts, samples_per_prompt=2, max_new_tokens=5, seed=seed, temperature=tr.temperature
        )
        kls = []
        with torch.no_grad():
            for i in range(r.num_sequences):
                ids = r.input_ids[i][r.attention_mask[i] == 1][None]
                q = torch.log_softmax(student.model(ids).logits[0].double(), -1)
                p = torch.log_softmax(teacher.model(ids).logits[0].double(), -1)
                for t in torch.nonzero(r.response_mask[i][r.attention_mask[i] == 1]).flatten().tolist():
                    kls.append(float((q[t - 1].exp() * (q[t - 1] - p[t - 1])).sum()))
        return sum(kls) / len(kls)

    state = torch.random.get_rng_state()
    got = {step: heldout_quality(student, teacher, prompts, tr, step)["reverse_kl"] for step in (0, 3)}
    assert torch.equal(torch.random.get_rng_state(), state)
    assert got[0] == pytest.approx(by_hand(tr.eval_seed), rel=1e-4)
    assert got[3] == pytest.approx(by_hand(tr.eval_seed + 3), rel=1e-4) and got[3] != got[0]
    fixed = TrainSettings(**{**tr.__dict__, "eval_seeds": "fixed"})
    assert heldout_quality(student, teacher, prompts, fixed, 3)["reverse_kl"] == got[0]
    assert TrainSettings().eval_seeds == "fixed"


def test_importance_ratio_by_hand():
    """min(exp(log p - log q), 2) per completion token, right-padded with 1 as TRL pads completions."""
    import math

    from fp8probe.training.grpo import _padded_ratio

    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    got = _padded_ratio([torch.tensor([0.0, math.log(1.5), math.log(3.0)]), torch.tensor([math.log(0.25)])], mask)
    assert got.flatten().tolist() == pytest.approx([1.0, 1.5, 2.0, 0.25, 1.0, 1.0])


def test_teacher_likelihood_is_the_mean_log_prob_of_the_completion(pair):
    """The reward of one completion by hand: the teacher's log-softmax at each completion position, averaged."""
    from fp8probe.training.grpo import TeacherLikelihood

    teacher, student = pair
    tok = student.tokenizer
    msgs = [{"role": "user", "content": BUILTIN_PROMPTS[0]}]
    prompt = list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"])
    completion = [7, 11, 13]
    got = TeacherLikelihood(teacher, tok)([msgs], ["x"], [completion])
    with torch.no_grad():
        logits = teacher.model(torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    want = sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)) / 3
    assert got == pytest.approx([want], rel=1e-5)


def test_curve_quality_by_hand():
    """auc: trapezoid mean over steps 0..20 of (8, 4, 3, 3, 2.5) at steps 0, 5, 10, 15, 20 = (30 + 17.5 + 15 +
    13.75) / 20 = 3.8125; the last fifth (step 15 -> 20) improved it by (3 - 2.5) / 3."""
    from fp8probe.training.runs import curve_quality

    evals = [{"step": s, "reverse_kl": q} for s, q in zip((0, 5, 10, 15, 20), (8, 4, 3, 3, 2.5))]
    got = curve_quality(evals)
    assert got["auc"] == pytest.approx(3.8125) and got["final"] == 2.5
    assert got["plateau"] == pytest.approx((3 + 3 + 2.5) / 3)  # the evaluations at steps 10, 15 and 20
    odd = curve_quality([{"step": s, "reverse_kl": q} for s, q in zip((0, 3, 6, 7), (8, 5, 4, 2))])
    assert odd["plateau"] == pytest.approx((4 + 2) / 2)  # steps >= 3.5 of 0..7
    assert got["late_improvement"] == pytest.approx(0.5 / 3)


def _fake_run(response, order):
    """A run replaced by a known response: `response(objective, level, seed)` gives its measured mismatch (the
    level's dose too) and quality; every run is recorded in `order` as (level name, seed)."""
    from fp8probe.core.records import TrainingRunRecord

    def run(objective, level, seed):
        m, q = response(objective, level, seed)
        order.append((level.name, seed))
        return TrainingRunRecord(
            objective=objective,
            level=level.name,
            kind=level.kind,
            value=level.value,
            scheme=level.scheme,
            seed=seed,
            steps=1,
            seconds=0.0,
            mismatch={"kl_q_p": m, "k3": m, "tokens": 10},
            losses=[],
            quality_start={"reverse_kl": 5.0, "teacher_logp": -1.0},
            quality_end={"reverse_kl": q, "teacher_logp": -1.0},
            quality={"plateau": q, "auc": q, "final": q, "late_improvement": 0.0},
        )

    return run


def _fake_ladder(response):
    """A calibration ladder (training.experiment.Ladder, its decisions as they are) whose runs are `_fake_run`s; the
    ladder's `order` lists every run it asked for."""
    from fp8probe.training import experiment as cal

    def make(c, out, device, progress, log):
        order = []
        ladder = cal.Ladder(
            c, _fake_run(response, order), lambda o, level: {"dose": response(o, level, 0)[0]}, bootstrap=cal.BOOTSTRAP
        )
        ladder.order = order
        return ladder

    return make


def _fake_trainer(response):
    """training.experiment._Trainer with its runs replaced by `_fake_run`s (calibrate() end to end, no training)."""
    from fp8probe.model.structure import list_units

    class Trainer:
        def __init__(self, c, out, device, progress, log):
            self.order = []
            self.run = _fake_run(response, self.order)
            self.bar = type("Bar", (), {"close": lambda self: None})()
            m = tiny_model("llama")
            self.initial = self.teacher = Student(m, tiny_tokenizer(), list_units(m), "fake", "", "llama")

        def dose(self, objective, level):
            return {"dose": response(objective, level, 0)[0]}

        def more(self, runs):
            pass

    return Trainer


def test_adaptive_ladder_brackets_a_known_edge(tmp_path, monkeypatch):
    """The ladder with runs replaced by a known response (mismatch = 10 sigma^2, paired loss 0 up to a mismatch of
    3e-3, then 5 % per doubling; the seeds offset the quality alike at every level): starting from 0, 0.003, 0.03, 0.3
    it adds noise levels until the edge is bracketed within a factor of 2 of measured mismatch, and the budget
    lands at the last admitted level with an interval inside the bracket."""
    import math

    from fp8probe.training import experiment as cal

    def response(objective, level, seed):
        m = 10 * level.value**2 if level.kind == "noise" else 0.0
        loss = 0.0 if m <= 3e-3 else 0.05 * math.log2(m / 3e-3)
        return m, (2.0 + 0.3 * seed) * (1 + loss)

    Ladder = _fake_ladder(response)
    monkeypatch.setattr(cal, "BOOTSTRAP", 100)  # the fits' resamples: the ladder's decisions read the point fit
    c = Experiment(
        None, "pruned", ("0", "0.003", "0.03", "0.3"), 3, TRAIN, ("a",), ("b",), max_added=6, response="relative"
    )
    df, budget, added = Ladder(c, tmp_path, "cpu", False, None).objective("opd")
    noise = df[df["kind"] == "noise"].groupby("value")["mismatch"].first()
    ok = [s for s in noise.index if 10 * s**2 <= 3e-3 + 1e-12]
    lo, hi = max(ok), min(s for s in noise.index if s not in ok)
    assert added and noise[hi] / noise[lo] <= 2.0 and len(added) <= 6
    assert budget.value == pytest.approx(noise[lo]) and budget.interval == (pytest.approx(noise[lo]),) * 2
    assert cal.next_level(budget, df, 2.0) is None  # terminated: nothing left to add


def test_allocated_runs_go_to_the_edge_with_their_twins_and_replay_on_resume(tmp_path, monkeypatch):
    """After the ladder (no adaptive levels), `max_runs` runs are added where dose.allocate says (runs replaced by a
    known response: mismatch = 200 σ², paired loss 4 % per unit of mismatch, so the benchmark dose is 0.5 at σ =
    0.05): first a new noise level near σ = 0.05 with the ladder's seeds, then further seeds there, each with its
    mismatch-free twin first; the runs spent never exceed the cap, and a second pass over the same results (a
    resume) asks for exactly the same runs."""
    from fp8probe.training import experiment as cal

    def response(objective, level, seed):
        m = 200 * level.value**2 if level.kind == "noise" else 0.0
        return m, (2.0 + 0.3 * seed) * (1 + 0.04 * m + 0.002 * ((seed * 7 + int(m * 1000)) % 5 - 2))

    Ladder = _fake_ladder(response)
    monkeypatch.setattr(cal, "BOOTSTRAP", 60)
    c = Experiment(
        None,
        "pruned",
        ("0", "0.005", "0.015", "0.1"),
        3,
        TRAIN,
        ("a",),
        ("b",),
        max_added=0,
        max_runs=7,
        response="relative",
    )
    first = Ladder(c, tmp_path, "cpu", False, None)
    df, budget, added = first.objective("opd")
    spent = first.spent["opd"]
    assert spent["runs"] <= 7 and spent["stopped"] == "max_runs"
    new = first.order[12:]  # the ladder's 12 runs, then the allocated ones
    (level,) = spent["levels"]
    sigma = parse_source(level).value
    assert 0.03 <= sigma <= 0.08 and added == [level]
    assert new[:3] == [(level, 0), (level, 1), (level, 2)]
    for i, (name, seed) in enumerate(new[3:]):
        if seed >= 3 and name == level:
            assert ("0", seed) in new[: 3 + i]  # its twin ran before it
    again = Ladder(c, tmp_path, "cpu", False, None)
    again.objective("opd")
    assert again.order == first.order


def test_a_resume_of_one_objective_keeps_the_others_runs_and_budget(tmp_path, monkeypatch):
    """A calibration of opd and grpo resumed with opd alone (say, to add its FP8 levels) keeps grpo's rows in
    runs.csv, refits and writes its budget, and lists both objectives in calibrate.json with grpo as kept."""
    from fp8probe.training import experiment as cal

    def response(objective, level, seed):
        m = (200 if objective == "grpo" else 100) * level.value**2 if level.kind == "noise" else 0.0
        return m, (2.0 + 0.3 * seed) * (1 + 0.04 * m + 0.002 * ((seed * 7 + int(m * 1000)) % 5 - 2))

    monkeypatch.setattr(cal, "_Trainer", _fake_trainer(response))
    monkeypatch.setattr(cal, "BOOTSTRAP", 30)
    monkeypatch.setattr("fp8probe.plots.figures.calibration_plot", lambda *a, **k: None)
    levels = ("0", "0.01", "0.05", "0.2")
    both = Experiment(
        None, "pruned", levels, 3, TRAIN, ("a",), ("b",), objectives=("opd", "grpo"), max_added=0, response="relative"
    )
    cal.calibrate(both, tmp_path, progress=False)
    grpo_before = json.loads((tmp_path / "budget-grpo.json").read_text())["value"]
    one = Experiment(
        None,
        "pruned",
        levels + ("0.03",),
        3,
        TRAIN,
        ("a",),
        ("b",),
        objectives=("opd",),
        max_added=0,
        response="relative",
    )
    res = cal.calibrate(one, tmp_path, progress=False)
    runs = pd.read_csv(tmp_path / "runs.csv", dtype={"level": str})
    assert sorted(set(runs["objective"])) == ["grpo", "opd"]
    assert (runs["objective"] == "grpo").sum() == 12 and (runs["objective"] == "opd").sum() == 15
    assert json.loads((tmp_path / "budget-grpo.json").read_text())["value"] == pytest.approx(grpo_before)
    c = json.loads((tmp_path / "calibrate.json").read_text())
    assert c["objectives"] == ["opd", "grpo"] and c["kept_objectives"] == ["grpo"]
    assert set(res["budgets"]) == {"opd", "grpo"} and res["ratios"][0]["other"] == "grpo"
    from fp8probe.apps.calibrate import _describe  # its first line names what it fitted, not what the settings ran

    assert "calibrate: 27 runs (opd, grpo; 3 seeds per level)" in _describe(res, one, tmp_path, 60).splitlines()[0]


def test_mismatch_free_runs_keep_their_checkpoints_for_a_series(pair, tmp_path):
    """calibrate --save-checkpoints: the level-0 run keeps the student at steps 0, 1 and 2 of 2 (first, middle,
    last; here 1 is both), each loading as the weights it had then (step 0: the initial student); a perturbed run
    keeps none."""
    from fp8probe import load_student

    teacher, student = pair
    s = dataclasses.replace(_settings(("0", "0.3"), steps=2), save_checkpoints=True)
    train_one(teacher, student, RunId("opd", SourceSpec("none"), 0), s, tmp_path)
    d = run_dir(tmp_path, "opd", SourceSpec("none"), 0) / "checkpoints"
    assert sorted(p.name for p in d.iterdir()) == ["step-0", "step-1", "step-2"]
    first = load_student(str(d / "step-0")).model
    last = load_student(str(d / "step-2")).model
    w = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(first.state_dict()[w], student.model.state_dict()[w])
    assert not torch.equal(last.state_dict()[w], first.state_dict()[w])  # it trained
    train_one(teacher, student, RunId("opd", parse_source("0.3"), 0), s, tmp_path)
    assert not (run_dir(tmp_path, "opd", parse_source("0.3"), 0) / "checkpoints").exists()


def test_a_stale_levels_dose_is_checked_along_the_run_as_a_user_checks_a_lag(pair, tmp_path):
    """stale:1's dose on the check's axis: the mismatch-free run trained again saves its weights at each evaluation
    step t >= 1 (2 and 4 of 4) and one step before; those are the run's own weights (equal to what the twin's run
    keeps at steps 2 and 4 with --save-checkpoints), and the dose is the mean over t and seeds of `check` of the
    student at t against itself at t - 1, by hand here (Perturbation(stale=...) measured as check measures). Seen
    failing with the old axis (step 0 -> K: another number)."""
    from safetensors.torch import load_file

    from fp8probe import load_student
    from fp8probe.measurement.bench import Bench
    from fp8probe.training.doses import STALE_HOW, Doses, _measured, check_rollouts, checked_steps
    from fp8probe.training.runs import states_along

    teacher, student = pair
    s = dataclasses.replace(_settings(("0", "stale:1"), steps=4, eval_every=2), save_checkpoints=True)
    assert checked_steps(s.train, 1) == [2, 4] and checked_steps(s.train, 3) == [4]
    files = states_along(teacher, student, "opd", 0, s, [1, 2, 3, 4], tmp_path / "along")
    train_one(teacher, student, RunId("opd", SourceSpec("none"), 0), s, tmp_path / "run")
    kept = run_dir(tmp_path / "run", "opd", SourceSpec("none"), 0) / "checkpoints"
    for t in (2, 4):
        theirs = load_student(str(kept / f"step-{t}")).model.state_dict()
        mine = load_file(str(files[t]))
        assert all(torch.equal(mine[n], theirs[n]) for n in mine), t
    doses = Doses(
        student,
        tmp_path / "doses.json",
        lambda o, seed, steps, folder: states_along(teacher, student, o, seed, s, steps, folder),
        s.train,
    )
    import fp8probe.training.doses as doses_module

    by_hand = []
    for seed in range(doses_module.STALE_SEEDS):
        f = states_along(teacher, student, "opd", seed, s, [1, 2, 3, 4], tmp_path / f"hand{seed}")
        for t in (2, 4):
            moved = doses._at(f[t])
            bench = Bench(moved, check_rollouts(moved))
            by_hand.append(_measured(bench, Perturbation(stale=load_file(str(f[t - 1]))))["dose"])
    got = doses.dose("opd", parse_source("stale:1"))
    assert got["how"] == STALE_HOW and set(got["steps"]) == {"2", "4"}
    assert got["dose"] == pytest.approx(sum(by_hand) / len(by_hand), rel=1e-6)


def test_the_gain_response_refuses_twins_that_did_not_learn_before_the_other_levels_train(tmp_path):
    """Twins that end at 6.0 from 5.0 before training (lower is better): with the gain response the ladder stops once
    they are in, naming the objective, before any other level trains; with the relative response it goes on. Seen
    failing with the check skipped (every level trained, the fit refusing only after)."""

    def response(objective, level, seed):
        return (0.0, 6.0) if level.kind == "none" else (10 * level.value**2, 6.0 + level.value)

    Ladder = _fake_ladder(response)
    c = Experiment(None, "pruned", ("0", "0.01", "0.1"), 2, TRAIN, ("a",), ("b",), max_added=0, response="gain")
    ladder = Ladder(c, tmp_path, "cpu", False, None)
    with pytest.raises(FP8ProbeError, match="opd: a mismatch-free run did not improve.*before the other levels"):
        ladder.objective("opd")
    assert ladder.order == [("0", 0), ("0", 1)]
    relative = Ladder(dataclasses.replace(c, response="relative"), tmp_path / "r", "cpu", False, None)
    relative.objective("opd")
    assert len(relative.order) == 6
