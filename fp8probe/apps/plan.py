"""The benefit beside the cost: `fp8probe plan`, each rollout configuration's throughput and time to quality.

    fp8probe plan [MODEL] --gpu H100 [--tp N] [--recipe R ...] [--fp8 FP8_DYNAMIC] [--kv-cache-dtype fp8]
                  [--async 1 ...] [--calibration DIR] [--budget B] --out DIR

Configurations: BF16 and every combination of the weights (each recipe, each whole-model `fp8` scheme), the KV
cache (each `kv_cache_dtype`) and the staleness (each `async` K). For each:

- measured cost: the configuration's mismatch on the student's rollouts with its 90 % interval (the check's
  measurement; asynchronous rollouts: measured together with a `stale` checkpoint K steps old, or, without one,
  the calibration's own `stale:K` level added to the rest, labelled as a sum), and the check's verdict against the
  budget. A config-only MODEL (`shape:qwen3-8b`, a bare config.json) or `measure` off: not measured.
- rollout throughput, MODELLED (deploy/throughput.py): one rollout batch of `rollout_batch` requests under vLLM's
  continuous batching, on `gpu`, in the KV pool vLLM would size (deploy/capacity.py).
- step time: synchronous = rollout + train; asynchronous (K >= 1) = max(rollout, train); the train step is
  `train_step_s`, or modelled as 6 x active parameters x tokens / (`mfu` x BF16 peak x GPUs).
- time to quality: with a calibration, the steps to the target quality read off its learning curves at the
  measured mismatch (budget/curves.py; rejected or beyond the calibrated levels: refused, never extrapolated; an
  UNCERTAIN verdict is computed and flagged as such in `verdict`) with a paired bootstrap interval over the
  calibration's seeds; without one, every admitted configuration is assumed to need BF16's `steps`, and plan.json
  says so.

Writes plan.csv, plan.json (schema-versioned) and plan.png; prints the table sorted by time to target.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.files import atomic_write_text, check_writable, output_dir
from ..core.records import PlanRecord
from ..core.results import Result
from ..planning.plan import COLUMNS, PlanSettings, check_plan, has_weights, plan, verl_async_lines


def run_plan(model, rollouts, settings: PlanSettings, serving, out, progress: bool = False) -> PlanResult:
    """`fp8probe plan`: the table (plan.csv), plan.json and plan.png in `out`; returns plan.json's content."""
    from ..measurement.bench import Bench
    from ..plots import plan_plot
    from .inputs import check_inputs, load, rollouts_for

    t0 = time.perf_counter()
    check_writable(out)
    evidence = check_plan(settings, serving, model)  # the curves and the budget: what cannot be planned, refused first
    measured = settings.measure and has_weights(model)
    if measured:
        check_inputs(model, rollouts, out)
    else:
        model.check()  # a config-only model: the config fp8probe supports, before any output
    with output_dir(out) as d:
        bench = None
        if measured:
            student, _ = load(model)
            evidence = evidence.on(student, settings.other_student)  # another student's budget: before rollouts
            r, _ = rollouts_for(student, rollouts, d, progress=progress)
            bench = Bench.of(student, r, rollouts)
        record = plan(bench, settings, serving, model, evidence=evidence, progress=progress)
        record = replace(record, seconds=round(time.perf_counter() - t0, 3))
        import pandas as pd

        table = pd.DataFrame([{c: row.get(c) for c in COLUMNS} for row in record.rows], columns=COLUMNS)
        atomic_write_text(d / "plan.csv", table.to_csv(index=False, float_format="%.6g"))
        record.write(d / PlanRecord.KIND)
        plan_plot(record, d / "plan.png")
    return PlanResult(Path(out), record)


@dataclass(frozen=True)
class PlanResult(Result):
    record: PlanRecord

    def describe(self, seconds: float) -> str:
        """The printed table, sorted by time to target (refused and unreached last)."""
        rec, out = self.record, self.out

        def f(v, fmt):
            return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

        lines = [
            f"{rec.model} on {rec.gpu} x{rec.tensor_parallel_size}: {rec.rollout_batch} rollouts of "
            f"{rec.mean_prompt_len:.0f} + {rec.mean_response_len:.0f} tokens per step ({rec.lengths}); "
            f"train step {rec.train_step_s:.3g} s ({rec.train_step}); throughput MODELLED",
            *(
                [f"teacher scoring pass {rec.teacher['scoring_s']:.3g} s per step ({rec.teacher['how']})"]
                if rec.teacher
                else []
            ),
            *verl_async_lines(rec.verl_async),
            f"{'configuration':<34}{'mismatch [90% interval]':>30}{'verdict':>11}{'KV tokens':>12}{'tok/s':>10}"
            f"{'step s':>9}{'steps':>8}{'to target':>11}{'speed-up [90%]':>22}",
        ]
        for row in sorted(rec.rows, key=lambda r: (r["time_to_target_s"] is None, r["time_to_target_s"] or 0.0)):
            mm = (
                "not measured"
                if row["mismatch"] is None
                else (f"{row['mismatch']:.3g} [{row['mismatch_lo']:.3g}, {row['mismatch_hi']:.3g}]")
            )
            sp = (
                "-"
                if row["speedup"] is None
                else f"{row['speedup']:.2f}x [{f(row['speedup_lo'], '.2f')}, {f(row['speedup_hi'], '.2f')}]"
            )
            t = row["time_to_target_s"]
            lines.append(
                f"{row['configuration']:<34}{mm:>30}{row['verdict'] or '-':>11}{row['kv_tokens']:>12,}"
                f"{row['rollout_tokens_per_s']:>10.0f}{row['step_s']:>9.3g}"
                f"{f(row['steps_to_target'], '.1f'):>8}"
                f"{'-' if t is None else f'{t / 60:.1f} min':>11}{sp:>22}"
            )
        cal = rec.calibration
        assumed = [r["configuration"] for r in rec.rows if str(r["steps_source"]).startswith("assumed")]
        if cal and assumed:
            lines.append(f"{len(assumed)} configurations not measured: ASSUMED to need BF16's steps")
        if cal:
            lines.append(
                f"steps to target: {cal['objective']} learning curves of {cal['source']} "
                f"(target {cal['target']:.4g},"
                f" {cal['target_rule']}); budget {rec.budget['metric']} <= {rec.budget['value']:.4g}"
            )
        else:
            lines.append(
                f"steps to target: no calibration; every admitted configuration is ASSUMED to need BF16's "
                f"{rec.assumed_steps} steps"
            )
        lines.append(f"plan: {len(rec.rows)} configurations in {seconds:.0f} s -> {out}/plan.csv")
        return "\n".join(lines)
