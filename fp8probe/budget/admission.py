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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..core.artifacts import arithmetic
from ..core.metrics import excess
from ..core.records import CheckRecord
from ..core.stats import LEVEL, decide_factor, expansion
from ..sources.config import STALE_UNKNOWN, RolloutConfig
from ..sources.sources import Source
from .evidence import Verdict
from .fit import Budget

if TYPE_CHECKING:  # light at import: the CLI reads CheckSettings (budget/settings.py) for --help
    from ..measurement.bench import Bench
    from ..sources.verl_async import AsyncLags


def check(bench: Bench, config: Source, budget: Budget, *, engine: str = "sim", teacher=None) -> CheckRecord:
    """The verdict and everything behind it, as check.json holds it, measured on the bench (measurement/bench.py:
    the student, its rollouts, the batch size the arithmetic runs in, the seed and response length the prefix shift
    samples its continuations with). The verdict's figure is measured on the budget's scale: a calibrated budget's
    doses are the simulation's ("sim": the configuration in the reference-dtype model), so a check asked for another
    engine (an engines.py profile: the rollout engine's own arithmetic, e.g. "vllm-cuda") is judged on the
    simulation's figure of the same configuration, the engine's beside it (`also_measured`, `converted`); a number
    given as the budget is judged on `engine`'s. The prefix shift and the OPD signal are `engine`'s. The
    configuration (config.config) is what `judge` reads the budget's levels for."""
    from ..measurement.measure import measure, measured_as
    from ..measurement.opd import OPDSignal
    from ..measurement.prefix import PrefixShift

    judged_engine = budget.scale["engine"] if budget.scale else engine
    got = measure(bench, config.perturbation, engine=judged_engine)
    measured = excess(budget.metric, got.metrics[budget.metric])
    interval = tuple(got.excess_interval(budget.metric))
    prefix = PrefixShift.sampled_as(bench, engine)
    shift = prefix.measure(config.perturbation)
    opd = None
    if teacher is not None:
        opd = OPDSignal(bench.student, teacher, bench.reference(), engine).measure(config.perturbation)
    v = judge(measured, interval, budget, got.num_prompts, config.config)
    beside = engine if engine != judged_engine else OTHER_ENGINE.get(engine, "sim")
    also = measured_as(bench, config.perturbation, beside, budget.metric)
    record = _record(v, config, budget, (engine, judged_engine), (measured, interval, got, bench), (also, shift, opd))
    return replace(record, verl_screens=verl_screens(getattr(prefix, "own", None)))


def verl_screens(own) -> list | None:
    """What verl's screens the exports write (screens.SCREENS) would do to the configuration's own samples."""
    from ..measurement.screens import SCREENS, outcome

    if own is None or not int(own[2].sum()):
        return None
    return [outcome(s, own[0].numpy(), own[1].numpy(), own[2].numpy(), own[3].numpy()) for s in SCREENS]


def _record(v: Judgement, config, budget, engines, figure, beside) -> CheckRecord:
    """check.json's record of a verdict `v` on `config`, measured (`figure`: the value, its interval, the Measured,
    the bench) on `engines` (asked, judged on), with the figures `beside` it (the other engine's, the prefix shift,
    the OPD signal)."""
    ruler = v.ruler
    (engine, judged_engine), (measured, interval, got, bench), (also, shift, opd) = engines, figure, beside
    return CheckRecord(
        verdict=v.verdict,
        configuration=config.name,
        config=config.config.name,
        engine=engine,
        judged_engine=judged_engine,
        metric=budget.metric,
        measured=measured,
        measured_interval=list(interval),
        interval_level=LEVEL,
        budget=ruler.value,
        margin=v.margin,
        decided_by=v.decided_by(),
        budget_calibrated=budget.calibrated,
        budget_source=ruler.source,
        budget_interval=ruler.interval,
        budget_censored=ruler.censored,
        budget_interval_censored=ruler.interval_censored,
        judged_on=v.judged_on,
        kind_evidence=v.evidence,
        budget_student=budget.student,
        budget_objective=budget.objective,
        budget_response=budget.response,
        budget_tolerance=budget.tolerance,
        prompts_to_decide=v.prompts_to_decide,
        undecided_because=v.undecided_because,
        metrics=got.metrics,
        also_measured=also,
        prefix_shift=shift,
        opd_signal=opd,
        num_prompts=got.num_prompts,
        num_sequences=bench.rollouts.num_sequences,
        num_response_tokens=bench.rollouts.num_response_tokens,
        arithmetic=arithmetic(bench.batch_size),
    )


