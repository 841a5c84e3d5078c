"""How a mismatch source distorts the on-policy-distillation signal.

In OPD the per-token reward on the student's own samples y is r = log π_teacher(y) − log π_student(y), and
rollout engines' log-probs often stand in for the trainer's. With the trainer's p and the engine's q:

    mean_abs_reward_delta   mean |r_q − r_p| = mean |log p(y) − log q(y)|  (the teacher cancels per token)
    reward_corr             Pearson correlation of r_q with the mismatch-free r_p, over tokens
    seq_rkl_delta           mean over sequences of the change of Σ_t (log π_student − log π_teacher), the
                            sequence-level reverse KL estimate to the teacher, when q stands in for p
    ratio_out_verl          share of tokens whose π_train/π_rollout = p/q exceeds 2.0 (verl's default truncation)
    ratio_out_openrlhf      share outside [0.5, 5.0] (OpenRLHF's default importance-ratio range)

The teacher may have another architecture but must share the student's tokenizer.
"""

from __future__ import annotations

import torch

from ..core.errors import FP8ProbeError
from .engines import engine as get_engine
from .mismatch import CHUNK_ROWS, log_softmax32
from .perturbation import Perturbation
from .reference import Reference

OPD_COLUMNS = ["mean_abs_reward_delta", "reward_corr", "seq_rkl_delta", "ratio_out_verl", "ratio_out_openrlhf"]
VERL_TRUNCATION = 2.0
OPENRLHF_RANGE = (0.5, 5.0)


def check_teacher(student, teacher) -> None:
    if teacher.tokenizer.get_vocab() != student.tokenizer.get_vocab():
        raise FP8ProbeError(
            "the teacher's tokenizer differs from the student's; OPD rewards need a shared tokenizer: "
            "pass a teacher of the same tokenizer family"
        )


@torch.no_grad()
def token_logp(model, reference: Reference) -> torch.Tensor:
    """log π(y) of `model` (as it is now) on every response token of the reference's rollouts, in row order."""
    out = []
    for rec in reference.batches:
        logits = model(input_ids=rec["ids"], attention_mask=rec["am"], use_cache=False).logits
        rows = logits[rec["rows"], rec["cols"]]
        soft = getattr(model.config, "final_logit_softcapping", None)
        lp = torch.cat([log_softmax32(rows[s : s + CHUNK_ROWS], soft) for s in range(0, rows.shape[0], CHUNK_ROWS)])
        out.append(lp.gather(-1, rec["tokens"].to(lp.device)[:, None]).squeeze(-1).cpu())
    return torch.cat(out)


def sequence_index(reference: Reference) -> torch.Tensor:
    """The sequence each response token belongs to, in row order."""
    idx, start = [], 0
    for rec in reference.batches:
        idx.append(rec["rows"].cpu() + start)
        start += rec["ids"].shape[0]
    return torch.cat(idx)


class OPDSignal:
    """The teacher's log-probs on the reference rollouts (computed once), and each source's distortion."""

    def __init__(self, student, teacher, reference: Reference, engine: str = "sim"):
        check_teacher(student, teacher)
        self.student, self.reference, self.engine = student, reference, engine
        self.logp_teacher = token_logp(teacher.model, reference).double()
        self.logp_ref = reference.rows.token_logp.double()
        self.seq = sequence_index(reference)

    def measure(self, p: Perturbation) -> dict[str, float]:
        with get_engine(self.engine).candidate(self.student, p, self.reference.calibration) as m:
            logp_q = token_logp(m, self.reference).double()
        return distortion(self.logp_teacher, self.logp_ref, logp_q, self.seq)


def distortion(
    logp_teacher: torch.Tensor, logp_p: torch.Tensor, logp_q: torch.Tensor, seq: torch.Tensor
) -> dict[str, float]:
    """OPD_COLUMNS from per-token log-probabilities of the sampled tokens [M] (the teacher's, the trainer's p, the
    rollout engine's q) and the sequence each token belongs to [M] (0 .. N-1)."""
    logp_teacher, logp_p, logp_q = (torch.as_tensor(x, dtype=torch.float64) for x in (logp_teacher, logp_p, logp_q))
    seq = torch.as_tensor(seq, dtype=torch.int64)
    r_p, r_q = logp_teacher - logp_p, logp_teacher - logp_q
    n_seq = int(seq.max()) + 1 if seq.numel() else 0
    rkl = torch.zeros(n_seq, dtype=torch.float64).index_add_(0, seq, logp_q - logp_p)
    ratio = (logp_p - logp_q).exp()  # pi_train / pi_rollout
    corr = torch.corrcoef(torch.stack([r_p, r_q]))[0, 1] if r_p.numel() > 1 else torch.tensor(float("nan"))
    lo, hi = OPENRLHF_RANGE
    return {
        "mean_abs_reward_delta": float((r_q - r_p).abs().mean()),
        "reward_corr": float(corr),
        "seq_rkl_delta": float(rkl.mean()) if n_seq else float("nan"),
        "ratio_out_verl": float((ratio > VERL_TRUNCATION).double().mean()),
        "ratio_out_openrlhf": float(((ratio < lo) | (ratio > hi)).double().mean()),
    }
