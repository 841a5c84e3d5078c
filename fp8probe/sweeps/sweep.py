"""The one-unit-at-a-time sweep: put one unit (or fused group, or one layer's KV cache) in FP8, score it.

For every row the mismatch metrics of mismatch.py are measured on the student's own rollouts against
the reference pass, reusing the reference's prefix (reference.py): a unit in block b costs the blocks
b..L-1 plus the lm_head on response positions, not a whole forward. Rows:

    one per unit (granularity="unit") or per fused group ("group"), kind q/k/v/o/gate/up/down/expert/...
    one per attention layer, kind "kv": that layer's KV cache in FP8 (include_kv=True)
    model.fp8_all        kind "model": every unit in FP8 (the usual "all but lm_head" recipe)
    model.fp8_all_kv     kind "model": the same plus an FP8 KV cache in every layer (include_kv=True)
    model.reference      kind "model": the reference against itself; 0 (within fp32 rounding) or the sweep is broken

Units whose shapes the scheme's kernels refuse (student.scheme_blockers: FP8_BLOCK on dims that are not
whole groups of 128) get no row and are left out of the model rows: they stay BF16 in every recipe.

Results are appended to sensitivity.partial.csv after each row, so a killed sweep resumes where it
stopped (`resume=True`) and ends with the same table as an uninterrupted one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS, no_mismatch
from ..core.progress import bar_interval
from ..core.schemes import KVCacheScheme, Scheme, num_scales
from ..measurement.bench import Bench
from ..measurement.fisher import DEFAULT_ESTIMATOR, Draws, fisher_rows
from ..measurement.measure import Measured
from ..measurement.mismatch import summarize
from ..measurement.perturbation import Perturbation
from ..measurement.perturbed import perturbed_stats
from ..measurement.reference import Reference
from ..model.structure import kv_geometry, scheme_blockers
from .files import COLUMNS, PartialRows, PartialWriter, open_partial, sweep_settings
from .methods import ESTIMATED
from .settings import SweepSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    """One row of sensitivity.csv before it is measured: what it is, what it saves, what it perturbs."""

    unit: str
    kind: str
    block: int
    group: str
    params: int
    bytes_saved: int
    kv_bytes_saved_per_token: int
    start_block: int  # where the candidate pass starts (0 for the whole-model rows, the sanity row included)
    perturbation: Perturbation


def plan_rows(
    student, scheme: Scheme, granularity: str = "unit", include_kv: bool = True, kv: KVCacheScheme = KVCacheScheme()
) -> list[Row]:
    """Every row the sweep will measure, in output order (block, then model order; model rows last)."""
    if granularity not in ("unit", "group"):
        raise FP8ProbeError(f"unknown granularity {granularity!r}; supported: unit, group")
    blocked = scheme_blockers(student.quantizable, scheme)  # shapes the scheme's kernels refuse: not swept
    units = [u for u in student.quantizable if u.group not in blocked]
    geo = kv_geometry(student.model.config)
    per_tok = geo.elements_per_token_layer  # BF16 -> FP8 KV saves one byte per element

    def fp8(names, kv_layers=()):
        return Perturbation(tuple(names), scheme, tuple(kv_layers), kv)

    rows: list[Row] = []
    if granularity == "unit":
        for u in units:
            rows.append(
                Row(u.name, u.kind, u.block, u.group, u.params, _bytes_saved(u, scheme), 0, u.block, fp8([u.name]))
            )
    else:
        for g, us in student.groups().items():
            if g in blocked:
                continue
            kind = "_".join(u.kind for u in us) if len(us) > 1 else us[0].kind
            kind = {"q_k_v": "qkv", "gate_up": "gate_up"}.get(kind, kind)
            rows.append(
                Row(
                    g,
                    kind,
                    us[0].block,
                    g,
                    sum(u.params for u in us),
                    sum(_bytes_saved(u, scheme) for u in us),
                    0,
                    us[0].block,
                    fp8([u.name for u in us]),
                )
            )
    if include_kv:
        for i in range(geo.num_layers):
            name = f"model.layers.{i}.self_attn.kv_cache"
            rows.append(Row(name, "kv", i, name, 0, 0, per_tok, i, fp8([], [i])))
    rows.sort(key=lambda r: r.block)  # stable: model order within a block, kv after the block's units
    all_units = [u.name for u in units]
    total_saved = sum(_bytes_saved(u, scheme) for u in units)
    total_params = sum(u.params for u in units)
    rows.append(Row("model.fp8_all", "model", -1, "model", total_params, total_saved, 0, 0, fp8(all_units)))
    if include_kv:
        rows.append(
            Row(
                "model.fp8_all_kv",
                "model",
                -1,
                "model",
                total_params,
                total_saved,
                geo.num_layers * per_tok,
                0,
                fp8(all_units, range(geo.num_layers)),
            )
        )
    rows.append(Row("model.reference", "model", -1, "model", 0, 0, 0, 0, fp8([])))
    return rows


def _bytes_saved(unit, scheme: Scheme) -> int:
    """BF16 (2 bytes) -> FP8 (1 byte) per weight, minus the BF16 scales the checkpoint adds."""
    shape = unit.shape
    mats = shape[0] if len(shape) == 3 else 1
    if unit.kind == "expert":  # gate_up [E, 2I, H] and down [E, H, I]
        e, two_i, h = shape
        scales = e * (num_scales((two_i, h), scheme.weight) + num_scales((h, two_i // 2), scheme.weight))
    else:
        scales = mats * num_scales(shape[-2:], scheme.weight)
    return unit.params - 2 * scales


def measure_row(reference: Reference, student, row: Row) -> Measured:
    """One planned row measured (measure.py's measurement in the simulation, from the row's start block): with its
    unit's SQNR; whole-model rows have none, but keep their per-token statistics for their intervals and the FP8 KV
    cache's paired effect (a unit row's are dropped: they would cross from a worker for nothing). Here or on a
    worker."""
    whole = row.kind == "model"
    stats, sqnr = perturbed_stats(reference, student, row.perturbation, row.start_block, sqnr=not whole)
    return Measured(summarize(stats), stats if whole else None, reference.prompt if whole else None, sqnr)


def _row_result(row: Row, metrics: dict, method: str = "exact", kl_fisher: float = float("nan")) -> dict:
    out = {
        "unit": row.unit,
        "kind": row.kind,
        "block": row.block,
        "group": row.group,
        "params": row.params,
        "bytes_saved": row.bytes_saved,
        "kv_bytes_saved_per_token": row.kv_bytes_saved_per_token,
        "method": method,
        "sqnr_db": metrics.pop("sqnr_db", float("nan")),
    }
    out.update(metrics)
    out["kl_fisher"] = kl_fisher
    return out


@dataclass
class Swept:
    """What sweep() returns: the `table` (COLUMNS, a row per plan row), the `reference` the exact rows were measured
    against (None for the estimate alone), the whole-model rows measured in this call with their per-token
    statistics (`model_rows`: unit -> measure.Measured; rows found in a resumed sweep's partial file are not among
    them), the `seconds` of each phase (reference, fisher, exact) and the static scales the passes ran with
    (`calibration`: the reference's or the estimate's, with each sequence's amax; None where nothing was calibrated)."""

    table: object  # pandas.DataFrame
    reference: Reference | None
    model_rows: dict
    seconds: dict
    calibration: object = None  # measurement.scales.Calibration


def sweep(
    bench: Bench,
    settings: SweepSettings = SweepSettings(method="exact"),
    *,
    partial: PartialRows | None = None,
    progress: bool = False,
    rows_executor=None,
) -> Swept:
    """Score every row of plan_rows() as `settings` say (what is measured: scheme, granularity, KV rows; how: the
    method and its knobs) on the bench (measurement/bench.py: the passes run in its batches, its seed draws the
    estimate's labels and auto's controls, its reference is the one the exact rows start from, made here with each
    sequence's amax where the bench holds none); returns a Swept (its `table` a pandas DataFrame with COLUMNS).

    With `partial` (files.PartialRows), each finished row is appended to its directory's sensitivity.partial.csv;
    with its `resume`, rows already there are not measured again (the settings must match). The fast estimate itself
    is not saved there: one pass, repeated on resume with the same seed. `rows_executor(reference, rows)`, when
    given, measures the exact rows elsewhere and yields (row, metrics) in any order (scaleout.RayRows); by default
    they are measured here, in plan order.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    scheme, kv, kind = settings.preset, settings.kv, settings.kind
    student, rollouts, batch_size, seed = bench.student, bench.rollouts, bench.batch_size, bench.seed
    granularity, include_kv = settings.granularity, settings.include_kv
    rows = plan_rows(student, scheme, granularity, include_kv, kv)
    done: dict[str, dict] = {}
    writer = None
    if partial is not None:
        resumed = sweep_settings(
            student, rollouts, scheme, granularity, include_kv, kv, batch_size, settings.recorded(seed)
        )
        done = open_partial(Path(partial.directory), resumed, partial.resume)
        writer = PartialWriter(Path(partial.directory), resumed)
    held = kind.reference or bench.holds_reference()  # a held reference's scales serve the estimate too
    reference = bench.reference(kv.strategy, per_sequence=True) if held else None
    seconds = {"reference": reference.seconds if reference is not None else 0.0}
    calibration = reference.calibration if reference is not None else None
    estimates: dict[str, float] = {}
    if kind.estimate:
        estimates, sqnr, seconds[kind.by], calibration = ESTIMATES[kind.by](
            student, rollouts, rows, settings, batch_size, reference, seed, progress
        )
    exact = kind.exact(rows, estimates, settings, seed)
    for row in rows:  # the others keep their estimate
        if row.unit not in exact and row.unit not in done:
            metrics = {m: float("nan") for m in METRICS}
            metrics.update(kl_q_p=estimates[row.unit], sqnr_db=sqnr[row.unit])
            done[row.unit] = _row_result(row, metrics, kind.by, estimates[row.unit])
            if writer:
                writer.append(done[row.unit])
    todo = [r for r in rows if r.unit not in done]
    model_rows: dict = {}
    t_exact = time.perf_counter()
    bar = tqdm(
        total=len(exact),
        initial=len(exact) - len(todo),
        desc="sweep",
        unit="row",
        disable=not progress or not todo,
        mininterval=bar_interval(),
    )
    measured = (
        rows_executor(reference, todo)
        if rows_executor is not None and todo
        else ((row, measure_row(reference, student, row)) for row in todo)
    )
    try:
        for row, m in measured:
            if row.unit in done:  # a re-run shard's row that already arrived: written once
                continue
            bar.set_postfix_str(row.unit[-32:], refresh=False)
            if m.stats is not None:  # a whole-model row's per-token statistics
                model_rows[row.unit] = m
            metrics = dict(m.metrics) | ({"sqnr_db": m.sqnr_db} if m.sqnr_db is not None else {})
            result = _row_result(row, metrics, "exact", estimates.get(row.unit, float("nan")))
            if row.unit == "model.reference" and not _at_zero(result):
                raise RuntimeError(
                    f"the reference against itself is not at the zero point: {result}; this is a bug in fp8probe"
                )
            done[row.unit] = result
            if writer:
                writer.append(result)
            bar.update(1)
    finally:
        bar.close()
        if writer:
            writer.close()
    seconds["exact"] = time.perf_counter() - t_exact
    table = pd.DataFrame([done[r.unit] for r in rows], columns=COLUMNS)
    return Swept(table, reference, model_rows, seconds, calibration)


def _fisher(student, rollouts, rows, settings, batch_size, reference, seed, progress):
    """Every row's Fisher estimate (measurement/fisher.py): (estimates, output SQNR, seconds, the static scales)."""
    fr = fisher_rows(
        student,
        rollouts,
        rows,
        Draws(settings.fisher_samples, seed),
        batch_size=batch_size,
        calibration=reference.calibration if reference is not None else None,
        fused=settings.granularity == "group",
        progress=progress,
    )
    return fr.column(DEFAULT_ESTIMATOR), fr.sqnr_db, fr.seconds, fr.calibration


# methods.MethodKind.by -> how its estimate is made: (estimates, output SQNR, seconds, the static scales)
ESTIMATES = {"fisher": _fisher}


SANITY_TOLERANCE = 1e-5  # the sanity row's largest excess: fp32 GEMMs on CPU can round differently by alignment


def _at_zero(result: dict) -> bool:
    """The sanity row is at every metric's zero point: exactly, or within fp32 rounding (SANITY_TOLERANCE), which
    the same GEMM on a differently aligned copy of an input can give; a broken prefix reuse gives 1e-3 and more."""
    return all(abs(result[k] - v) <= SANITY_TOLERANCE for k, v in no_mismatch().items())


def summary(df, intervals: dict | None = None) -> str:
    """The lines `fp8probe sweep` ends with: the ten most sensitive rows and the whole-model mismatch (with
    `intervals`, run.json's whole_model: each row's 90 % interval and the FP8 KV cache's paired effect)."""
    units = df[df["kind"] != "model"].sort_values("kl_q_p", ascending=False).head(10)
    cols = ["unit", "kind", "kl_q_p", "k3", "top1_agree", "sqnr_db"]
    title = "ten most sensitive rows (mean KL(q||p) per response token):"
    if (df["method"] != "exact").any():
        cols.insert(2, "method")
        words = {"fisher": "the fast estimate", "path": "the path attribution", "exact": "measured"}
        present = ", ".join(f"{m}: {w}" for m, w in words.items() if (df["method"] == m).any())
        title = f"ten most sensitive rows (mean KL(q||p) per response token; method {present}):"
    lines = ["", title, units[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}")]
    whole = df[df["kind"] == "model"].set_index("unit")
    for name in ("model.fp8_all", "model.fp8_all_kv"):
        if name in whole.index:
            r = whole.loc[name]
            if r.method in ESTIMATED:
                lines.append(f"{name}: kl_q_p={r.kl_q_p:.3g} (the fast estimate; `fp8probe measure` measures it)")
                continue
            iv = (intervals or {}).get(name)
            ci = f" [{iv['interval'][0]:.3g}, {iv['interval'][1]:.3g}]" if iv else ""
            lines.append(
                f"{name}: kl_q_p={r.kl_q_p:.3g}{ci} k3={r.k3:.3g} top1_agree={r.top1_agree:.4f} "
                f"token_mult_prob_error={r.token_mult_prob_error:.5f}"
            )
    base = (((intervals or {}).get("bf16_engine") or {}).get("own_samples") or {}).get("rollout_corr/kl")
    verl = (intervals or {}).get("verl_rollout") or {}
    named = [(n, ((intervals or {}).get(n) or {}).get("own_samples")) for n in ("model.fp8_all", "model.fp8_all_kv")]
    named.append((f"verl's rollout ({verl.get('scheme')}, KV {verl.get('kv')})", verl.get("own_samples")))
    if base is not None:
        lines.append(f"the BF16 engine alone ({BASELINE_ENGINE} profile), as verl logs it: rollout_corr/kl={base:.3g}")
    for name, own in named:
        if own:
            times = f" ({own['rollout_corr/kl'] / base:.3g}x the BF16 engine's)" if base else ""
            lines.append(
                f"{name} on its own samples, as verl logs it: rollout_corr/kl={own['rollout_corr/kl']:.3g}{times} "
                f"k3_kl={own['rollout_corr/k3_kl']:.3g} chi2_token={own['rollout_corr/chi2_token']:.3g} "
                f"rollout_probs_diff_mean={own['training/rollout_probs_diff_mean']:.3g} "
                f"pearson={own['training/rollout_actor_probs_pearson_corr']:.4f} "
                f"ppo_clip_share={own['ppo_clip_share']:.2%} pg_clipfrac={own['pg_clipfrac']:.2%}"
            )
    effect = (intervals or {}).get("kv_effect")
    if effect:
        lo, hi = effect["interval"]
        word = "raises" if lo > 0 else "lowers" if hi < 0 else "does not measurably change"
        lines.append(
            f"the FP8 KV cache on top of FP8 weights {word} kl_q_p: {effect['kl_q_p']:+.3g} [{lo:+.3g}, "
            f"{hi:+.3g}] (paired, 90 % over {effect['num_prompts']} prompts)"
        )
    return "\n".join(lines)


def whole_model_rows(bench: Bench, settings: SweepSettings, *, measured: dict | None = None) -> dict:
    """The whole-model rows of the settings' plan with their intervals: each one's kl_q_p with its 90 % interval over
    the prompts, and the FP8 KV cache's paired effect on top of FP8 weights (fp8_all_kv minus fp8_all on the same
    tokens, measurement.measure.Measured.change_from): whether adding the KV cache raises, lowers, or cannot be told to
    change the mismatch. run.json's `whole_model`. `measured`: the rows the sweep measured with their per-token
    statistics (Swept.model_rows); a row missing there (measured before a resume, or estimated) is measured here.
    With settings.verl_figures each row also gets `own_samples`: its prefix shift (measurement/prefix.py), the row's
    own continuations of the rollouts' prompts scored as `check` scores a configuration, verl's figures included
    (continued to the rollouts' own length, seed 0, in batches of 8, from the bench's reference)."""
    from ..measurement.measure import measure

    student = bench.student
    rows = [
        row
        for row in plan_rows(student, settings.preset, settings.granularity, settings.include_kv, settings.kv)
        if row.unit in ("model.fp8_all", "model.fp8_all_kv")
    ]
    measured = measured or {}
    got = {row.unit: measured[row.unit] if row.unit in measured else measure(bench, row.perturbation) for row in rows}
    out = {name: {"kl_q_p": m.metrics["kl_q_p"], "interval": list(m.interval("kl_q_p"))} for name, m in got.items()}
    if settings.verl_figures and rows:
        from ..measurement.prefix import PrefixShift

        own = Bench.around(bench.reference(), student, bench.rollouts)  # the rollouts' own length, seed 0
        shift = PrefixShift.sampled_as(own)
        for row in rows:
            out[row.unit]["own_samples"] = shift.measure(row.perturbation)
        out.update(verl_rollout_rows(own, settings.include_kv))
    if len(got) == 2:
        change, lo, hi = got["model.fp8_all_kv"].change_from(got["model.fp8_all"], "kl_q_p")
        out["kv_effect"] = {
            "kl_q_p": float(change),
            "interval": [float(lo), float(hi)],
            "num_prompts": got["model.fp8_all"].num_prompts,
        }
    return out


VERL_SCHEME = "FP8_BLOCK"  # verl's vLLM rollout re-quantizes every Linear in 128x128 blocks (deploy/frameworks/verl.py)
BASELINE_ENGINE = "vllm-cuda"  # the BF16 rollout engine whose own arithmetic a verl panel's BF16 baseline shows


def verl_rollout_rows(bench: Bench, kv: bool) -> dict:
    """What a verl panel shows for the configuration verl runs (`verl_rollout`: every Linear its FP8_BLOCK kernels take,
    128x128 blocks, with the FP8 KV cache at scale 1.0 where the sweep has one) and for the BF16 engine alone
    (`bf16_engine`: the engine profile's bf16 arithmetic with nothing quantized, the non-zero rollout_corr/kl every verl
    run logs), each on its own samples, so a figure reads as a multiple of the baseline. A model whose shapes the block
    kernels refuse everywhere gets the reason instead."""
    from dataclasses import replace

    from ..core.schemes import KVCacheScheme, Scheme
    from ..measurement.perturbation import Perturbation
    from ..measurement.prefix import PrefixShift
    from ..model.structure import fp8_fits

    student = bench.student
    scheme = Scheme.from_name(VERL_SCHEME)
    units = fp8_fits(student, scheme)
    out = {}
    base = PrefixShift.sampled_as(bench, engine=BASELINE_ENGINE)
    out["bf16_engine"] = {"engine": BASELINE_ENGINE, "own_samples": base.measure(Perturbation())}
    if not units:
        out["verl_rollout"] = {"scheme": VERL_SCHEME, "not_applied": "its 128x128 block kernels take none of the units"}
        return out
    layers = student.layers if kv else ()
    p = Perturbation(units=units, scheme=scheme, kv_layers=layers, kv=replace(KVCacheScheme(), scale="unit"))
    shift = PrefixShift.sampled_as(bench)
    out["verl_rollout"] = {
        "scheme": VERL_SCHEME,
        "units": len(units),
        "of_units": len(student.quantizable),
        "kv": "fp8 (scale 1.0)" if kv else None,
        "own_samples": shift.measure(p),
    }
    return out