def check_async(
    bench: Bench, name: str, budget: Budget, lags: AsyncLags, *, engine: str = "sim", teacher=None
) -> CheckRecord:
    """The verdict on verl's fully-async rollouts (core/verl_lags.py): every lag either regime trains at measured
    on the same tokens (on the budget's scale, as check() measures), each regime's mixture the share-weighted sum
    (measurement.Mixture) with one interval over the prompts, the verdict on the trainer-bound mixture (the larger
    lags: the rollouter keeps its staleness allowance full), judged as stale weights are; the figures beside the
    verdict (the prefix shift, the other engine, the OPD signal) are the 90th-percentile lag's, and check.json's
    `verl_async` holds the lags, both regimes and every lag's own figure."""
    from dataclasses import replace

    from ..measurement.measure import Mixture, measure
    from ..sources.sources import merge

    metric = budget.metric
    judged_engine = budget.scale["engine"] if budget.scale else engine
    at = {k: measure(bench, lags.at(k), engine=judged_engine) for k in lags.support()}
    regimes = {}
    for regime in lags.spec.regimes:
        mix = Mixture([(share, at[k]) for k, share in lags.spec.lags(regime).items()])
        summary = lags.spec.summary(regime)
        regimes[regime] = {
            **{k: summary[k] for k in ("mean", "p50", "p90", "max")},
            "lags": {str(k): w for k, w in summary["lags"].items()},
            "measured": excess(metric, mix.metrics[metric]),
            "interval": mix.excess_interval(metric),
            "metrics": mix.metrics,
        }
    judged = regimes[lags.spec.regimes[0]]
    p90 = judged["p90"]
    beside = Source(f"{name} at lag {p90}", "stale", lags.at(p90), config=RolloutConfig(stale=p90 or None))
    report = check(bench, beside, budget, engine=engine, teacher=teacher)
    mixture = merge(
        [lags.config or RolloutConfig(), RolloutConfig(stale=STALE_UNKNOWN)]
    )  # a mixture of lags: no one level's lag
    v = judge(judged["measured"], tuple(judged["interval"]), budget, at[0].num_prompts, mixture)
    record = {
        "keys": lags.spec.describe(),
        "stale_steps": lags.steps,
        "path": lags.path(),
        "judged": lags.spec.regimes[0],
        "dropped": lags.spec.dropped,  # the share of finished groups verl drops as too stale (None: not modelled)
        "regimes": regimes,
        "lags": {
            str(k): {"measured": excess(metric, m.metrics[metric]), "interval": m.excess_interval(metric)}
            for k, m in at.items()
        },
        "beside_at_lag": p90,
    }
    if lags.spec.partial:  # the simulation's figures: the lags measured above serve where the verdict's engine is it

        def plain(k):
            return measure(bench, lags.at(k))

        known = at if judged_engine == "sim" else {}
        record["straddle"] = _straddle(bench.rollouts, lags, metric, known, plain)
    return replace(
        report,
        verdict=v.verdict,
        configuration=name,
        config=mixture.name,
        measured=judged["measured"],
        measured_interval=list(judged["interval"]),
        budget=v.ruler.value,
        margin=v.margin,
        decided_by=v.decided_by(),
        budget_source=v.ruler.source,
        budget_interval=v.ruler.interval,
        budget_censored=v.ruler.censored,
        budget_interval_censored=v.ruler.interval_censored,
        judged_on=v.judged_on,
        kind_evidence=v.evidence,
        prompts_to_decide=v.prompts_to_decide,
        undecided_because=v.undecided_because,
        metrics=judged["metrics"],
        verl_async=record,
    )


