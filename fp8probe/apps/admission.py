"""The admission check: can we train with this rollout configuration?

    fp8probe check [MODEL] --budget budget.json|VALUE [--recipe recipe.yaml] [--kv-cache-dtype fp8]
                   [--stale CKPT] [--teacher T] [--rollouts DIR] --out DIR

The configuration (the recipe's FP8 weights, the FP8 KV cache, stale weights: whichever are given, all at
once) is one perturbation, measured on the student's rollouts with the one measurement function, then
compared with the budget on the budget's metric (its excess over the zero point, metrics.excess): ADMIT
when it is within, REJECT when it is above. Beside the verdict: every metric, the prefix shift and, with a
teacher, the OPD-signal distortion. Minutes, not a training run: one reference pass, one candidate pass,
two continuations of the prompts and one pass on the candidate's own samples.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import TYPE_CHECKING

from ..core.artifacts import version
from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS, excess
from ..core.settings import Settings, opt
from ..recipe.budget import Budget
from .sources import Shortcuts, Source, combine

if TYPE_CHECKING:  # light at import: the CLI reads CheckSettings for --help
    from ..measurement.reference import Reference

SCHEMA_VERSION = version("check.json")


def check(student, rollouts, config: Source, budget: Budget, teacher=None, reference: Reference | None = None,
          prefix_tokens: int | None = None, seed: int = 0, batch_size: int = 8, engine: str = "sim") -> dict:
    """The verdict and everything behind it, as check.json holds it; every figure computed as `engine` does
    ("sim": the configuration in the reference-dtype model, as the budget and the recipes were measured; an
    engines.py profile: the rollout engine's own arithmetic, e.g. "vllm-cuda")."""
    from ..measurement.measure import measure_candidate
    from ..measurement.opd import OPDSignal
    from ..measurement.prefix import PrefixShift, prompt_ids
    from ..measurement.reference import Reference

    if reference is None:
        reference = Reference(student, rollouts, batch_size)
    metrics = measure_candidate(reference, student, rollouts, config.perturbation, engine, batch_size)
    measured = excess(budget.metric, metrics[budget.metric])
    tokens = prefix_tokens or int(rollouts.meta.get("sampling", {}).get("max_new_tokens", 32))
    shift = PrefixShift(student, reference, prompt_ids(student, rollouts), tokens, seed=seed,
                        batch_size=batch_size, engine=engine).measure(config.perturbation)
    opd = None
    if teacher is not None:
        opd = OPDSignal(student, teacher, reference, engine).measure(config.perturbation)
    admit = measured <= budget.value
    return {
        "schema_version": SCHEMA_VERSION, "verdict": "ADMIT" if admit else "REJECT", "configuration": config.name,
        "engine": engine,
        "metric": budget.metric, "measured": measured, "budget": budget.value,
        "margin": budget.value - measured, "budget_calibrated": budget.calibrated, "budget_source": budget.source,
        "budget_interval": budget.interval, "metrics": metrics, "prefix_shift": shift, "opd_signal": opd,
        "num_sequences": rollouts.num_sequences, "num_response_tokens": rollouts.num_response_tokens,
    }


def format_check(report: dict) -> str:
    engine = report.get("engine", "sim")
    as_run = "" if engine == "sim" else f" as {engine} runs it"
    lines = [f"{report['verdict']}: {report['configuration']}{as_run}: {report['metric']} {report['measured']:.4g} "
             f"{'<=' if report['verdict'] == 'ADMIT' else '>'} budget {report['budget']:.4g} "
             f"(margin {report['margin']:+.3g}; budget {'calibrated' if report['budget_calibrated'] else 'UNCALIBRATED'}"
             f": {report['budget_source']})"]
    s = report["prefix_shift"]
    lines.append(f"prefix shift: {s['diverged']:.0%} of continuations diverge"
                 + (f" (first at token {s['first_div_mean']:.1f} on average)" if s["diverged"] else "")
                 + f"; on its own samples kl_q_p {s['kl_q_p_own']:.4g}, k3 {s['k3_own']:.4g}")
    if report["opd_signal"]:
        o = report["opd_signal"]
        lines.append(f"OPD signal: mean |Δreward| {o['mean_abs_reward_delta']:.4g} per token, corr "
                     f"{o['reward_corr']:.4f} with the mismatch-free reward, sequence reverse-KL change "
                     f"{o['seq_rkl_delta']:+.4g}; ratios beyond verl's 2.0: {o['ratio_out_verl']:.2%}, outside "
                     f"OpenRLHF's [0.5, 5]: {o['ratio_out_openrlhf']:.2%}")
    return "\n".join(lines)


@dataclass(frozen=True)
class CheckSettings(Settings):
    """One rollout configuration (`shortcuts`: at most one recipe, KV cache and stale checkpoint, together) against
    `budget`: a number on `metric`, or a budget.json written by `fp8probe budget` / `calibrate`."""

    shortcuts: Shortcuts
    budget: str = opt(MISSING, "a number (on the metric) or a budget.json from `fp8probe budget`", required=True)
    metric: str = opt("kl_q_p", "the metric a numeric budget bounds", choices=METRICS, metavar="METRIC")

    def __post_init__(self):
        super().__post_init__()
        sc = self.shortcuts
        if not (sc.recipe or sc.kv_cache_dtype or sc.stale):
            raise FP8ProbeError("nothing to check: give `recipe`, `kv_cache_dtype` and/or `stale` (the rollout "
                                "configuration)")
        if len(sc.recipe) > 1 or len(sc.kv_cache_dtype) > 1 or len(sc.stale) > 1:
            raise FP8ProbeError("check takes one configuration: at most one `recipe`, `kv_cache_dtype` and `stale` "
                                "(compare several with `fp8probe ladder`)")


def run_check(model, rollouts, settings: CheckSettings, out, progress: bool = False) -> dict:
    """The verdict (check()) written as DIR/check.json; returns the report."""
    from ..core.files import atomic_write_json, output_dir
    from ..recipe.budget import read_budget
    from .inputs import check_inputs, load, rollouts_for

    budget = read_budget(settings.budget, settings.metric)  # a negative, NaN or unreadable budget fails here
    sc = settings.shortcuts
    check_inputs(model, rollouts, out)
    sc.check(model)
    with output_dir(out) as d:
        student, _ = load(model)
        teacher = sc.load_teacher(model)
        r, _ = rollouts_for(student, rollouts, d, progress=progress)
        named = sc.sources(student, model.allow_pickle)
        config = named[0] if len(named) == 1 else combine(named)
        report = check(student, r, config, budget, teacher=teacher, prefix_tokens=rollouts.max_new_tokens,
                       seed=rollouts.seed, batch_size=rollouts.batch_size, engine=sc.engine)
        atomic_write_json(d / "check.json", report)
    return report
