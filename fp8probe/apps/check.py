"""`fp8probe check`: can we train with this rollout configuration? (the verdict: budget/admission.py)

    fp8probe check [MODEL] --budget budget.json|VALUE [--recipe recipe.yaml] [--kv-cache-dtype fp8]
                   [--stale CKPT] [--teacher T] [--rollouts DIR] --out DIR

Writes DIR/check.json; exit codes 0 ADMIT, 1 REJECT, 3 UNCERTAIN.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..budget.admission import check, check_async
from ..budget.check_words import format_check
from ..budget.evidence import Verdict
from ..budget.settings import CheckSettings
from ..core.errors import EXIT_OK, EXIT_REJECT, EXIT_UNCERTAIN
from ..core.files import output_dir
from ..core.records import CheckRecord
from ..core.results import Result
from ..sources.sources import combine
from ..sources.verl_async import async_configuration, check_mixable


def judged_scale(budget, rollouts, saved, other_scale: bool) -> str | None:
    """Refuse, in one line, rollouts of another scale than the budget's doses (another kind of prompt, response length
    or sampling: `Budget.other_scale`) unless `other_scale`, then the note the verdict carries; None: the same."""
    from ..budget.fit import scale_of
    from ..core.errors import FP8ProbeError
    from ..model.rollouts import read_prompts

    if saved is not None and saved.meta is not None and saved.meta.sampling:
        s = saved.meta.sampling
        scale = scale_of(saved.meta.prompts, s.get("max_new_tokens"), s.get("temperature"), s.get("top_p", 1.0))
    elif saved is not None:
        return "the rollouts record no sampling settings: the budget's scale could not be compared"
    else:
        prompts = read_prompts(rollouts.prompts, rollouts.prompt_key) if rollouts.prompts else None
        scale = scale_of(prompts, rollouts.max_new_tokens, rollouts.temperature)
    why = budget.other_scale(scale)
    if why is None:
        return None
    if not other_scale:
        raise FP8ProbeError(
            f"the budget's doses were measured on other rollouts than these ({why}): its scale is another; drop "
            "`rollouts`/`prompts`/`max_new_tokens`/`temperature` (check samples the budget's own), or pass "
            "`other_scale` to judge these anyway (the verdict will say so)"
        )
    return f"judged on rollouts of another scale than the budget's doses ({why}; `other_scale` given)"


@dataclass(frozen=True)
class CheckResult(Result):
    report: CheckRecord  # check.json

    @property
    def exit_code(self) -> int:
        """The check's documented exit code: 0 ADMIT, 1 REJECT, 3 UNCERTAIN (core/errors.py)."""
        return {Verdict.ADMIT: EXIT_OK, Verdict.REJECT: EXIT_REJECT}.get(self.report.verdict, EXIT_UNCERTAIN)

    def describe(self, seconds: float) -> str:
        return format_check(self.report)


def run_check(model, rollouts, settings: CheckSettings, out, progress: bool = False) -> CheckResult:
    """The verdict (check()) written as DIR/check.json; returns it with the report (with `checkpoints`: the series,
    apps/series.py)."""
    if settings.checkpoints:
        from .series import run_series

        return run_series(model, rollouts, settings, out, progress)
    from ..budget.fit import check_student, check_teacher, read_budget
    from ..measurement.bench import Bench
    from ..training.runs import objective_note
    from .inputs import check_inputs, load, rollouts_for

    budget = read_budget(settings.budget, settings.metric)  # a negative, NaN or unreadable budget fails here
    budget.check_judgeable()
    objective = objective_note(budget, settings.objective)  # an unknown objective fails here
    if settings.verl_async:
        check_mixable(budget.metric)
    sc = settings.shortcuts
    inputs = check_inputs(model, rollouts, out)
    scale_note = judged_scale(budget, rollouts, inputs.rollouts, settings.other_scale)  # another scale: refused here
    sc.check(model)
    start = replace(model, model=settings.descends_from) if settings.descends_from else None
    if start is not None:
        start.check()
    with output_dir(out) as d:
        student, _ = load(model)
        note = check_student(budget, student, settings.other_student, start.load() if start else None)  # refused here
        teacher = sc.load_teacher(model)
        teacher_note = check_teacher(budget, teacher, settings.other_student)
        r, _ = rollouts_for(student, rollouts, d, progress=progress, saved=inputs.rollouts)
        named, bench = sc.sources(student, model.allow_pickle, settings.stale_steps), Bench.of(student, r, rollouts)
        if settings.verl_async:
            name, lags = async_configuration(student, named, settings.stale_steps, settings.verl.on(r))
            report = check_async(bench, name, budget, lags, engine=sc.engine, teacher=teacher)
        else:
            config = named[0] if len(named) == 1 else combine(named)
            report = check(bench, config, budget, engine=sc.engine, teacher=teacher)
        note = "; ".join(x for x in (note, teacher_note) if x) or None
        report = replace(report, budget_student_note=note, budget_objective_note=objective, scale_note=scale_note)
        report.write(d / CheckRecord.KIND)
    return CheckResult(Path(out), report)