def _straddle(rollouts, lags: AsyncLags, metric: str, known: dict, plain) -> dict:
    """verl's resumed responses: one that straddles a sync, its earlier tokens sampled a sync older than its later
    ones (measurement/straddle.py), at every trainer-bound lag of its suffix, their mixture by the lags' shares.
    `known`: lag -> its simulated Measured where already made; `plain(lag)` measures one in the simulation."""
    from ..core.verl_lags import REGIMES
    from ..measurement.measure import Mixture
    from ..measurement.straddle import straddled

    t = lags.spec.trigger
    shares = lags.spec.lags(REGIMES[0])
    sim = dict(known)
    for k in sorted({k2 for k in shares for k2 in (k, k + t)} - set(sim)):
        sim[k] = plain(k)
    at = {k: straddled(rollouts, sim[k + t], sim[k]) for k in shares}
    mix = Mixture([(w, at[k]) for k, w in shares.items()])
    return {
        "measured": excess(metric, mix.metrics[metric]),
        "interval": mix.excess_interval(metric),
        "lags": {str(k): excess(metric, m.metrics[metric]) for k, m in at.items()},
        "how": f"the later tokens at each {REGIMES[0]} lag, the earlier ones {t} steps older (a sync; verl re-prefills "
        "a resumed response with the new weights), split halfway through each response, in the simulation; the "
        "share of responses that straddle a sync (the rollouter's concurrency) is not folded into the verdict",
    }


@dataclass(frozen=True)
class Judgement:
    """A verdict and what decided it: `rule` ("level": the configuration is a calibration level and its own loss
    decides; "levels": levels of its kind at known doses decide; "ruler": a dose–response curve decides), the number
    the rule compared with (`threshold`, named) and the distance to it (`margin`: positive on the admitting side),
    what would decide an UNCERTAIN one, and the levels read."""

    verdict: Verdict
    ruler: Budget
    rule: str
    judged_on: str
    threshold: float | None
    threshold_name: str | None
    margin: float | None
    prompts_to_decide: int | None
    seeds_to_decide: dict | None
    undecided_because: str | None
    evidence: list

    def decided_by(self) -> dict:
        return {
            "rule": self.rule,
            "threshold": self.threshold,
            "threshold_name": self.threshold_name,
            "seeds_to_decide": self.seeds_to_decide,
        }


def judge(
    measured: float,
    interval: tuple[float, float],
    budget: Budget,
    num_prompts: int,
    config: RolloutConfig | tuple = RolloutConfig(),
) -> Judgement:
    """The verdict of `config` measured at `measured` [interval] on the budget's scale, each kind on its evidence:

    1. the configuration is a calibration level (equal RolloutConfigs): that level's own loss decides: ADMIT where its
       interval's upper end is within the tolerance, REJECT where its lower end is above it, else UNCERTAIN (with the
       seeds at that level that would decide it);
    2. one kind with levels of its own: REJECT where the measured interval lies at or above the dose of a level of
       its kind that lost more than the tolerance (its lower end), ADMIT where it lies at or below the dose of one
       that lost no more (its upper end); otherwise the kind's own curve where one was fitted and fits (the noise
       ruler for noise, the stale ruler for stale weights), else UNCERTAIN, saying what would decide it: the noise
       ruler never admits a kind whose own levels the calibration ran;
    3. a combination holding a part that is a calibration level whose own loss lies above the tolerance: REJECT (a
       second mismatch source on top is taken not to lower the loss); otherwise a combination, or a kind without
       levels, goes to the ruler (the stale ruler when stale weights are part of it), which cannot ADMIT it while a
       kind in it with levels of its own has none at or above its dose within the tolerance.

    `config` may be a tuple of kinds (a configuration of unknown identity: rules 2 and 3 only)."""
    if not isinstance(config, RolloutConfig):
        kinds, config = tuple(dict.fromkeys(config)), None
    else:
        kinds = config.kinds()
    from .evidence import levels_of

    levels = levels_of(budget) if budget.calibrated and budget.tolerance is not None else []
    tol = budget.tolerance
    ruler = budget.for_kind("stale") if "stale" in kinds else budget
    mine = [lv for lv in levels if lv.kind in kinds or (not kinds and lv.kind == "none")]
    evidence = [lv.to_json() for lv in mine]
    same = next((lv for lv in levels if config is not None and lv.config == config), None)
    if same is not None:
        return _by_level(same, tol, ruler, evidence)
    own = [lv for lv in mine if lv.kind != "none"]
    if len(kinds) == 1 and own:
        decided = _by_levels(kinds[0], own, interval, tol, ruler, evidence)
        if decided is not None:
            return decided
        if kinds[0] == "noise" or (kinds[0] == "stale" and ruler is not budget):
            return _by_ruler(measured, interval, ruler, num_prompts, evidence, f"the {kinds[0]} ruler")
        return _undecided_kind(kinds[0], own, measured, interval, tol, ruler, num_prompts, evidence)
    if config is not None and len(kinds) > 1:
        held = _rejected_part(config, levels, tol)
        if held is not None:  # a combination holding a configuration its own level rejects
            return Judgement(
                Verdict.REJECT,
                ruler,
                "level",
                f"the part {held.name} it holds, whose own calibration level lost {held.loss_text()} (tolerance "
                f"{tol:.1%}; another mismatch source on top is taken not to lower the loss)",
                None,
                None,
                None,
                None,
                None,
                None,
                evidence,
            )
    out = _by_ruler(
        measured,
        interval,
        ruler,
        num_prompts,
        evidence,
        "the stale ruler" if ruler is not budget else "the noise ruler",
    )
    if out.verdict != Verdict.ADMIT:
        return out
    for kind in kinds:
        of_kind = [lv for lv in levels if lv.kind == kind]
        if of_kind and not any(lv.admits(tol) and interval[1] <= lv.dose for lv in of_kind):
            top = max(of_kind, key=lambda lv: lv.dose)
            return replace(
                out,
                verdict=Verdict.UNCERTAIN,
                judged_on=f"{out.judged_on}, which cannot admit {kind}",
                undecided_because=f"{kind} was run as a calibration level of its own and no level of it at or above "
                f"this dose lost within the tolerance ({top.name} at {top.dose:.4g} lost {top.loss_text()}): the "
                f"ruler cannot admit it; a calibration level of this configuration would decide it",
            )
    return out


