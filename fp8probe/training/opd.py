"""On-policy distillation runs whose rollouts come from a perturbed copy of the student (TRL underneath).

TRL's `DistillationTrainer` (trl >= 1.16) is the trainer: the student samples its own completions to the
prompts, and the loss is the per-token divergence to the teacher over the full vocabulary on them
(`beta=1.0`: reverse KL, the OPD objective). One method is overridden: `_generate_single_turn`, where TRL
calls `model.generate` on the unwrapped student when vLLM is off (trl/trainer/distillation_trainer.py,
trl 1.16.0). There the student is put, for the duration of the generation only, in the state a rollout engine
would hold it in (`measure.apply_perturbation`: weight noise, FP8 units, an FP8 KV cache, stale weights;
restored exactly on exit), so that the rollouts come from q while the loss and its gradient are taken on the
unperturbed student p, as in a real system whose rollout engine differs from its trainer.

Right after each generation the mismatch is measured on those very rollouts, on fp8probe's one scale
(mismatch.py: mean per-token KL(q‖p) over the full vocabulary, k3 on the sampled tokens, ...), from one
forward of each policy over the prompts and completions. Held-out quality (`heldout_quality`): the student
samples responses to held-out prompts with the step's seed (the same in every run), and the mean per-token
reverse KL to the teacher (full vocabulary) and the teacher's mean log-likelihood of the sampled tokens are
taken on them. Both the measurement and the evaluation leave the global random state as they found it, so a run
at level zero trains exactly as plain TRL OPD does (same seed, same losses; tested).
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import replace

import torch

from ..core.errors import FP8ProbeError
from ..measurement.mismatch import mismatch
from ..measurement.perturbation import Perturbation
from ..measurement.perturbed import apply_perturbation
from ..measurement.reference import response_rows
from ..model.rollouts import Rollouts, make_rollouts
from ..model.structure import list_units
from ..model.student import Student
from .settings import TrainerRun, TrainSettings

TRL_MIN = "1.16"
EVAL_FORWARD = 4  # held-out sequences per scoring forward
EVAL_BATCH = 64  # held-out responses sampled per generate call (48 in one call: 7.0 s against 9.4 s 8 at a time)
INSTALL_HINT = "pip install 'fp8probe[calibrate]'"


def require_trl():
    """TRL's DistillationTrainer and DistillationConfig, or one line naming the extra to install."""
    try:
        import trl
        from trl import DistillationConfig, DistillationTrainer
    except ImportError as e:
        raise FP8ProbeError(
            f"fp8probe calibrate trains with TRL's DistillationTrainer (trl >= {TRL_MIN}), which "
            f"is not installed: {INSTALL_HINT}"
        ) from e
    major, minor = (int(x) for x in trl.__version__.split(".")[:2])
    if (major, minor) < tuple(int(x) for x in TRL_MIN.split(".")):
        raise FP8ProbeError(f"trl {trl.__version__} lacks the stable DistillationTrainer; upgrade: {INSTALL_HINT}")
    return DistillationTrainer, DistillationConfig


def opd_config(settings: TrainSettings, seed: int, output_dir: str, device: str = "cpu"):
    """TRL's DistillationConfig for one run: on-policy, reverse KL (beta=1), the learning-rate schedule asked for, no
    checkpoints or reporting (the run directory is fp8probe's)."""
    _, DistillationConfig = require_trl()
    return DistillationConfig(
        output_dir=output_dir,
        max_steps=settings.steps,
        per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
        lr_scheduler_type=settings.lr_schedule,
        warmup_steps=0,
        max_completion_length=settings.max_new_tokens,
        beta=1.0,
        temperature=settings.temperature,
        top_k=0,
        top_p=1.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
        use_cpu=device == "cpu",
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
    )


