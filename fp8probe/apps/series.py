"""`fp8probe check --checkpoints C1 C2 ...`: one rollout configuration at a series of checkpoints of the student
(budget/series.py): per checkpoint, rollouts re-sampled from it, the figure with its interval and its verdict; the
trend and the first checkpoint outside the budget. Writes DIR/series.json (and each checkpoint's rollouts)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..budget.evidence import Verdict
from ..core.errors import EXIT_OK, EXIT_REJECT, EXIT_UNCERTAIN
from ..core.files import output_dir
from ..core.records import SeriesRecord
from ..core.results import Result


@dataclass(frozen=True)
class SeriesResult(Result):
    report: SeriesRecord  # series.json

    @property
    def exit_code(self) -> int:
        """0 when every checkpoint is admitted, 1 when one is rejected, 3 otherwise (as check's)."""
        verdicts = {r["verdict"] for r in self.report.checkpoints}
        return EXIT_REJECT if Verdict.REJECT in verdicts else EXIT_OK if verdicts == {Verdict.ADMIT} else EXIT_UNCERTAIN

    def describe(self, seconds: float) -> str:
        r = self.report
        lines = [
            f"{r.configuration} across {len(r.checkpoints)} checkpoints, {r.metric} against budget {r.budget:.4g}:"
        ]
        for p in r.checkpoints:
            lo, hi = p["measured_interval"]
            lines.append(f"  {p['verdict']:<9} {p['checkpoint']}: {p['measured']:.4g} [{lo:.4g}, {hi:.4g}]")
        t = r.trend
        lines.append(
            f"trend: last / first {t['ratio_last_first']:.3g} [{t['interval'][0]:.3g}, {t['interval'][1]:.3g}]"
            f" ({t['reading']}); first outside the budget: {r.first_outside or 'none'}"
        )
        return "\n".join(lines)


def run_series(model, rollouts, settings, out, progress: bool = False) -> SeriesResult:
    """The configuration of `settings` (a check.CheckSettings with `checkpoints`) at each checkpoint."""
    from ..budget.fit import check_student, read_budget
    from ..budget.series import measure_point, summarize_series
    from ..measurement.bench import Bench
    from ..sources.sources import combine
    from .inputs import check_inputs, load, rollouts_for

    budget = read_budget(settings.budget, settings.metric)
    budget.check_judgeable()
    sc = settings.shortcuts
    sources = [replace(model, model=c) for c in settings.checkpoints]
    for s in sources:
        check_inputs(s, rollouts, out)
        sc.check(s)
    start = replace(model, model=settings.descends_from) if settings.descends_from else None
    if start is not None:
        start.check()
    rows, measured, note = [], [], None
    with output_dir(out) as d:
        for i, src in enumerate(sources):
            student, _ = load(src)
            if i == 0:  # one student along training: its first checkpoint is the budget's, or descends from it
                note = check_student(budget, student, settings.other_student, start.load() if start else None)
            (d / f"checkpoint-{i}").mkdir()
            r, _ = rollouts_for(student, rollouts, d / f"checkpoint-{i}", progress=progress)
            named = sc.sources(student, src.allow_pickle)
            config = named[0] if len(named) == 1 else combine(named)
            row, got = measure_point(Bench.of(student, r, rollouts), config, budget, sc.engine)
            rows.append({"checkpoint": src.model, **row})
            measured.append(got)
        report = SeriesRecord(
            configuration=config.name,
            engine=sc.engine,
            metric=budget.metric,
            budget=budget.value,
            budget_interval=budget.interval,
            budget_source=budget.source,
            budget_student_note=note,
            checkpoints=rows,
            **summarize_series(rows, measured[0], measured[-1], budget.metric),
        )
        report.write(d / SeriesRecord.KIND)
    return SeriesResult(Path(out), report)