def _rejected_part(config: RolloutConfig, levels: list, tol: float):
    """The level, if any, that is one part of a combination on its own (its FP8 weights, its KV cache, its lag, its
    noise) and whose own loss lies above the tolerance."""
    parts = {
        "fp8": RolloutConfig(fp8=config.fp8, fp8_units=config.fp8_units),
        "kv": RolloutConfig(kv=config.kv, kv_scale=config.kv_scale),
        "stale": RolloutConfig(stale=config.stale),
        "noise": RolloutConfig(noise=config.noise),
    }
    for kind in config.kinds():
        hit = next((lv for lv in levels if lv.config == parts[kind] and lv.rejects(tol)), None)
        if hit is not None:
            return hit
    return None


def _by_level(level, tol: float, ruler: Budget, evidence: list) -> Judgement:
    """Rule 1: the configuration is the calibration level `level`; its own loss decides."""
    words = f"its own calibration level {level.name}, which lost {level.loss_text()} (tolerance {tol:.1%})"
    verdict = Verdict.ADMIT if level.admits(tol) else Verdict.REJECT if level.rejects(tol) else Verdict.UNCERTAIN
    seeds = None if verdict != Verdict.UNCERTAIN else level.seeds_to_decide(tol)
    because = None
    if verdict == Verdict.UNCERTAIN:
        because = (
            f"it is the calibration level {level.name}, whose own loss {level.loss_text()} straddles the "
            f"tolerance ({tol:.1%}): "
            + (f"about {seeds} seeds at that level (now {level.seeds}) would decide it" if seeds else "more seeds")
        )
    return Judgement(
        verdict,
        ruler,
        "level",
        words,
        None,
        None,
        None,
        None,
        {"level": level.name, "seeds": seeds, "now": level.seeds} if seeds else None,
        because,
        evidence,
    )


def _by_levels(kind: str, own: list, interval, tol: float, ruler: Budget, evidence: list) -> Judgement | None:
    """Rule 2's level tests: REJECT at or above a level of the kind that lost too much, ADMIT at or below one that
    lost no more than the tolerance; both at once (levels out of order): UNCERTAIN; neither: None."""
    lo, hi = interval
    above = [lv for lv in own if lv.rejects(tol) and lo >= lv.dose]
    below = [lv for lv in own if lv.admits(tol) and hi <= lv.dose]
    if above and below:
        a, b = max(above, key=lambda lv: lv.dose), min(below, key=lambda lv: lv.dose)
        return Judgement(
            Verdict.UNCERTAIN,
            ruler,
            "levels",
            f"{kind}'s own calibration levels, which disagree here",
            None,
            None,
            None,
            None,
            None,
            f"{kind}'s levels disagree: {a.name} at {a.dose:.4g} lost {a.loss_text()}, {b.name} at the higher "
            f"{b.dose:.4g} lost {b.loss_text()}; more seeds at both would decide it",
            evidence,
        )
    if above:  # the highest rejecting level the measured interval reaches; margin: its dose - the interval's lower end
        return _on_level(Verdict.REJECT, "above", kind, max(above, key=lambda lv: lv.dose), lo, ruler, evidence)
    if below:  # the lowest admitting level the interval stays under; margin: its dose - the interval's upper end
        return _on_level(Verdict.ADMIT, "below", kind, min(below, key=lambda lv: lv.dose), hi, ruler, evidence)
    return None


