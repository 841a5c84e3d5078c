"""`run_measure`: the whole model's mismatch in one scheme (and an FP8 KV cache), as an engine computes it, on the
student's rollouts; writes DIR/rollouts.* and DIR/mismatch.json."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..core.artifacts import arithmetic, versions
from ..core.files import output_dir
from ..core.records import MismatchRecord
from ..core.results import Result
from ..measurement.settings import MeasureSettings
from ..model.settings import ModelSource, RolloutSettings
from .inputs import check_inputs, load, rollouts_for


def run_measure(
    model: ModelSource, rollouts: RolloutSettings, settings: MeasureSettings, out, progress: bool = False
) -> MeasureResult:
    """mismatch.json's content (every metric, the tokens it was measured on, and the prefix shift: the candidate's
    own continuations with verl's metrics of them), after writing it into `out`."""
    from ..measurement.bench import Bench
    from ..measurement.measure import measure_scheme, scheme_perturbation
    from ..measurement.prefix import PrefixShift

    check_inputs(model, rollouts, out, settings.preset)
    t0 = time.perf_counter()
    with output_dir(out) as d:
        student, _ = load(model)
        r, _ = rollouts_for(student, rollouts, d, progress=progress)
        p, bench = scheme_perturbation(student, settings.preset, kv=settings.kv), Bench.of(student, r, rollouts)
        metrics = measure_scheme(bench, settings.preset, kv=settings.kv, engine=settings.engine)
        shift = PrefixShift.sampled_as(bench, settings.engine).measure(p)
        record = MismatchRecord(
            command="measure",
            model=student.name,
            scheme=settings.preset.name,
            engine=settings.engine,
            kv_cache_dtype=settings.kv_cache_dtype,
            num_sequences=r.num_sequences,
            num_response_tokens=r.num_response_tokens,
            metrics=metrics,
            prefix_shift=shift,
            arithmetic=arithmetic(rollouts.batch_size),
            seconds=round(time.perf_counter() - t0, 3),
            versions=versions(),
        )
        record.write(d / MismatchRecord.KIND)
    return MeasureResult(Path(out), record)


@dataclass(frozen=True)
class MeasureResult(Result):
    record: MismatchRecord

    def describe(self, seconds: float) -> str:
        return _describe(self.record, self.out, seconds)


def _describe(rec: MismatchRecord, out, seconds: float) -> str:
    what = rec.scheme + (f" + {rec.kv_cache_dtype} KV cache" if rec.kv_cache_dtype else "")
    engine = "" if rec.engine == "sim" else f" as {rec.engine} runs it"
    return "\n".join(
        [
            f"\nwhole-model {what}{engine} vs reference on {rec.num_response_tokens} response tokens:",
            *(f"  {k:<22} {v:.6g}" for k, v in rec.metrics.items()),
            *_shift_lines(rec.prefix_shift),
            f"measure: {seconds:.0f} s -> {Path(out) / MismatchRecord.KIND}",
        ]
    )


def _shift_lines(shift: dict | None) -> list[str]:
    """The candidate's own continuations: how many diverge, and verl's figures of them (measurement/verl.py)."""
    if not shift:
        return []
    verl = [k for k in shift if "/" in k or k == "ppo_clip_share"]
    return [
        f"on its own continuations ({shift['diverged']:.0%} diverge from the reference's), as verl logs them:",
        *(f"  {k:<44} {shift[k]:.6g}" for k in verl),
    ]
