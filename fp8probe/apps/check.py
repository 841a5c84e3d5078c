"""`fp8probe check`: can we train with this rollout configuration? (the verdict: budget/admission.py)

    fp8probe check [MODEL] --budget budget.json|VALUE [--recipe recipe.yaml] [--kv-cache-dtype fp8]
                   [--stale CKPT] [--teacher T] [--rollouts DIR] --out DIR

Writes DIR/check.json; exit codes 0 ADMIT, 1 REJECT, 3 UNCERTAIN.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..budget.admission import check
from ..budget.settings import CheckSettings
from ..core.errors import EXIT_OK, EXIT_REJECT, EXIT_UNCERTAIN
from ..core.files import output_dir
from ..core.records import CheckRecord
from ..core.results import Result
from ..sources.sources import combine


@dataclass(frozen=True)
class CheckResult(Result):
    report: CheckRecord  # check.json

    @property
    def exit_code(self) -> int:
        """The check's documented exit code: 0 ADMIT, 1 REJECT, 3 UNCERTAIN (core/errors.py)."""
        return {"ADMIT": EXIT_OK, "REJECT": EXIT_REJECT}.get(self.report.verdict, EXIT_UNCERTAIN)

    def describe(self, seconds: float) -> str:
        return format_check(self.report)


def format_check(report: CheckRecord) -> str:
    engine = report.engine
    as_run = "" if engine == "sim" else f" as {engine} runs it"
    v = report.verdict
    lo, hi = report.measured_interval
    b = f"budget {'> ' if report.budget_censored else ''}{report.budget:.4g}"
    if report.budget_interval:
        top = report.budget_interval[1]
        b += f" [{report.budget_interval[0]:.4g}, {'> ' if report.budget_interval_censored else ''}{top:.4g}]"
    sign = {"ADMIT": "<=", "REJECT": ">"}.get(v, "vs")
    pred = report.predicted
    lines = (
        [
            f"predicted before measuring: {report.metric} {pred['value']:.4g} by the damage model in "
            f"{pred['source']} (its cross-validated median error {pred['cv_median_rel_error']:.0%})"
        ]
        if pred and pred.get("value") is not None
        else []
    )
    lines += [
        f"{v}: {report.configuration}{as_run}: {report.metric} {report.measured:.4g} "
        f"[{lo:.4g}, {hi:.4g}] {sign} {b} (margin {report.margin:+.3g}; budget "
        f"{'calibrated' if report.budget_calibrated else 'UNCALIBRATED'}: {report.budget_source})"
    ]
    if report.judged_on and report.judged_on != "the noise ruler":
        lines.append(f"judged on {report.judged_on}")
    for e in report.kind_evidence or []:
        lo, hi = e["loss_interval"] or (float("nan"), float("nan"))
        lines.append(
            f"{e['kind']} as a calibration level ({e['level']}, dose {e['mismatch']:.4g}): lost "
            f"{e['loss']:+.1%} [{lo:+.1%}, {hi:+.1%}] ({report.budget_response} "
            f"loss, {e['seeds']} seeds); "
            f"{e['reading']}"
        )
    for note in (report.budget_student_note, report.budget_objective_note):
        if note:
            lines.append(f"note: {note}")
    if report.undecided_because:
        lines.append(f"undecided: {report.undecided_because}")
    a = report.also_measured
    if a and a.get("measured") is not None:
        lines.append(
            f"as {a['engine']} computes it: {report.metric} {a['measured']:.4g} [{a['interval'][0]:.4g}, "
            f"{a['interval'][1]:.4g}] (the verdict is on the {engine} figure; calibrated budgets measure "
            "mismatch in sim)"
        )
    elif a:
        lines.append(f"not measured as {a['engine']} computes it: {a['not_covered']}")
    s = report.prefix_shift
    lines.append(
        f"prefix shift: {s['diverged']:.0%} of continuations diverge"
        + (f" (first at token {s['first_div_mean']:.1f} on average)" if s["diverged"] else "")
        + f"; on its own samples kl_q_p {s['kl_q_p_own']:.4g}, k3 {s['k3_own']:.4g}; as verl logs it "
        + f"rollout_corr/kl {s['rollout_corr/kl']:.4g}, k3_kl {s['rollout_corr/k3_kl']:.4g}, "
        + f"{s['ppo_clip_share']:.1%} of tokens outside a PPO clip of 0.2"
    )
    if report.opd_signal:
        o = report.opd_signal
        lines.append(
            f"OPD signal: mean |Δreward| {o['mean_abs_reward_delta']:.4g} per token, corr "
            f"{o['reward_corr']:.4f} with the mismatch-free reward, sequence reverse-KL change "
            f"{o['seq_rkl_delta']:+.4g}; ratios beyond verl's 2.0: {o['ratio_out_verl']:.2%}, outside "
            f"OpenRLHF's [0.5, 5]: {o['ratio_out_openrlhf']:.2%}"
        )
    return "\n".join(lines)


def run_check(model, rollouts, settings: CheckSettings, out, progress: bool = False) -> CheckResult:
    """The verdict (check()) written as DIR/check.json; returns it with the report (with `checkpoints`: the series,
    apps/series.py)."""
    if settings.checkpoints:
        from .series import run_series

        return run_series(model, rollouts, settings, out, progress)
    from ..budget.fit import check_student, read_budget
    from ..recipe.damage import predict
    from ..training.runs import objective_note
    from .inputs import check_inputs, load, rollouts_for

    budget = read_budget(settings.budget, settings.metric)  # a negative, NaN or unreadable budget fails here
    budget.check_judgeable()
    objective = objective_note(budget, settings.objective)  # an unknown objective fails here
    sc = settings.shortcuts
    check_inputs(model, rollouts, out)
    sc.check(model)
    with output_dir(out) as d:
        student, _ = load(model)
        note = check_student(budget, student, settings.other_student)  # another student's budget: refused here
        teacher = sc.load_teacher(model)
        r, _ = rollouts_for(student, rollouts, d, progress=progress)
        named = sc.sources(student, model.allow_pickle)
        config = named[0] if len(named) == 1 else combine(named)
        predicted = predict(sc.recipe[0], student, config.perturbation, budget.metric) if sc.recipe else None
        report = check(student, r, config, budget, engine=sc.engine, teacher=teacher, sampling=rollouts)
        report = replace(report, budget_student_note=note, predicted=predicted, budget_objective_note=objective)
        report.write(d / CheckRecord.KIND)
    return CheckResult(Path(out), report)