def _on_level(verdict: str, side: str, kind: str, lv, end: float, ruler: Budget, evidence: list) -> Judgement:
    words = f"{kind}'s own calibration level {lv.name}: at or {side} its dose ({lv.dose:.4g}) it lost {lv.loss_text()}"
    return Judgement(
        verdict, ruler, "levels", words, lv.dose, f"{lv.name}'s dose", lv.dose - end, None, None, None, evidence
    )


def _undecided_kind(kind: str, own: list, measured: float, interval, tol: float, ruler, n: int, evidence) -> Judgement:
    """Rule 2 when the kind's levels do not decide and it has no curve of its own: UNCERTAIN, and what would decide
    it: more prompts where a deciding level's dose lies inside the measured interval, more seeds at the nearest
    level at or above it that straddles the tolerance, or a level of this configuration."""
    lo, hi = interval
    inside = [lv for lv in own if (lv.rejects(tol) or lv.admits(tol)) and lo < lv.dose < hi]
    prompts = None
    if inside:
        lv = min(inside, key=lambda lv: abs(lv.dose - measured))
        prompts = _prompts_to_decide(measured, interval, lv.dose, n)
        because = (
            f"the measured interval straddles the dose of {kind}'s level {lv.name} ({lv.dose:.4g}), which lost "
            f"{lv.loss_text()}: about {prompts} prompts (now {n}) would place it on one side"
        )
    else:
        higher = sorted((lv for lv in own if lv.dose >= hi), key=lambda lv: lv.dose)
        straddling = next((lv for lv in higher if not lv.rejects(tol)), None)
        if straddling is not None:
            seeds = straddling.seeds_to_decide(tol)
            because = (
                f"{kind}'s level {straddling.name} at {straddling.dose:.4g} (at or above this dose) lost "
                f"{straddling.loss_text()}, which straddles the tolerance: "
                + (f"about {seeds} seeds there (now {straddling.seeds}) would decide it" if seeds else "more seeds")
            )
        else:
            first = higher[0] if higher else max(own, key=lambda lv: lv.dose)
            where = "above" if higher else "below"
            because = (
                f"{kind} was run as a calibration level of its own, and the nearest ({first.name}, dose "
                f"{first.dose:.4g}, {where} this one) lost {first.loss_text()}: no level of {kind} at or above "
                f"this dose lost within the tolerance, and the noise ruler cannot admit {kind}; a calibration level "
                f"of {kind} at or above {hi:.4g} (this configuration, say) would decide it"
            )
    return Judgement(
        Verdict.UNCERTAIN,
        ruler,
        "levels",
        f"{kind}'s own calibration levels",
        None,
        None,
        None,
        prompts,
        None,
        because,
        evidence,
    )


def _by_ruler(measured: float, interval, ruler: Budget, n: int, evidence: list, name: str) -> Judgement:
    """Rule 3 (and a kind's own curve): verdict() against `ruler`, the margin to the end the rule compares with."""
    v = verdict(measured, interval, ruler, n)
    lo, hi = interval
    b_lo, b_hi = ruler.interval if ruler.interval else (ruler.value, ruler.value)
    b_lo, b_hi = min(b_lo, ruler.value), max(b_hi, ruler.value)
    calibrated = bool(ruler.interval)
    if v["verdict"] == Verdict.REJECT or (v["verdict"] == Verdict.UNCERTAIN and measured > b_hi):
        threshold, words, margin = b_hi, "the budget's upper end (BMDU)" if calibrated else "the budget", b_hi - lo
    else:
        threshold, words, margin = b_lo, "the budget's lower end (BMDL)" if calibrated else "the budget", b_lo - hi
    return Judgement(
        v["verdict"],
        ruler,
        "ruler",
        name,
        threshold,
        words,
        margin,
        v["prompts_to_decide"],
        None,
        v["undecided_because"],
        evidence,
    )


