"""`run_sweep`: the sweep as one library call with typed settings, writing its run directory.

    DIR/rollouts.*, DIR/sensitivity.csv, DIR/run.json (sweeps/files.py), DIR/agreement.json (a fast sweep beside
    an exact one of the same rollouts: recipe/agreement.py)

Everything the settings and the model's config allow is checked before DIR exists; a sweep that would not fit in
memory is refused before loading; a killed sweep keeps its finished rows and resumes (`resume=True`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.artifacts import arithmetic, versions
from ..core.errors import FP8ProbeError
from ..core.files import output_dir
from ..core.records import AgreementRecord, SweepRunRecord
from ..core.results import Result
from ..model.settings import ModelSource, RolloutSettings
from ..sweeps.settings import SweepSettings
from .inputs import check_inputs, load, rollouts_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepResult(Result):
    table: object  # pandas DataFrame, sensitivity.csv
    run: SweepRunRecord  # run.json
    agreement: AgreementRecord | None

    def describe(self, seconds: float) -> str:
        """What `fp8probe sweep` prints: the ten most sensitive rows, the whole model, the agreement, one summary
        line."""
        from ..recipe.agreement import describe as agreement_line
        from ..sweeps.sweep import summary

        lines = [summary(self.table, self.run.whole_model)]
        lines += [agreement_line(self.agreement)] if self.agreement is not None else []
        table = self.out / "sensitivity.csv"
        return "\n".join(lines + [f"sweep: {len(self.table)} rows in {seconds:.0f} s -> {table}"])


def run_sweep(
    model: ModelSource,
    rollouts: RolloutSettings,
    settings: SweepSettings,
    out,
    resume: bool = False,
    progress: bool = False,
) -> SweepResult:
    """Sweep `model` on its rollouts as `settings` say and write the run directory `out` (see the module doc)."""
    from ..measurement.bench import Bench
    from ..measurement.scales import SCALES_FILE
    from ..recipe.agreement import AGREEMENT_FILE, agreement, check_comparable, exact_run_for
    from ..sweeps.files import RUN_FILE, PartialRows, check_resume_state, finish_sweep, write_run, write_table
    from ..sweeps.memory import check_sweep_fits
    from ..sweeps.scaleout import cluster_for, row_workers
    from ..sweeps.sweep import sweep, whole_model_rows

    inputs = check_inputs(model, rollouts, out, settings.preset, partial=True)
    cluster = cluster_for(model, settings.workers, settings.ray_address, settings.threads_per_worker)
    out = Path(out)
    check_resume_state(out, resume)
    if not resume and (out / RUN_FILE).exists():
        raise FP8ProbeError(f"{out} holds a finished sweep already; choose another `out` (or delete it first)")
    kind = settings.kind
    exact_run = exact_run_for(rollouts.rollouts, settings) if kind.estimate else None
    check_sweep_fits(model, rollouts, settings.method, inputs.rollouts)
    t0 = time.perf_counter()
    with output_dir(out, keep=("rollouts.safetensors", "rollouts.json")) as d:
        student, t_load = load(model)
        r, t_roll = rollouts_for(
            student, rollouts, d, reuse_from=d if resume else None, progress=progress, saved=inputs.rollouts
        )
        check_sweep_fits(model, rollouts, settings.method, r)
        if exact_run is not None:
            check_comparable(exact_run, settings, r, same_file=rollouts.rollouts)
        log.info(
            "%s (%s, %s granularity%s)",
            kind.words,
            settings.preset.name,
            settings.granularity,
            ", KV rows" if settings.include_kv else "",
        )
        t = time.perf_counter()
        bench = Bench.of(student, r, rollouts)
        with row_workers(model, cluster) as executor:
            swept = sweep(bench, settings, partial=PartialRows(d, resume), progress=progress, rows_executor=executor)
        df = swept.table
        whole = whole_model_rows(bench, settings, measured=swept.model_rows) if swept.reference is not None else None
        t_sweep = time.perf_counter() - t
        agree = None
        if exact_run is not None:
            log.info("agreement with the exact sweep in %s (two recipes, measured)", exact_run.directory)
            agree = agreement(df, exact_run.table, bench, settings)
            agree = replace(agree, exact_sweep=str(exact_run.directory))
            agree.write(d / AGREEMENT_FILE)
        write_table(d, df)
        if swept.calibration is not None and swept.calibration.per_sequence is not None:
            swept.calibration.per_sequence.write(d / SCALES_FILE)  # what `recipe` calibrates its search set from
        run = SweepRunRecord(
            command="sweep",
            model=student.name,
            model_path=student.path,
            model_type=student.model_type,
            scheme=settings.preset.name,
            granularity=settings.granularity,
            include_kv=settings.include_kv,
            kv_cache_dtype=settings.kv_cache_dtype,
            seed=r.meta.seed if r.meta else None,
            method=settings.recorded(rollouts.seed),
            exact_rows=int((df["method"] == "exact").sum()),
            workers=executor.stats if executor is not None else {"workers": 1},
            device=model.device,
            dtype=model.dtype,
            batch_size=rollouts.batch_size,
            arithmetic=arithmetic(rollouts.batch_size),
            num_sequences=r.num_sequences,
            num_tokens=int(r.attention_mask.sum()),
            num_response_tokens=r.num_response_tokens,
            rows=len(df),
            whole_model=whole,
            seconds={
                "load": round(t_load, 3),
                "rollouts": round(t_roll, 3),
                **{k: round(v, 3) for k, v in swept.seconds.items()},
                "sweep": round(t_sweep, 3),
                "total": round(time.perf_counter() - t0, 3),
            },
            versions=versions(),
        )
        write_run(d, run)
        finish_sweep(d)
    return SweepResult(out, df, run, agree)
