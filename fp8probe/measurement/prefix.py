"""Prefix shift: where a perturbed rollout engine starts writing other text than the reference would.

Per-token metrics score the reference's own tokens; a perturbed engine also *reaches other prefixes*, and
that part of the mismatch is what per-token importance weights (TIS, MIS, ICEPOP) cannot correct. Both
policies continue the same prompts with common random numbers: at step t every sequence draws one Gumbel
vector g_t (seeded by seed and t alone) and takes argmax(log π(·)/T + g_t), which is an exact sample of π
at temperature T, so that two identical policies write identical text and a difference comes from the
policies alone. Reported per source:

    diverged            fraction of sequences whose continuation differs from the reference's
    first_div_mean/p50  mean / median response position of the first differing token (diverged ones)
    kl_q_p_own, k3_own  the mismatch measured on the candidate's own samples (not the reference's)
    kl_top20_own        what an engine's log-probs show of kl_q_p_own: a lower bound of KL(q || p) on the same
                        samples from q's 20 most likely tokens (vLLM's default max_logprobs) and p whole, the rest of
                        the vocabulary pooled into one bin (mismatch.kl_lower_bound_topk: never above the full KL)
    rollout_corr/..., training/rollout_probs_..., ppo_clip_share
                        verl's own metrics of the candidate's samples, as verl computes them (verl.py)
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from ..model.rollouts import Rollouts, eos_ids
from .bench import Bench
from .engines import engine as get_engine
from .measure import measure
from .perturbation import Perturbation
from .reference import Reference
from .verl import VERL_METRICS, verl_metrics

OBSERVED_TOPK = 20  # the top-K log-probs per token an engine returns (vLLM's default max_logprobs)
PREFIX_COLUMNS = [
    "diverged",
    "first_div_mean",
    "first_div_p50",
    "kl_q_p_own",
    "k3_own",
    "kl_top20_own",
    *VERL_METRICS,
]


@torch.no_grad()
def sample_crn(
    student, prompts: list[list[int]], max_new_tokens: int, seed: int = 0, temperature: float = 1.0, batch_size: int = 8
) -> list[list[int]]:
    """Continuations of tokenized prompts with common random numbers: the same seed, the same draws."""
    model, tok = student.model, student.tokenizer
    device = next(model.parameters()).device
    eos = eos_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    vocab = model.get_output_embeddings().weight.shape[0]
    out: list[list[int]] = []
    for s in range(0, len(prompts), batch_size):
        batch = prompts[s : s + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)  # left-padded
        am = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        done = torch.zeros(len(batch), dtype=torch.bool, device=device)
        resp = [[] for _ in batch]
        cache, step_ids = None, ids
        for t in range(max_new_tokens):
            pos = (am.cumsum(-1) - 1).clamp_min(0)[:, -step_ids.shape[1] :]
            o = model(input_ids=step_ids, attention_mask=am, position_ids=pos, past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            logits = o.logits[:, -1].float()
            soft = getattr(model.config, "final_logit_softcapping", None)
            if soft:
                logits = torch.tanh(logits / soft) * soft
            g = torch.Generator().manual_seed(seed * 1_000_003 + t)
            u = torch.rand(len(prompts), vocab, generator=g, dtype=torch.float64)[s : s + len(batch)].to(device)
            gumbel = -torch.log(-torch.log(u.clamp(1e-300, 1 - 1e-16)))
            scores = torch.log_softmax(logits / max(temperature, 1e-6), -1).double() + (
                gumbel if temperature > 0 else 0
            )
            nxt = scores.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            for i, tkn in enumerate(nxt.tolist()):
                if not done[i]:
                    resp[i].append(tkn)
            done |= torch.isin(nxt, torch.tensor(eos, device=device))
            if bool(done.all()):
                break
            step_ids = nxt[:, None]
            am = torch.cat([am, torch.ones_like(am[:, :1])], dim=1)
        out += resp
    return out


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two continuations differ (a longer one counts from where the other ended)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence(reference: list[list[int]], candidate: list[list[int]]) -> dict[str, float]:
    """diverged, first_div_mean, first_div_p50 of two sets of continuations of the same prompts."""
    firsts = [first_divergence(a, b) for a, b in zip(reference, candidate, strict=True)]
    div = [f for f in firsts if f is not None]
    return {
        "diverged": len(div) / len(firsts),
        "first_div_mean": statistics.fmean(div) if div else float("nan"),
        "first_div_p50": statistics.median(div) if div else float("nan"),
    }


def prompt_ids(student, rollouts: Rollouts) -> list[list[int]]:
    """The prompts of saved rollouts, as token ids (what precedes each sequence's first response token)."""
    out = []
    for i in range(rollouts.num_sequences):
        first = (
            int(rollouts.response_mask[i].nonzero()[0])
            if rollouts.response_mask[i].any()
            else int(rollouts.attention_mask[i].sum())
        )
        out.append(rollouts.input_ids[i, :first].tolist())
    return out


class PrefixShift:
    """Reference continuations (sampled once) and the prefix shift of any perturbation against them."""

    def __init__(
        self,
        student,
        reference: Reference,
        prompts: list[list[int]],
        max_new_tokens: int,
        seed: int = 0,
        temperature: float = 1.0,
        batch_size: int = 8,
        engine: str = "sim",
    ):
        self.student, self.reference, self.prompts, self.engine = student, reference, prompts, engine
        # one batch for generation: a token-by-token forward costs little more for 64 sequences than for 8
        self.kw = dict(
            max_new_tokens=max_new_tokens, seed=seed, temperature=temperature, batch_size=max(batch_size, 64)
        )
        self.reference_samples = sample_crn(student, prompts, **self.kw)

    @classmethod
    def sampled_as(cls, bench, engine: str = "sim") -> "PrefixShift":
        """The prefix shift of the bench's rollouts continued as they were sampled: the bench's response length
        (Bench.response_tokens), seed and batches, against its reference. What `check` and `ladder` both measure."""
        return cls(
            bench.student,
            bench.reference(),
            prompt_ids(bench.student, bench.rollouts),
            bench.response_tokens,
            seed=bench.seed,
            batch_size=bench.batch_size,
            engine=engine,
        )

    def measure(self, p: Perturbation) -> dict[str, float]:
        with get_engine(self.engine).candidate(self.student, p, self.reference.calibration, many_forwards=True) as m:
            cand = sample_crn(replace(self.student, model=m), self.prompts, **self.kw)
        out = divergence(self.reference_samples, cand)
        tok = self.student.tokenizer
        own = Rollouts.from_sequences(self.prompts, cand, tok.pad_token_id if tok.pad_token_id is not None else 0)
        if not own.num_response_tokens:
            nan = dict.fromkeys(VERL_METRICS, float("nan"))
            return {**out, "kl_q_p_own": 0.0, "k3_own": 0.0, "kl_top20_own": 0.0, **nan}
        ref_own = Reference(self.student, own, self.kw["batch_size"], calibrate=False)
        ref_own.calibration = self.reference.calibration  # the engine's static scales stay what they were
        m = measure(Bench.around(ref_own, self.student, own, self.kw["batch_size"]), p, engine=self.engine)
        verl = verl_metrics(m.stats["logp_cand"], m.stats["logp_ref"], own.response_mask.sum(1))
        # the candidate's own tokens as verl's screens see them (screens.outcome): q, p, each sequence's length, its
        # prompt
        self.own = (m.stats["logp_cand"], m.stats["logp_ref"], own.response_mask.sum(1), own.prompt_groups())
        top = self.observed_topk(p, own, ref_own)
        return {**out, "kl_q_p_own": m.metrics["kl_q_p"], "k3_own": m.metrics["k3"], "kl_top20_own": top, **verl}

    def observed_topk(self, p: Perturbation, own: Rollouts, ref_own: Reference) -> float:
        """kl_top20_own (module docstring): the candidate's top-K log-probs of its own samples, as the engine computes
        them, against the reference's whole distribution, the tail pooled; the mean over the tokens."""
        from .mismatch import kl_lower_bound_topk, log_softmax32
        from .reference import response_rows

        with get_engine(self.engine).candidate(self.student, p, self.reference.calibration) as model:
            logits, _ = response_rows(model, own, self.kw["batch_size"])
        top, ids = log_softmax32(logits.cpu()).topk(OBSERVED_TOPK, dim=-1)
        return float(kl_lower_bound_topk(ids, top, ref_own.rows.logp.cpu()).mean())