def prompt_dataset(prompts: list[str]):
    """TRL's conversational prompt dataset (the trainer applies the chat template)."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])


class Perturber:
    """The rollout engine's state of the student at each step: `make(step)` gives the Perturbation; stale
    levels keep the last `stale` steps' weights (the engine lags behind the trainer by that many updates)."""

    def __init__(self, model, make, stale: int = 0):
        self.model, self.make, self.stale = model, make, stale
        self.history: collections.deque = collections.deque(maxlen=stale + 1) if stale else None

    def at(self, step: int) -> Perturbation:
        p = self.make(step)
        if self.history is not None:
            self.history.append({n: t.detach().clone() for n, t in self.model.named_parameters()})
            # the oldest kept: the weights of `stale` updates ago (fewer at the start, as an async run begins)
            p = replace(p, stale=self.history[0])
        return p


def _sequences(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad: int) -> Rollouts:
    return Rollouts.from_sequences([list(p) for p in prompt_ids], [list(c) for c in completion_ids], pad)


def _logits(model, r: Rollouts) -> tuple[torch.Tensor, torch.Tensor]:
    return response_rows(model, r, batch_size=r.num_sequences)  # one batch: the generation's own


def sampled_logps(model, r: Rollouts) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probability of each sampled response token [M], the tokens [M]) under `model`, in fp32."""
    logits, toks = _logits(model, r)
    return torch.log_softmax(logits.float(), -1).gather(-1, toks[:, None]).squeeze(-1), toks


def measure_rollouts(
    student: Student, p: Perturbation, r: Rollouts
) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
    """Every metric between the unperturbed student (p) and its perturbed copy (q) on rollouts r, and both policies'
    log-probabilities of the sampled tokens ([M] each, in the rollouts' order: what an importance ratio needs)."""
    with contextlib.ExitStack() as stack:
        if student.model.training:
            student.model.eval()
            stack.callback(student.model.train)
        ref, toks = _logits(student.model, r)
        with apply_perturbation(student, p, many_forwards=True):
            cand, _ = _logits(student.model, r)
    lp = torch.log_softmax(ref.float(), -1).gather(-1, toks[:, None]).squeeze(-1)
    lq = torch.log_softmax(cand.float(), -1).gather(-1, toks[:, None]).squeeze(-1)
    return mismatch(ref, cand, toks), lp, lq


def rollout_mismatch(student: Student, p: Perturbation, r: Rollouts) -> dict[str, float]:
    """Every metric between the unperturbed student (p) and its perturbed copy (q) on rollouts r."""
    return measure_rollouts(student, p, r)[0]


def completion_logits(model, inputs: dict) -> torch.Tensor:
    """The logits that predict each completion token of a TRL batch ([B, T, V]): the prompt and completion in one
    forward, the last T + 1 positions kept and the last dropped (TRL's own alignment)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    keep = inputs["completion_ids"].size(1)
    return model(input_ids=ids, attention_mask=attention, logits_to_keep=keep + 1).logits[:, :-1, :]


def sampled(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Each sampled token's log-probability under `logits` ([B, T, V] and [B, T] -> [B, T], fp32)."""
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None]).squeeze(-1)


def verl_supervised_loss(loss_mode: str, topk: int | None = None):
    """One of verl's supervised OPD losses (verl_losses.py) as (student logits, teacher logits, tokens, mask) -> the
    token-mean loss: `k3` on the sampled tokens or `forward_kl_topk` over the teacher's top-`topk`."""
    from .verl_losses import k3_losses, token_mean, topk_forward_kl

    def loss(s_logits, t_logits, tokens, mask):
        if loss_mode == "k3":
            return token_mean(k3_losses(sampled(s_logits, tokens), sampled(t_logits, tokens)), mask)
        return token_mean(topk_forward_kl(s_logits, t_logits, topk), mask)

    return loss


