"""`fp8probe ladder`: every shortcut the user names on one scale, on a ruler of seeded weight noise.

    fp8probe ladder [MODEL] [--recipe R ...] [--kv-cache-dtype fp8] [--stale CKPT ...] [--noise ...] [--combine]
                    [--teacher T] [--engine sim|vllm-cuda|vllm-cpu] --out DIR

Writes DIR/ladder.csv (sources/ladder.py's table) and DIR/ladder.json.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..core.artifacts import arithmetic, versions
from ..core.files import atomic_write_text, output_dir
from ..core.records import LadderRecord
from ..core.results import Result
from ..measurement.perturbation import Perturbation
from ..sources.ladder import ladder
from ..sources.settings import LadderSettings
from ..sources.sources import NOISE_RULER, Source, combine, noise


def run_ladder(model, rollouts, settings: LadderSettings, out, progress: bool = False) -> LadderResult:
    """Every source on one scale (ladder()), written as DIR/ladder.csv and DIR/ladder.json; returns the table."""
    from ..measurement.bench import Bench
    from .inputs import check_inputs, load, rollouts_for

    sc = settings.shortcuts
    check_inputs(model, rollouts, out)
    sc.check(model)
    t0 = time.perf_counter()
    with output_dir(out) as d:
        student, _ = load(model)
        teacher = sc.load_teacher(model)
        r, _ = rollouts_for(student, rollouts, d, progress=progress)
        named = sc.sources(student, model.allow_pickle)
        steps = [noise(student, s, settings.noise_seed) for s in (settings.noise or NOISE_RULER)] + named
        if settings.combine:
            steps.append(combine(named))
        if sc.engine != "sim":  # what the engine's own arithmetic costs with no shortcut at all
            steps.insert(0, Source(f"{sc.engine} alone", "engine", Perturbation()))
        df = ladder(Bench.of(student, r, rollouts), steps, settings, teacher=teacher, progress=progress)
        atomic_write_text(d / "ladder.csv", df.to_csv(index=False, float_format="%.17g"))
        record = LadderRecord(
            command="ladder",
            model=student.name,
            teacher=sc.teacher,
            engine=sc.engine,
            sources=[{"name": s.name, "kind": s.kind, "parts": list(s.parts)} for s in steps],
            num_sequences=r.num_sequences,
            num_response_tokens=r.num_response_tokens,
            noise_seed=settings.noise_seed,
            prefix_seed=rollouts.seed,
            arithmetic=arithmetic(rollouts.batch_size),
            seconds=round(time.perf_counter() - t0, 3),
            versions=versions(),
        )
        record.write(d / LadderRecord.KIND)
    return LadderResult(Path(out), df, record)


@dataclass(frozen=True)
class LadderResult(Result):
    table: object  # pandas DataFrame, ladder.csv
    record: LadderRecord

    def describe(self, seconds: float) -> str:
        df = self.table
        cols = [
            c
            for c in (
                "source",
                "kl_q_p",
                "k3",
                "top1_agree",
                "sum_of_parts",
                "diverged",
                "first_div_mean",
                "kl_q_p_own",
                "mean_abs_reward_delta",
                "ratio_out_verl",
            )
            if c in df.columns
        ]
        return (
            df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}")
            + f"\nladder: {len(df)} sources in {seconds:.0f} s -> {self.out}/ladder.csv"
        )
