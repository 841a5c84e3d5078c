"""What verl's rollout-correction screens will do to a configuration's batches, predicted on its own samples.

verl screens the rollout engine's tokens by their log-ratio r = log p - log q (the trainer's recomputed log-prob p of a
sampled token against the engine's own q: `old_log_probs - rollout_log_probs`), verl 0.9.1
verl/trainer/ppo/rollout_corr_helper.py:

    rollout_rs   a rejection mask: per token (token_k1|k2|k3) or per sequence (seq_sum_*, seq_mean_*, seq_max_*) of
                 the estimators k1 = -r, k2 = r²/2, k3 = exp(r) - 1 - r (r clamped to ±20), a token or sequence whose
                 statistic exceeds the threshold masked (k1: outside [lower, upper] on the log scale, a bare upper
                 u meaning [1/u, u]); comma-separated options must all pass. verl logs rollout_rs_masked_fraction
                 (tokens) and rollout_rs_seq_masked_fraction (sequences with any masked token)
    rollout_is   importance weights exp(r) per token (or exp(Σ r) per sequence), truncated at an upper threshold
                 (TIS) or zeroed outside "lower_upper" (IcePop); verl logs rollout_is_mean, _max,
                 _ratio_fraction_high / _low (raw weights above the upper / below the lower bound, 1/upper by
                 default), _eff_sample_size and _seq_fraction_high

`outcome` computes these on the candidate's own samples (the prefix shift's continuations: what the engine would
sample), the masked shares with a 90 % interval over the prompts (a bootstrap, the Student-t widening of
core/stats), and for a rejection screen the threshold at which it would keep a chosen share of sequences. The
arithmetic is this module's own; tests/measurement/test_screens.py checks it by hand and against verl's functions
lifted from the released wheel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SAFETY_BOUND = 20.0  # verl's clamp of log-ratios before exp
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
IS_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class Screen:
    """One configuration of verl's screens, as `algorithm.rollout_correction.*` writes it (None: that part off)."""

    rollout_rs: str | None = None
    rollout_rs_threshold: str | float | None = None
    rollout_is: str | None = None
    rollout_is_threshold: str | float = 2.0

    @property
    def name(self) -> str:
        parts = []
        if self.rollout_rs:
            parts.append(f"rollout_rs {self.rollout_rs} <= {self.rollout_rs_threshold}")
        if self.rollout_is:
            parts.append(f"rollout_is {self.rollout_is} at {self.rollout_is_threshold}")
        return ", ".join(parts) or "no screen"


# the screens fp8probe's verl exports write (deploy/frameworks/verl.py): verl's K3 rejection preset
# (verl/trainer/config/algorithm.py bypass_ppo_clip_k3_rs) and token-level TIS at 2.0
K3_REJECTION = Screen(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01)
TOKEN_TIS = Screen(rollout_is="token", rollout_is_threshold=2.0)
SCREENS = (K3_REJECTION, TOKEN_TIS)


def _k(log_ratio: np.ndarray) -> dict[str, np.ndarray]:
    r = np.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -r, "k2": 0.5 * r**2, "k3": np.exp(r) - 1.0 - r}


def _bounds(option: str, spec) -> tuple[float | None, float]:
    """(lower, upper) of one rs option's threshold as verl parses it (k1: on the log scale, a bare u as [1/u, u])."""
    spec = str(spec)
    if option.endswith("k1"):
        lo, _, hi = spec.partition("_") if "_" in spec else (str(1.0 / float(spec)), "", spec)
        return math.log(float(lo)), math.log(float(hi))
    return None, float(spec)


def keep_masks(screen: Screen, log_ratio: np.ndarray, seq: np.ndarray, n_seq: int) -> np.ndarray:
    """[tokens] bool: which tokens verl's rejection screen keeps (every option must pass)."""
    keep = np.ones(len(log_ratio), dtype=bool)
    if not screen.rollout_rs:
        return keep
    options = list(dict.fromkeys(o.strip() for o in screen.rollout_rs.split(",") if o.strip()))
    specs = str(screen.rollout_rs_threshold).split(",")
    specs = specs * len(options) if len(specs) == 1 else specs
    ks = _k(log_ratio)
    for option, spec in zip(options, specs):
        if option not in RS_OPTIONS:
            raise ValueError(f"rollout_rs {option}: verl takes one of {', '.join(RS_OPTIONS)}")
        lo, hi = _bounds(option, spec.strip())
        stat = ks[option[-2:]]
        if option.startswith("seq_"):
            agg = option.split("_")[1]
            stat = per_sequence(stat, seq, n_seq, agg)[seq]
        ok = stat <= hi if lo is None else (stat >= lo) & (stat <= hi)
        keep &= ok
    return keep


def per_sequence(values: np.ndarray, seq: np.ndarray, n_seq: int, how: str) -> np.ndarray:
    """[n_seq] sum, mean or max of per-token values over each sequence's tokens."""
    if how == "max":
        out = np.full(n_seq, -np.inf)
        np.maximum.at(out, seq, values)
        return np.where(np.isfinite(out), out, 0.0)
    total = np.bincount(seq, weights=values, minlength=n_seq)
    if how == "sum":
        return total
    return total / np.maximum(np.bincount(seq, minlength=n_seq), 1)


