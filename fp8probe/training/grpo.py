"""GRPO runs whose rollouts come from a perturbed copy of the student (TRL's GRPOTrainer underneath): the RL side of
the controlled comparison with on-policy distillation (opd.py). Everything but the objective is shared: the
pair, the prompts, the perturbation of the generation (opd.Perturber), the mismatch measured on every rollout
batch and the held-out quality.

The reward is the teacher's mean per-token log-likelihood of the completion (`TeacherLikelihood`): the teacher's
signal that OPD takes per token over the full vocabulary, here one number per sequence, group-normalised by TRL
(`scale_rewards="group"`), TRL 1.16's defaults otherwise (loss "dapo", beta 0, one iteration per generation).
`num_generations` completions per prompt (`TrainSettings.group_size`).

Three variants, as the frameworks run them (verl's names: docs/algo/rollout_corr.md, "Operation Modes"):

    grpo         the policy gradient taken on q's samples as if they were p's (no correction); with `iterations` >= 2
                 the PPO ratio's anchor is the trainer's own log-probs at generation time (TRL's `old_per_token_logps`),
                 the "common implementation mistake" verl's rollout-correction guide names
    grpo-is      each token's loss weighted by the truncated importance ratio min(p(y) / q(y), 2.0): verl's decoupled
                 token-level TIS (`algorithm.rollout_correction.rollout_is=token`, threshold 2.0) and TRL's
                 `vllm_importance_sampling_mode="token_truncate"` with `vllm_importance_sampling_clip_max=2.0`
    grpo-bypass  the PPO ratio's anchor is the rollout's own log-probs, π_θ / q, clipped at 1 ± 0.2 (verl's bypass
                 mode, `ppo_is_bypass`; slime's `--use-rollout-logprobs`): the mismatch enters the clipped ratio itself,
                 so tokens where q strays from p are clipped out of the gradient

TRL computes and applies that ratio only when vLLM generates (trl/trainer/grpo_trainer.py, trl 1.16.0:
`_generate_and_score_completions` builds `importance_sampling_ratio` from vLLM's sampling logprobs when
`self.use_vllm and self.vllm_importance_sampling_correction`; `_compute_loss` multiplies it in under the same
condition). Here the perturbed student generates instead of vLLM, so the ratio is built from the same two
forwards that measure the mismatch (p and q on the sampled tokens) and `_compute_loss` is run with `use_vllm` set for
its duration, which is the only place it reads it.
"""

from __future__ import annotations

import torch

from ..core.errors import FP8ProbeError
from ..measurement.perturbed import apply_perturbation
from ..model.rollouts import Rollouts
from .opd import completion_logits, prompt_dataset, require_trl, sampled, sampled_logps
from .settings import TrainerRun, TrainSettings
from .verl_losses import pg_loss

IS_CAP = 2.0  # verl's rollout_is_threshold default; TRL's clip_max for token_truncate


def require_grpo():
    """TRL's GRPOTrainer and GRPOConfig (the version check is require_trl's)."""
    require_trl()
    from trl import GRPOConfig, GRPOTrainer

    return GRPOTrainer, GRPOConfig


class TeacherLikelihood:
    """A TRL reward function: the teacher's mean log-likelihood per completion token, on the prompt as the chat
    template renders it for generation (TRL's own tokenization of a conversational prompt)."""

    __name__ = "teacher_loglik"

    def __init__(self, teacher, tokenizer):
        self.teacher, self.tokenizer = teacher, tokenizer

    @torch.no_grad()
    def __call__(self, prompts, completions, completion_ids, **kwargs) -> list[float]:
        from ..measurement.mismatch import response_positions

        ids = [
            list(self.tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)["input_ids"])
            for p in prompts
        ]
        seqs = Rollouts.from_sequences(ids, [list(c) for c in completion_ids], self.tokenizer.pad_token_id)
        logp, _ = sampled_logps(self.teacher.model, seqs)
        rows, _ = response_positions(seqs.response_mask)
        total = torch.zeros(seqs.num_sequences, dtype=torch.float64).index_add_(0, rows, logp.double())
        count = torch.bincount(rows, minlength=seqs.num_sequences).clamp_min(1)
        return (total / count).tolist()


def grpo_config(settings: TrainSettings, seed: int, output_dir: str, device: str = "cpu"):
    """TRL's GRPOConfig for one run: `group_size` completions per prompt, the learning-rate schedule asked for, TRL's
    defaults for
    the loss, no checkpoints or reporting."""
    _, GRPOConfig = require_grpo()
    if settings.batch_size % settings.group_size:
        raise FP8ProbeError(
            f"`batch_size` {settings.batch_size} must be a multiple of `group_size` "
            f"{settings.group_size} (GRPO samples group_size completions per prompt)"
        )
    return GRPOConfig(
        output_dir=output_dir,
        max_steps=settings.steps,
        per_device_train_batch_size=settings.batch_size,
        num_generations=settings.group_size,
        learning_rate=settings.learning_rate,
        lr_scheduler_type=settings.lr_schedule,
        warmup_steps=0,
        max_completion_length=settings.max_new_tokens,
        temperature=settings.temperature,
        top_k=0,
        top_p=1.0,
        beta=0.0,
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
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=IS_CAP,
        num_iterations=settings.iterations,
    )


