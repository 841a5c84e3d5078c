"""The admission check: can we train with this rollout configuration? (`fp8probe check`: apps/check.py)

The configuration (the recipe's FP8 weights, the FP8 KV cache, stale weights: whichever are given, all at
once) is one perturbation, measured on the student's rollouts with the one measurement function, then
compared with the budget on the budget's metric (its excess over the zero point, metrics.excess), each with its
90 % interval (the measured value's: a bootstrap over the rollouts; the budget's: from its calibration): ADMIT
when the measured interval lies within the budget's, REJECT when above it, UNCERTAIN when they overlap, with the
number of prompts that would decide it (`verdict`). Beside the verdict: every metric, the prefix shift and, with
a teacher, the OPD-signal distortion. Minutes, not a training run: one reference pass, one candidate pass,
two continuations of the prompts and one pass on the candidate's own samples.

Each kind on its evidence (`judge`): stale weights go to the stale ruler where one was fitted and fits; a kind the
calibration ran as a level of its own (FP8 weights, the FP8 KV cache) is judged on that level's measured loss for a
configuration of that kind alone (at or below its dose and the level lost less than the tolerance: ADMIT; at or
above and it lost more: REJECT), and where that level "costs more than the ruler predicts" the noise ruler cannot
ADMIT a configuration holding it. A budget's end censored at its highest tested dose (the runs never lost the
tolerance there) cannot REJECT: the verdict is UNCERTAIN, and what would decide it is calibration at higher doses.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING

from ..core.artifacts import arithmetic
from ..core.metrics import excess
from ..core.records import CheckRecord
from ..core.stats import LEVEL, expansion
from ..sources.sources import Source
from .fit import Budget

if TYPE_CHECKING:  # light at import: the CLI reads CheckSettings (budget/settings.py) for --help
    from ..measurement.reference import Reference
    from ..model.settings import RolloutSettings
    from ..sources.verl_async import AsyncLags


def check(
    student,
    rollouts,
    config: Source,
    budget: Budget,
    *,
    engine: str = "sim",
    teacher=None,
    reference: Reference | None = None,
    sampling: RolloutSettings | None = None,
) -> CheckRecord:
    """The verdict and everything behind it, as check.json holds it; every figure computed as `engine` does
    ("sim": the configuration in the reference-dtype model, as the budget and the recipes were measured; an
    engines.py profile: the rollout engine's own arithmetic, e.g. "vllm-cuda"). `sampling`: the rollouts' settings,
    whose batch size the arithmetic runs in and whose response length and seed the prefix shift samples its
    continuations with (None: the rollouts' own response length, seed 0, batches of 8). The configuration's kinds of
    source (fp8, kv, stale) are what `judge` reads the budget's evidence for."""
    from ..measurement.measure import measure, measured_as
    from ..measurement.opd import OPDSignal
    from ..measurement.prefix import PrefixShift
    from ..measurement.reference import Reference

    batch_size = sampling.batch_size if sampling is not None else 8
    if reference is None:
        reference = Reference(student, rollouts, batch_size)
    got = measure(reference, student, rollouts, config.perturbation, engine, batch_size)
    measured = excess(budget.metric, got.metrics[budget.metric])
    interval = tuple(got.excess_interval(budget.metric))
    shift = PrefixShift.sampled_as(student, reference, rollouts, sampling, engine).measure(config.perturbation)
    opd = None
    if teacher is not None:
        opd = OPDSignal(student, teacher, reference, engine).measure(config.perturbation)
    v = judge(measured, interval, budget, got.num_prompts, config.perturbation.kinds())
    ruler = v["ruler"]
    also = measured_as(
        OTHER_ENGINE.get(engine, "sim"), reference, student, rollouts, config.perturbation, budget.metric, batch_size
    )
    return CheckRecord(
        verdict=v["verdict"],
        configuration=config.name,
        engine=engine,
        metric=budget.metric,
        measured=measured,
        measured_interval=list(interval),
        interval_level=LEVEL,
        budget=ruler.value,
        margin=ruler.value - measured,
        budget_calibrated=budget.calibrated,
        budget_source=ruler.source,
        budget_interval=ruler.interval,
        budget_censored=ruler.censored,
        budget_interval_censored=ruler.interval_censored,
        judged_on=v["judged_on"],
        kind_evidence=v["kind_evidence"],
        budget_student=budget.student,
        budget_objective=budget.objective,
        budget_response=budget.response,
        budget_tolerance=budget.tolerance,
        prompts_to_decide=v["prompts_to_decide"],
        undecided_because=v["undecided_because"],
        metrics=got.metrics,
        also_measured=also,
        prefix_shift=shift,
        opd_signal=opd,
        num_prompts=got.num_prompts,
        num_sequences=rollouts.num_sequences,
        num_response_tokens=rollouts.num_response_tokens,
        arithmetic=arithmetic(batch_size),
    )


def check_async(
    student,
    rollouts,
    name: str,
    budget: Budget,
    lags: AsyncLags,
    *,
    engine: str = "sim",
    teacher=None,
    sampling: RolloutSettings | None = None,
) -> CheckRecord:
    """The verdict on verl's fully-async rollouts (sources/verl_async.py): every lag either regime trains at measured
    on the same tokens, each regime's mixture the share-weighted sum (measurement.Mixture) with one interval over the
    prompts, the verdict on the trainer-bound mixture (the larger lags: the rollouter keeps its staleness allowance
    full), judged as stale weights are; the figures beside the verdict (the prefix shift, the other engine, the
    OPD signal) are the 90th-percentile lag's, and check.json's `verl_async` holds the lags, both regimes and every
    lag's own figure."""
    from dataclasses import replace

    from ..measurement.measure import Mixture, measure
    from ..measurement.reference import Reference
    from ..sources.verl_async import REGIMES

    batch_size = sampling.batch_size if sampling is not None else 8
    reference = Reference(student, rollouts, batch_size)
    metric = budget.metric
    at = {k: measure(reference, student, rollouts, lags.at(k), engine, batch_size) for k in lags.support()}
    regimes = {}
    for regime in REGIMES:
        mix = Mixture([(share, at[k]) for k, share in lags.spec.lags(regime).items()])
        summary = lags.spec.summary(regime)
        regimes[regime] = {
            **{k: summary[k] for k in ("mean", "p50", "p90", "max")},
            "lags": {str(k): w for k, w in summary["lags"].items()},
            "measured": excess(metric, mix.metrics[metric]),
            "interval": mix.excess_interval(metric),
            "metrics": mix.metrics,
        }
    judged = regimes[REGIMES[0]]
    p90 = judged["p90"]
    beside = Source(f"{name} at lag {p90}", "stale", lags.at(p90))
    report = check(
        student, rollouts, beside, budget, engine=engine, teacher=teacher, reference=reference, sampling=sampling
    )
    kinds = tuple(dict.fromkeys((*lags.base.kinds(), "stale")))
    v = judge(judged["measured"], tuple(judged["interval"]), budget, at[0].num_prompts, kinds)
    record = {
        "keys": lags.spec.describe(),
        "stale_steps": lags.steps,
        "path": lags.path(),
        "judged": REGIMES[0],
        "regimes": regimes,
        "lags": {
            str(k): {"measured": excess(metric, m.metrics[metric]), "interval": m.excess_interval(metric)}
            for k, m in at.items()
        },
        "beside_at_lag": p90,
    }
    if lags.spec.partial:
        record["straddle"] = _straddle(reference, student, rollouts, lags, metric)
    return replace(
        report,
        verdict=v["verdict"],
        configuration=name,
        measured=judged["measured"],
        measured_interval=list(judged["interval"]),
        budget=v["ruler"].value,
        margin=v["ruler"].value - judged["measured"],
        budget_source=v["ruler"].source,
        budget_interval=v["ruler"].interval,
        budget_censored=v["ruler"].censored,
        budget_interval_censored=v["ruler"].interval_censored,
        judged_on=v["judged_on"],
        kind_evidence=v["kind_evidence"],
        prompts_to_decide=v["prompts_to_decide"],
        undecided_because=v["undecided_because"],
        metrics=judged["metrics"],
        verl_async=record,
    )


def _straddle(reference, student, rollouts, lags: AsyncLags, metric: str) -> dict:
    """verl's partial rollouts: a response that straddles a sync, its prefix and KV cache a sync older than its
    suffix (measurement/straddle.py), at every trainer-bound lag of its suffix, their mixture by the lags' shares."""
    from ..measurement.measure import Mixture
    from ..measurement.straddle import measure_straddle
    from ..sources.verl_async import REGIMES

    t = lags.spec.trigger
    shares = lags.spec.lags(REGIMES[0])
    at = {k: measure_straddle(reference, student, rollouts, lags.at(k + t), lags.at(k)) for k in shares}
    mix = Mixture([(w, at[k]) for k, w in shares.items()])
    return {
        "measured": excess(metric, mix.metrics[metric]),
        "interval": mix.excess_interval(metric),
        "lags": {str(k): excess(metric, m.metrics[metric]) for k, m in at.items()},
        "how": f"the suffix at each {REGIMES[0]} lag, its prefix and the prefix's KV cache {t} steps older (a sync), "
        "split halfway through each response, in the simulation; the share of responses that straddle a sync "
        "(the rollouter's concurrency) is not folded into the verdict",
    }


def judge(
    measured: float, interval: tuple[float, float], budget: Budget, num_prompts: int, kinds: tuple[str, ...] = ()
) -> dict:
    """The verdict of a configuration holding `kinds` of source, each kind on its evidence (module docstring):
    verdict()'s fields and `ruler` (the Budget it was judged against), `judged_on` (in words), `kind_evidence` (the
    calibration levels read)."""
    ruler = budget.for_kind("stale") if "stale" in kinds else budget
    judged_on = "the stale ruler" if ruler is not budget else "the noise ruler"
    out = verdict(measured, interval, ruler, num_prompts)
    evidence = []
    for kind in dict.fromkeys(k for k in kinds if k in (budget.kinds or {})):
        for e in budget.kinds[kind]:
            evidence.append({**e, "kind": kind})
            lo_e, hi_e = e["loss_interval"] or (math.nan, math.nan)
            alone = len(set(kinds)) == 1
            if alone and interval[1] <= e["mismatch"] and hi_e <= budget.tolerance:
                out = {"verdict": "ADMIT", "prompts_to_decide": None, "undecided_because": None}
                judged_on = (
                    f"{kind}'s own calibration level {e['level']}: at or below its dose "
                    f"({e['mismatch']:.4g}) it lost {e['loss']:+.1%} [{lo_e:+.1%}, {hi_e:+.1%}], within the "
                    f"tolerance"
                )
            elif alone and interval[0] >= e["mismatch"] and lo_e > budget.tolerance:
                out = {"verdict": "REJECT", "prompts_to_decide": None, "undecided_because": None}
                judged_on = (
                    f"{kind}'s own calibration level {e['level']}: at or above its dose "
                    f"({e['mismatch']:.4g}) it lost {e['loss']:+.1%} [{lo_e:+.1%}, {hi_e:+.1%}], more than "
                    f"the tolerance"
                )
            elif e.get("reading") == "costs more than the ruler predicts" and out["verdict"] == "ADMIT":
                out = {
                    "verdict": "UNCERTAIN",
                    "prompts_to_decide": None,
                    "undecided_because": f"{kind} cost more than the noise ruler predicts at its calibration level "
                    f"{e['level']} (lost {e['loss']:+.1%} [{lo_e:+.1%}, {hi_e:+.1%}]): the "
                    f"noise ruler cannot admit it; a calibration level of {kind} at this "
                    "dose would decide it",
                }
                judged_on = f"the noise ruler, which cannot admit {kind}"
    return {**out, "ruler": ruler, "judged_on": judged_on, "kind_evidence": evidence}


# the second figure beside the verdict: the simulation's verdict shows the rollout engine's profile, and the other
# way round (budgets from `fp8probe calibrate` measure their mismatch in the simulation)
OTHER_ENGINE = {"sim": "vllm-cuda"}

POWER = 0.9  # prompts_to_decide: enough for the interval to clear the budget 9 times in 10 if the value stays put


def decide_factor(level: float = LEVEL, power: float = POWER) -> float:
    """How much more than the square-root law's count a decision needs: ((z_level + z_power) / z_level)^2 (3.17 at
    a 90 % interval and 90 % power). The square-root law alone (an interval that just touches the budget) would
    decide only half the time, since the estimate moves as much as its interval narrows."""
    z_level, z_power = NormalDist().inv_cdf((1 + level) / 2), NormalDist().inv_cdf(power)
    return ((z_level + z_power) / z_level) ** 2


def verdict(measured: float, interval: tuple[float, float], budget: Budget, num_prompts: int) -> dict:
    """ADMIT when the measured value's whole interval lies at or below the budget's (its interval's lower end, or the
    number itself when uncalibrated), REJECT when it lies wholly above (unless that end is censored: UNCERTAIN),
    UNCERTAIN otherwise. An UNCERTAIN verdict
    says what would decide it: when the measured value lies outside the budget's interval, about how many prompts
    (an interval narrows as 1/sqrt(n): n x (half-width / expansion(n) / distance to the budget)^2 x decide_factor());
    when it lies inside, more prompts cannot, only a narrower budget (more calibration runs)."""
    lo, hi = interval
    b_lo, b_hi = budget.interval if budget.interval else (budget.value, budget.value)
    b_lo, b_hi = min(b_lo, budget.value), max(b_hi, budget.value)
    out = {"verdict": "UNCERTAIN", "prompts_to_decide": None, "undecided_because": None}
    if hi <= b_lo:
        out["verdict"] = "ADMIT"
    elif lo > b_hi and (budget.censored or budget.interval_censored):
        out["undecided_because"] = (
            f"the budget's upper end is censored at its highest tested dose ({b_hi:.4g}): "
            "its runs never lost the tolerance there, so nothing above it can be rejected; "
            "calibration at higher doses, not more prompts, would decide it"
        )
    elif lo > b_hi:
        out["verdict"] = "REJECT"
    elif b_lo <= measured <= b_hi:
        out["undecided_because"] = (
            "the measured value lies inside the budget's own interval: more calibration runs "
            "(seeds), not more prompts, would decide it"
        )
    else:
        edge, half = (b_lo, hi - measured) if measured < b_lo else (b_hi, measured - lo)
        half /= expansion(num_prompts)  # the small-sample widening fades as prompts are added
        n = num_prompts * (half / abs(measured - edge)) ** 2 * decide_factor()
        out["prompts_to_decide"] = max(math.ceil(n - 1e-9), num_prompts + 1)
        out["undecided_because"] = (
            f"the measured value's {LEVEL:.0%} interval straddles the budget: about "
            f"{out['prompts_to_decide']} prompts (now {num_prompts}) would decide it"
        )
    return out