def make_trainer(
    student: Student, teacher, train_prompts: list[str], settings: TrainSettings, run: TrainerRun, loss=None
):
    """A DistillationTrainer for one run; with the run's `perturber`, rollouts come from the perturbed student and
    each step's mismatch lands in `trainer.rollout_mismatch` (one dict per generation). `loss`: verl's supervised
    loss to train with (verl_supervised_loss) in place of TRL's full-vocabulary reverse KL."""
    DistillationTrainer, _ = require_trl()
    args = opd_config(settings, run.seed, run.output_dir, run.device)
    perturber = run.perturber

    class PerturbedRolloutTrainer(DistillationTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, has_tool_images=False):
            if perturber is None:
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, has_tool_images)
            p = perturber.at(self.state.global_step)
            with apply_perturbation(student, p, many_forwards=True):
                completions = super()._generate_single_turn(prompt_ids, images, multimodal_fields, has_tool_images)
            with torch.random.fork_rng(devices=[]):
                seqs = _sequences(prompt_ids, completions, student.tokenizer.pad_token_id)
                self.rollout_mismatch.append(
                    {
                        "step": self.state.global_step + 1,
                        "tokens": seqs.num_response_tokens,
                        **rollout_mismatch(student, p, seqs),
                    }
                )
            return completions

        def _compute_loss(self, unwrapped_student, inputs, num_items_in_batch):
            if loss is None:
                return super()._compute_loss(unwrapped_student, inputs, num_items_in_batch)
            mask = inputs["completion_mask"]
            s_logits = completion_logits(unwrapped_student, inputs)
            self.teacher_model.eval()
            with torch.no_grad():
                t_logits = completion_logits(self.teacher_model, inputs)
            with torch.no_grad():  # TRL logs the student's entropy per token
                logp = torch.log_softmax(s_logits.float(), -1)
                entropy = (-(logp.exp() * logp).sum(-1) * mask).sum()
            return loss(s_logits, t_logits, inputs["completion_ids"], mask), entropy, mask.sum()

    trainer = PerturbedRolloutTrainer(
        model=student.model,
        teacher_model=teacher.model,
        args=args,
        train_dataset=prompt_dataset(train_prompts),
        processing_class=student.tokenizer,
        callbacks=list(run.callbacks),
    )
    trainer.rollout_mismatch = []
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # fp8probe's progress bar and run files say it
    return trainer


@torch.no_grad()
def heldout_quality(
    student: Student, teacher: Student, prompts: list[str], settings: TrainSettings, step: int = 0
) -> dict:
    """The student's mean per-token reverse KL to the teacher (full vocabulary) and the teacher's mean
    log-likelihood, on responses the student samples to the held-out prompts after `step` optimizer steps (the
    step's seed, `TrainSettings.eval_seed_at`; the global random state is left as it was)."""
    model = student.model
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            r = make_rollouts(
                student,
                prompts=prompts,
                samples_per_prompt=settings.eval_samples,
                max_new_tokens=settings.max_new_tokens,
                seed=settings.eval_seed_at(step),
                temperature=settings.temperature,
                batch_size=EVAL_BATCH,
            )
            # a few sequences per forward: a 150k vocabulary's full logits of every held-out sequence at once would
            # hold gigabytes (Qwen2.5 pair: 17 x 150 x 151,936 x 4 bytes = 1.5 GB per model)
            s_logits, toks = response_rows(model, r, batch_size=EVAL_FORWARD)
            t_logits, _ = response_rows(teacher.model, r, batch_size=EVAL_FORWARD)
        m = mismatch(t_logits, s_logits, toks)  # q = the student, p = the teacher: kl_q_p is reverse KL
        t_logp = torch.log_softmax(t_logits.float(), -1).gather(-1, toks[:, None]).mean()
    finally:
        model.train(was_training)
    return {
        "reverse_kl": m["kl_q_p"],
        "forward_kl": m["kl_p_q"],
        "teacher_logp": float(t_logp),
        "tokens": r.num_response_tokens,
    }


def trainable_student(model, tokenizer, name: str) -> Student:
    """A Student around a model being trained (gradients on)."""
    model.requires_grad_(True)
    return Student(
        model=model,
        tokenizer=tokenizer,
        units=list_units(model),
        name=name,
        path="",
        model_type=model.config.model_type,
    )