def make_grpo_trainer(
    student,
    teacher,
    train_prompts: list[str],
    settings: TrainSettings,
    run: TrainerRun,
    *,
    correction: bool = False,
    bypass: bool = False,
    opd_pg: bool = False,
):
    """A GRPOTrainer for one run; with a `perturber`, rollouts come from the perturbed student, each step's mismatch
    lands in `trainer.rollout_mismatch`, with `correction` every token's loss is weighted by min(p/q, IS_CAP), and
    with `bypass` the PPO ratio's anchor is q's log-probs of the sampled tokens (without a perturbation q is p).
    `opd_pg`: verl's policy-gradient OPD in place of GRPO's loss (verl_losses.pg_loss: the per-token k1 to the teacher
    as the advantage, anchored as `bypass` anchors it); the teacher-likelihood reward is then only logged."""
    GRPOTrainer, _ = require_grpo()
    bypass = bypass or opd_pg
    args = grpo_config(settings, run.seed, run.output_dir, run.device)
    perturber = run.perturber

    class PerturbedRolloutGRPO(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            if perturber is None:
                return super()._generate_single_turn(
                    prompt_ids, images, multimodal_fields, num_generations, has_tool_images
                )
            from .opd import measure_rollouts

            p = perturber.at(self.state.global_step)
            with apply_perturbation(student, p, many_forwards=True):
                completions, _ = super()._generate_single_turn(
                    prompt_ids, images, multimodal_fields, num_generations, has_tool_images
                )
            with torch.random.fork_rng(devices=[]):
                seqs = Rollouts.from_sequences(
                    [list(x) for x in prompt_ids], [list(c) for c in completions], student.tokenizer.pad_token_id
                )
                metrics, logp_p, logp_q = measure_rollouts(student, p, seqs)
            self.rollout_mismatch.append(
                {"step": self.state.global_step + 1, "tokens": seqs.num_response_tokens, **metrics}
            )
            lengths = [len(c) for c in completions]
            self._ratio = _split(logp_p - logp_q, lengths) if correction else None
            self._anchor = _split(logp_q, lengths) if bypass else None
            return completions, None

        def _generate_and_score_completions(self, inputs):
            self._anchor = None
            out = super()._generate_and_score_completions(inputs)
            if correction and getattr(self, "_ratio", None) is not None:
                out["importance_sampling_ratio"] = _padded_ratio(self._ratio, out["completion_mask"])
                self._ratio = None
            if bypass and self._anchor is not None:  # q's log-probs: the rollout engine's, as verl's bypass keeps them
                out["old_per_token_logps"] = _padded(self._anchor, out["completion_mask"])
                self._anchor = None
            if opd_pg:
                with torch.no_grad():
                    t_logits = completion_logits(teacher.model, out)
                out["teacher_per_token_logps"] = sampled(t_logits, out["completion_ids"])
            return out

        def _compute_loss(self, model, inputs):
            if opd_pg:
                return self._opd_pg_loss(model, inputs)
            if "importance_sampling_ratio" not in inputs:
                return super()._compute_loss(model, inputs)
            use_vllm, self.use_vllm = self.use_vllm, True  # the one condition TRL applies the ratio under
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self.use_vllm = use_vllm

        def _opd_pg_loss(self, model, inputs):
            mask = inputs["completion_mask"]
            logp = sampled(completion_logits(model, inputs), inputs["completion_ids"])
            anchor = inputs.get("old_per_token_logps")
            anchor = logp.detach() if anchor is None else anchor
            loss, clipfrac = pg_loss(logp, inputs["teacher_per_token_logps"], anchor, mask)
            self._metrics["train"]["clip_ratio/region_mean"].append(clipfrac)
            return loss

    trainer = PerturbedRolloutGRPO(
        model=student.model,
        reward_funcs=[TeacherLikelihood(teacher, student.tokenizer)],
        args=args,
        train_dataset=prompt_dataset(train_prompts),
        processing_class=student.tokenizer,
        callbacks=list(run.callbacks),
    )
    trainer.rollout_mismatch = []
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    return trainer


def _split(values: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    return list(torch.split(values, lengths))


def _padded(values: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Per-completion values right-padded with 0 as TRL pads completions ([B, T])."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    for i, v in enumerate(values):
        n = min(len(v), mask.shape[1])
        out[i, :n] = v[:n].float().to(mask.device)
    return out


def _padded_ratio(log_ratios: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """min(exp(log p - log q), IS_CAP) per completion token, right-padded as TRL pads completions ([B, T], 1 on
    padding)."""
    ratio = torch.ones(mask.shape, dtype=torch.float32, device=mask.device)
    for i, lr in enumerate(log_ratios):
        n = min(len(lr), mask.shape[1])
        ratio[i, :n] = torch.exp(lr[:n].float()).clamp(max=IS_CAP).to(mask.device)
    return ratio