def is_metrics(screen: Screen, log_ratio: np.ndarray, seq: np.ndarray, n_seq: int) -> dict[str, float]:
    """verl's rollout_is_* metrics of these tokens (compute_rollout_correction_weights, compute_is_metrics)."""
    spec = str(screen.rollout_is_threshold)
    if "_" in spec:
        lower, upper = (float(x) for x in spec.split("_", 1))
    else:
        lower, upper = None, float(spec)
    if screen.rollout_is == "token":
        raw = np.exp(np.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        total = per_sequence(log_ratio, seq, n_seq, "sum")
        raw = np.exp(np.clip(total, -SAFETY_BOUND, SAFETY_BOUND))[seq]
    weights = raw.clip(max=upper) if lower is None else np.where((raw >= lower) & (raw <= upper), raw, 0.0)
    low = 1.0 / upper if lower is None else lower
    clamped = weights.clip(0.0, upper)
    ess = 1.0 / float(np.mean((clamped / (clamped.mean() + 1e-8)) ** 2))
    seq_raw = per_sequence(raw, seq, n_seq, "mean")
    if screen.rollout_is == "token":
        top, high, below = float(weights.max()), float(np.mean(raw > upper)), float(np.mean(raw < low))
    else:  # per sequence: the unclamped log-sum's extremes and each sequence counted once
        top = math.exp(min(float(total.max()), SAFETY_BOUND))
        high, below = float(np.mean(total > math.log(upper))), float(np.mean(total < math.log(low)))
    return {
        "rollout_is_mean": float(weights.mean()),
        "rollout_is_max": top,
        "rollout_is_ratio_fraction_high": high,
        "rollout_is_ratio_fraction_low": below,
        "rollout_is_eff_sample_size": ess,
        "rollout_is_seq_fraction_high": float(np.mean(seq_raw > upper)),
    }


def rs_metrics(screen: Screen, log_ratio: np.ndarray, seq: np.ndarray, n_seq: int) -> dict[str, float]:
    """verl's rollout_rs_masked_fraction (tokens) and rollout_rs_seq_masked_fraction (sequences with a masked
    token)."""
    keep = keep_masks(screen, log_ratio, seq, n_seq)
    masked_seq = np.bincount(seq, weights=(~keep).astype(float), minlength=n_seq) > 0
    return {
        "rollout_rs_masked_fraction": float(np.mean(~keep)),
        "rollout_rs_seq_masked_fraction": float(np.mean(masked_seq)),
    }


def keep_threshold(screen: Screen, log_ratio: np.ndarray, seq: np.ndarray, n_seq: int, keep: float) -> float | None:
    """The threshold at which a one-option sequence-level rejection screen (seq_sum|mean|max of k2 or k3) keeps
    `keep` of the sequences: the `keep` quantile of its per-sequence statistic (None for other screens)."""
    option = (screen.rollout_rs or "").strip()
    if "," in option or not option.startswith("seq_") or option.endswith("k1"):
        return None
    stat = per_sequence(_k(log_ratio)[option[-2:]], seq, n_seq, option.split("_")[1])
    return float(np.quantile(stat, keep))


def outcome(screen: Screen, logp_rollout, logp_train, lengths, groups=None, keep: float = 0.9, draws: int = 1000):
    """What `screen` does on these samples (module docstring): verl's metrics, the masked shares' 90 % interval over
    the prompts (`groups`: each sequence's prompt; None: each its own), and the rejection threshold that would keep
    `keep` of the sequences."""
    from ..core.stats import LEVEL, expansion

    q = np.asarray(logp_rollout, dtype=float)
    p = np.asarray(logp_train, dtype=float)
    n = np.asarray(lengths, dtype=int)
    seq = np.repeat(np.arange(len(n)), n)
    log_ratio = p - q
    out = {"screen": screen.name}
    if screen.rollout_rs:
        out.update(rs_metrics(screen, log_ratio, seq, len(n)))
        out["keep"] = keep
        out["threshold_to_keep"] = keep_threshold(screen, log_ratio, seq, len(n), keep)
        option = screen.rollout_rs.strip()
        if out["threshold_to_keep"] is not None:  # each sequence's statistic: any other share's threshold
            stat = per_sequence(_k(log_ratio)[option[-2:]], seq, len(n), option.split("_")[1])
            out["per_sequence"] = [float(x) for x in stat]
        groups = np.arange(len(n)) if groups is None else np.asarray(groups)
        labels = np.unique(groups)
        rng = np.random.default_rng(0)
        shares = []
        for _ in range(draws):
            pick = rng.choice(labels, len(labels))
            seqs = np.concatenate([np.flatnonzero(groups == g) for g in pick])
            starts = np.concatenate([[0], np.cumsum(n)[:-1]])
            tok = np.concatenate([np.arange(starts[s], starts[s] + n[s]) for s in seqs])
            new_seq = np.repeat(np.arange(len(seqs)), n[seqs])
            shares.append(rs_metrics(screen, log_ratio[tok], new_seq, len(seqs))["rollout_rs_seq_masked_fraction"])
        m, e = out["rollout_rs_seq_masked_fraction"], expansion(len(labels), LEVEL)
        lo, hi = np.quantile(shares, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
        out["seq_masked_interval"] = [max(0.0, m - e * (m - lo)), min(1.0, m + e * (hi - m))]
    if screen.rollout_is:
        out.update(is_metrics(screen, log_ratio, seq, len(n)))
    return out
