"""What the verdicts are asked for: `fp8probe budget` (BudgetSettings: how a budget is read off a runs table) and
`fp8probe check` (CheckSettings: one rollout configuration against a budget). Light: the CLI reads both for its
flags."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field

from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS
from ..core.settings import Settings, opt
from ..core.verl_lags import HELP as VERL_ASYNC_HELP
from ..core.verl_lags import parse_verl_async
from ..sources.shortcuts import Shortcuts
from .design import PAIRINGS, RESPONSES

DEFAULT_TOLERANCE = 0.02  # the relative quality loss a budget allows unless told otherwise (a user's choice)
FITS = ("dose", "isotonic")  # how the budget is read off the runs: the benchmark dose, or the isotonic fit alone


@dataclass(frozen=True)
class BudgetSettings(Settings):
    """How a budget is read off a runs table: the quality loss accepted (on the response), the bootstrap behind its
    interval, which objective's runs (a table with several), and the student they trained."""

    tolerance: float = opt(DEFAULT_TOLERANCE, "largest quality loss accepted, on the response (your choice)", low=0.0)
    response: str = opt(
        "gain",
        "a run's quality loss against its mismatch-free twin: gain (the share of what "
        "training gained that the mismatch cost; needs a quality_start column) or relative",
        choices=RESPONSES,
    )
    pairing: str = opt(
        "auto",
        "the baseline of a paired table: each seed's own twin (seed), the twins' mean (mean), "
        "or whichever the variance components say is steadier (auto)",
        choices=("auto", *PAIRINGS),
    )
    bootstrap: int = opt(1000, "bootstrap resamples for the interval", low=0)
    seed: int = opt(0, "seed of the resamples", low=0)
    objective: str | None = opt(None, "the objective whose runs to fit (a table with several: opd, grpo, grpo-is)")
    fit: str = opt(
        "dose",
        "dose: the benchmark dose of fitted dose–response curves (the isotonic fit where none "
        "fits); isotonic: the largest tested level whose isotonic fit stays within the tolerance",
        choices=FITS,
    )
    student: str | None = opt(
        None,
        "the student the runs trained (a model as every command takes it): recorded by "
        "its content hash, so `check` refuses to judge another student against this budget",
    )


@dataclass(frozen=True)
class CheckSettings(Settings):
    """One rollout configuration (`shortcuts`: at most one recipe, KV cache and stale checkpoint, together) against
    `budget`: a number on `metric`, or a budget.json written by `fp8probe budget` / `calibrate`."""

    shortcuts: Shortcuts
    budget: str = opt(MISSING, "a number (on the metric) or a budget.json from `fp8probe budget`", required=True)
    metric: str = opt("kl_q_p", "the metric a numeric budget bounds", choices=METRICS, metavar="METRIC")
    checkpoints: tuple[str, ...] = opt(
        (),
        "instead of MODEL: checkpoints of the student along training; the "
        "configuration at each, on rollouts re-sampled from it (series.json)",
        metavar="CKPT",
    )
    other_student: bool = opt(
        False,
        "judge this student (or teacher) against a budget calibrated on another one (refused otherwise; the verdict "
        "says so)",
    )
    descends_from: str | None = opt(
        None,
        "the student MODEL (or the checkpoints) was trained from: the budget's own student, so a later checkpoint "
        "of its run is judged as its own (recorded in check.json)",
    )
    objective: str | None = opt(
        None,
        "the objective you train with (calibrate's names: opd, opd-k3, opd-topk:K, opd-pg, grpo, ...): the "
        "verdict says when the budget was calibrated under another",
    )
    verl_async: str | None = opt(None, VERL_ASYNC_HELP + "; needs `stale` and `stale_steps`", metavar="KEYS")
    stale_steps: int | None = opt(
        None,
        "how many optimizer (trainer) steps older than MODEL the `stale` checkpoint is: the lag, which a budget's "
        "stale:K level of the same lag judges",
        low=1,
    )
    other_scale: bool = opt(
        False,
        "judge rollouts of another kind, length or sampling than the budget's doses were measured on (refused "
        "otherwise; the verdict says so)",
    )
    verl: object = field(default=None, init=False, repr=False)  # verl_async parsed (core/verl_lags.py)

    def __post_init__(self):
        super().__post_init__()
        sc = self.shortcuts
        if not (sc.recipe or sc.fp8 or sc.kv_cache_dtype or sc.stale):
            raise FP8ProbeError(
                "nothing to check: give `recipe` or `fp8`, `kv_cache_dtype` and/or `stale` (the rollout configuration)"
            )
        if self.verl_async is not None:
            object.__setattr__(self, "verl", parse_verl_async(self.verl_async))
            if not sc.stale or self.stale_steps is None:
                raise FP8ProbeError(
                    "`verl_async` measures every lag from two states of the student: give `stale` (an older "
                    "checkpoint) and `stale_steps` (how many trainer steps older than MODEL it is)"
                )
        if self.stale_steps is not None and not sc.stale:
            raise FP8ProbeError("`stale_steps` is the age of a `stale` checkpoint: give `stale` too")
        if len(self.checkpoints) == 1:
            raise FP8ProbeError("`checkpoints` takes a series: give at least two (or MODEL for one)")
        if self.checkpoints and sc.stale:
            raise FP8ProbeError("`checkpoints` and `stale` both name checkpoints: check stale weights one at a time")
        if len(sc.recipe) + bool(sc.fp8) > 1 or len(sc.kv_cache_dtype) > 1 or len(sc.stale) > 1:
            raise FP8ProbeError(
                "check takes one configuration: at most one `recipe` or `fp8`, one `kv_cache_dtype` and one `stale` "
                "(compare several with `fp8probe ladder`)"
            )