def _prompts_to_decide(measured: float, interval, edge: float, num_prompts: int) -> int:
    """About how many prompts would put the measured interval on one side of `edge` 9 times in 10 (verdict's law)."""
    lo, hi = interval
    half = (hi - measured if measured < edge else measured - lo) / expansion(num_prompts)
    if measured == edge:
        return num_prompts * 100
    n = num_prompts * (half / abs(measured - edge)) ** 2 * decide_factor()
    return max(math.ceil(n - 1e-9), num_prompts + 1)


# the second figure beside the verdict: the simulation's verdict shows the rollout engine's profile, and the other
# way round (budgets from `fp8probe calibrate` measure their mismatch in the simulation)
OTHER_ENGINE = {"sim": "vllm-cuda"}


def verdict(measured: float, interval: tuple[float, float], budget: Budget, num_prompts: int) -> dict:
    """ADMIT when the measured value's whole interval lies at or below the budget's (its interval's lower end, or the
    number itself when uncalibrated), REJECT when it lies wholly above (unless that end is censored: UNCERTAIN),
    UNCERTAIN otherwise. An UNCERTAIN verdict says what would decide it: when the measured value lies outside the
    budget's interval, about how many prompts (an interval narrows as 1/sqrt(n): n x (half-width / expansion(n) /
    distance to the budget)^2 x decide_factor()); when it lies inside, more prompts cannot, only a narrower budget
    (more calibration runs); above an end censored at the highest tested dose, calibration at higher doses."""
    lo, hi = interval
    b_lo, b_hi = budget.interval if budget.interval else (budget.value, budget.value)
    b_lo, b_hi = min(b_lo, budget.value), max(b_hi, budget.value)
    out = {"verdict": Verdict.UNCERTAIN, "prompts_to_decide": None, "undecided_because": None}
    if hi <= b_lo:
        out["verdict"] = Verdict.ADMIT
    elif lo > b_hi and (budget.censored or budget.interval_censored):
        why = (
            "its fitted curve stays within the tolerance up to the highest tested dose"
            if budget.censored
            else "in more than 5 % of the bootstrap's redrawn tables the curve stays within the tolerance up to the "
            "highest tested dose"
        )
        out["undecided_because"] = (
            f"the budget's upper end is censored at its highest tested dose ({b_hi:.4g}): {why}, so nothing above "
            "it can be rejected on the curve; calibration at higher doses, not more prompts, would decide it"
        )
    elif lo > b_hi:
        out["verdict"] = Verdict.REJECT
    elif b_lo <= measured <= b_hi:
        out["undecided_because"] = (
            "the measured value lies inside the budget's own interval: more calibration runs "
            "(seeds), not more prompts, would decide it"
        )
    else:
        out["prompts_to_decide"] = _prompts_to_decide(
            measured, interval, b_lo if measured < b_lo else b_hi, num_prompts
        )
        out["undecided_because"] = (
            f"the measured value's {LEVEL:.0%} interval straddles the budget: about "
            f"{out['prompts_to_decide']} prompts (now {num_prompts}) would decide it"
        )
    return out


def self_check(budget, doses: dict | None = None) -> list[dict]:
    """Each level of a calibrated budget checked as `check` checks its configuration on the budget's student (its dose
    and its interval as doses.json recorded them) beside the verdict its own loss implies: the calibration's evidence
    and the check must agree (docs/admission.md's table, tests/budget/test_self_consistency.py)."""
    from .evidence import levels_of

    doses = doses or {}
    rows = []
    for lv in levels_of(budget):
        if lv.loss_interval is None or lv.config is None:
            continue
        key = f"{budget.objective}/{lv.name}" if lv.kind == "stale" else lv.name
        interval = (doses.get(key) or {}).get("interval") or [lv.dose, lv.dose]
        lo, hi = lv.loss_interval
        implied = (
            Verdict.REJECT if lo > budget.tolerance else Verdict.ADMIT if hi <= budget.tolerance else Verdict.UNCERTAIN
        )
        v = judge(lv.dose, tuple(interval), budget, 16, lv.config)
        rows.append(
            {
                "level": lv.name,
                "dose": lv.dose,
                "interval": interval,
                "loss": lv.loss_text(),
                "seeds": lv.seeds,
                "implied": implied,
                "verdict": v.verdict,
                "judged_on": v.judged_on,
            }
        )
    return rows
