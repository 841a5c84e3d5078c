"""`run_sweep`: the sweep as one library call with typed settings, writing its run directory.

    DIR/rollouts.*, DIR/sensitivity.csv, DIR/run.json (sweeps/files.py), DIR/agreement.json (a fast sweep beside
    an exact one of the same rollouts: recipe/agreement.py)

Everything the settings and the model's config allow is checked before DIR exists; a sweep that would not fit in
memory is refused before loading; a killed sweep keeps its finished rows and resumes (`resume=True`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.artifacts import arithmetic
from ..core.errors import FP8ProbeError
from ..core.schemes import KV_CACHE_DTYPES, SCHEMES, KVCacheScheme, Scheme
from ..core.settings import Settings, opt
from ..model.settings import ModelSource, RolloutSettings
from ..sweeps.files import METHODS
from .inputs import check_inputs, load, rollouts_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepSettings(Settings):
    """What a sweep measures (`scheme`, a row per unit or fused `group`, KV-cache rows in `kv_cache_dtype` unless not
    `include_kv`), how (`method` exact | fisher | auto: `top_k`, `controls`, `fisher_samples`), compared with which
    exact sweep (`compare`, `agreement_budget`), and where the rows are measured (`workers` Ray actors, at
    `ray_address`, with `threads_per_worker` each)."""

    scheme: str = opt("FP8_DYNAMIC", f"FP8 scheme: {', '.join(SCHEMES)}")
    granularity: str = opt("unit", "a row per Linear (unit) or per fused group as vLLM loads it (group)",
                           choices=("unit", "group"))
    include_kv: bool = opt(True, "skip the per-layer FP8 KV-cache rows", flag="--no-kv")
    kv_cache_dtype: str = opt("fp8", f"KV rows in {', '.join(KV_CACHE_DTYPES)}")
    method: str = opt("exact", "exact: measure every row; fisher: estimate every row from one pass with backward "
                      "(fast); auto: estimate, then measure the top-k highest, controls others and the whole model",
                      choices=METHODS)
    top_k: int = opt(24, "method auto: rows measured exactly", low=0)
    controls: int = opt(8, "method auto: random other rows measured exactly, as a check", low=0)
    fisher_samples: int = opt(2, "label draws per position for the estimate, one backward each", low=1)
    compare: str | None = opt(None, "an exact sweep of the same rollouts: write agreement.json", metavar="EXACT_DIR")
    agreement_budget: float | None = opt(None, "kl_q_p budget of the agreement's recipes (default: half the "
                                         "whole-model FP8 mismatch)", low=0.0, metavar="X")
    workers: int = opt(1, "Ray workers measuring the rows, one replica each (pip install 'fp8probe[ray]')", low=1)
    ray_address: str | None = opt(None, "join this Ray cluster (left running) instead of starting a local one",
                                  metavar="ADDR")
    threads_per_worker: int | None = opt(None, "CPU threads per worker (default: cores / workers)", low=1,
                                         metavar="T")

    def __post_init__(self):
        super().__post_init__()
        Scheme.from_name(self.scheme)
        KVCacheScheme.from_name(self.kv_cache_dtype)
        if self.threads_per_worker is not None and self.workers == 1 and not self.ray_address:
            raise FP8ProbeError("`threads_per_worker` needs `workers` N (N > 1) or `ray_address`")

    @property
    def preset(self) -> Scheme:
        return Scheme.from_name(self.scheme)

    @property
    def kv(self) -> KVCacheScheme:
        return KVCacheScheme.from_name(self.kv_cache_dtype)

    def method_of(self, seed: int):
        """The sweep's Method (sweeps/sweep.py); its label draws and controls seeded with the rollouts' seed."""
        from ..sweeps.sweep import Method

        return Method(self.method, top_k=self.top_k, controls=self.controls, samples=self.fisher_samples, seed=seed)


@dataclass
class SweepResult:
    table: object  # pandas DataFrame, sensitivity.csv
    run: dict  # run.json
    agreement: dict | None
    directory: Path


def run_sweep(model: ModelSource, rollouts: RolloutSettings, settings: SweepSettings, out, resume: bool = False,
              progress: bool = False) -> SweepResult:
    """Sweep `model` on its rollouts as `settings` say and write the run directory `out` (see the module doc)."""
    from ..core.files import atomic_write_json, output_dir
    from ..recipe.agreement import AGREEMENT_FILE, agreement, check_comparable
    from ..sweeps.files import RUN_FILE, check_resume_state, finish_sweep, write_run, write_table
    from ..sweeps.sweep import sweep

    check_inputs(model, rollouts, out, settings.preset, partial=True)
    cluster = _cluster(model, settings)
    out = Path(out)
    check_resume_state(out, resume)
    if not resume and (out / RUN_FILE).exists():
        raise FP8ProbeError(f"{out} holds a finished sweep already; choose another `out` (or delete it first)")
    method = settings.method_of(rollouts.seed)
    exact_run = _exact_run(rollouts, settings) if method.name != "exact" else None
    _check_memory(model, rollouts, method.name, None)
    t0 = time.perf_counter()
    with output_dir(out, keep=("rollouts.safetensors", "rollouts.json")) as d:
        student, t_load = load(model)
        r, t_roll = rollouts_for(student, rollouts, d, reuse_from=d if resume else None, progress=progress)
        _check_memory(model, rollouts, method.name, r)
        if exact_run is not None:
            check_comparable(exact_run, settings.preset.name, settings.granularity, settings.include_kv,
                             settings.kv_cache_dtype, r)
        log.info("%s (%s, %s granularity%s)", {"exact": "reference pass and sweep", "fisher": "fast estimate",
                                               "auto": "reference pass, fast estimate, exact top rows"}[
            method.name], settings.preset.name, settings.granularity, ", KV rows" if settings.include_kv else "")
        t = time.perf_counter()
        kept: dict = {}
        with _row_workers(model, cluster) as executor:
            df = sweep(student, r, scheme=settings.preset, granularity=settings.granularity,
                       include_kv=settings.include_kv, kv=settings.kv, batch_size=rollouts.batch_size,
                       progress=progress, out_dir=d, resume=resume, method=method, rows_executor=executor,
                       keep=kept)
        reference = kept.get("reference")
        whole = (whole_model(reference, student, r, settings, rollouts.batch_size, kept.get("model_rows"))
                 if reference is not None else None)
        t_sweep = time.perf_counter() - t
        agree = None
        if exact_run is not None:
            log.info("agreement with the exact sweep in %s (two recipes, measured)", exact_run.directory)
            agree = agreement(df, exact_run.table, student, r, settings.preset.name, rollouts.batch_size,
                              budget=settings.agreement_budget)
            atomic_write_json(d / AGREEMENT_FILE, {**agree, "exact_sweep": str(exact_run.directory)})
        write_table(d, df)
        run = {"command": "sweep", "model": student.name, "model_path": student.path,
               "model_type": student.model_type, "scheme": settings.preset.name, "granularity": settings.granularity,
               "include_kv": settings.include_kv, "kv_cache_dtype": settings.kv_cache_dtype,
               "seed": r.meta.get("seed"), "method": method.settings(),
               "exact_rows": int((df["method"] == "exact").sum()),
               "workers": executor.stats if executor is not None else {"workers": 1},
               "device": model.device, "dtype": model.dtype, "batch_size": rollouts.batch_size,
               "arithmetic": arithmetic(rollouts.batch_size), "num_sequences": r.num_sequences, "num_tokens": int(r.attention_mask.sum()),
               "num_response_tokens": r.num_response_tokens, "rows": len(df), "whole_model": whole,
               "seconds": {"load": round(t_load, 3), "rollouts": round(t_roll, 3),
                           **{k: round(v, 3) for k, v in df.attrs["seconds"].items()},
                           "sweep": round(t_sweep, 3), "total": round(time.perf_counter() - t0, 3)}}
        write_run(d, run)
        finish_sweep(d)
    return SweepResult(df, run, agree, out)


def whole_model(reference, student, rollouts, settings: SweepSettings, batch_size: int = 8,
                measured: dict | None = None) -> dict:
    """The whole-model rows with their intervals: each one's kl_q_p with its 90 % interval over the prompts, and the
    FP8 KV cache's paired effect on top of FP8 weights (fp8_all_kv minus fp8_all on the same tokens,
    measurement.measure.paired_change): whether adding the KV cache raises, lowers, or cannot be told to change the
    mismatch. run.json's `whole_model`. `measured`: the rows the sweep measured with their per-token statistics
    (sweep's keep["model_rows"]); a row missing there (measured before a resume, or estimated) is measured here."""
    from ..measurement.measure import measure_with_interval, paired_change
    from ..sweeps.sweep import plan_rows

    rows = [row for row in plan_rows(student, settings.preset, settings.granularity, settings.include_kv,
                                     settings.kv) if row.unit in ("model.fp8_all", "model.fp8_all_kv")]
    measured = measured or {}
    got = {row.unit: measured[row.unit] if row.unit in measured else
           measure_with_interval(reference, student, rollouts, row.perturbation, "sim", batch_size) for row in rows}
    out = {name: {"kl_q_p": m.metrics["kl_q_p"], "interval": list(m.interval("kl_q_p"))} for name, m in got.items()}
    if len(got) == 2:
        change, lo, hi = paired_change(got["model.fp8_all_kv"], got["model.fp8_all"], "kl_q_p")
        out["kv_effect"] = {"kl_q_p": float(change), "interval": [float(lo), float(hi)],
                            "num_prompts": got["model.fp8_all"].num_prompts}
    return out


def _exact_run(rollouts: RolloutSettings, settings: SweepSettings):
    """The exact sweep a fast one is compared with: `compare` (refused when it measured something else), or the
    `rollouts` directory when it holds a finished exact sweep of the same settings (else they are only reused)."""
    from ..recipe.agreement import settings_differ
    from ..sweeps.files import RUN_FILE, read_sweep

    if settings.compare:
        return read_sweep(settings.compare)
    if rollouts.rollouts and (Path(rollouts.rollouts) / RUN_FILE).exists():
        run = read_sweep(rollouts.rollouts)
        why = settings_differ(run, settings.preset.name, settings.granularity, settings.include_kv,
                              settings.kv_cache_dtype)
        if why is None:
            return run
        log.info("not compared with the sweep in %s: %s", rollouts.rollouts, why)
    return None


def _check_memory(model: ModelSource, rollouts: RolloutSettings, method: str, saved) -> None:
    """Refuse a sweep that would not fit in memory, before loading (sized from the settings, prompts of up to 256
    tokens) and again once the rollouts are known."""
    from ..model.devices import parse_dtype
    from ..model.rollouts import load_rollouts
    from ..sweeps.memory import check_fits, estimate

    if saved is None and rollouts.rollouts:
        saved = load_rollouts(rollouts.rollouts)
    if saved is not None:
        n, t, m = saved.num_sequences, saved.input_ids.shape[1], saved.num_response_tokens
    else:
        n, t = rollouts.num_prompts * rollouts.samples_per_prompt, 256 + rollouts.max_new_tokens
        m = n * rollouts.max_new_tokens
    nbytes = parse_dtype(model.dtype).itemsize
    check_fits(estimate(model.config(), nbytes, method, rollouts.batch_size, n, t, m), model.device)


def _cluster(model: ModelSource, settings: SweepSettings):
    """The Ray workers a sweep asked for (None: this process alone), checked before any output exists."""
    if settings.workers == 1 and not settings.ray_address:
        return None
    from ..sweeps.scaleout import Cluster, check_address, require_ray

    require_ray()
    check_address(settings.ray_address)
    if model.device == "auto":
        raise FP8ProbeError("`workers` with `device` auto: each worker holds its own replica; use `device` cuda "
                            "(one GPU per worker)")
    return Cluster(settings.workers, settings.ray_address, settings.threads_per_worker,
                   gpus=model.device.startswith("cuda"))


@contextlib.contextmanager
def _row_workers(model: ModelSource, cluster):
    if cluster is None:
        yield None
        return
    from ..sweeps.scaleout import RayRows, ray_session

    load_kw = {"name_or_path": model.model, "device": "cuda" if cluster.gpus else model.device, "dtype": model.dtype,
               "trust_remote_code": model.trust_remote_code, "allow_pickle": model.allow_pickle}
    log.info("rows measured by %d Ray worker(s)%s", cluster.workers,
             f" on the cluster at {cluster.address}" if cluster.address else
             f" ({cluster.threads_per_worker()} CPU threads each)" if not cluster.gpus else " (one GPU each)")
    with ray_session(cluster):
        executor = RayRows(cluster, load_kw)
        try:
            yield executor
        finally:
            executor.close()


def describe(res: SweepResult, seconds: float) -> str:
    """What `fp8probe sweep` prints: the ten most sensitive rows, the whole model, the agreement, one summary line."""
    from ..recipe.agreement import describe as agreement_line
    from ..sweeps.sweep import summary

    lines = [summary(res.table, res.run.get("whole_model"))] + ([agreement_line(res.agreement)] if res.agreement is not None else [])
    return "\n".join(lines + [f"sweep: {len(res.table)} rows in {seconds:.0f} s -> {res.directory / 'sensitivity.csv'}"])
