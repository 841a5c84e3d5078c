"""How far the fast estimate agrees with the exact sweep on the user's own model: agreement.json.

Written by a `--method fisher` or `--method auto` sweep whenever an exact sweep of the same rollouts exists
(`--rollouts EXACT_DIR` or `--compare EXACT_DIR`):

    rows              unit / group / KV rows scored by both
    spearman          Spearman's ρ between the fast estimate (kl_fisher) and the exact kl_q_p
    top10_overlap     how many of the fast estimate's ten most sensitive rows are among the exact ten
    scale             median of estimate / exact over the rows (1.0: the same numbers, not just the same order)
    recipes           under one budget on kl_q_p, the recipe chosen from each table (no refinement), both
                      measured: whether they are the same, their measured kl_q_p and the bytes they save

The budget defaults to half the exact whole-model FP8 mismatch (model.fp8_all), so that the choice is
neither everything nor nothing on any model.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.records import AgreementRecord
from ..core.stats import spearman, top_overlap
from ..sweeps.methods import ESTIMATED
from ..sweeps.settings import SweepSettings

log = logging.getLogger(__name__)

AGREEMENT_FILE = AgreementRecord.KIND


def settings_differ(exact_run, settings: SweepSettings) -> str | None:
    """Why an exact sweep cannot be compared with one of `settings` (None when it can, rollouts aside)."""
    r = exact_run.run
    if (exact_run.table["method"] != "exact").any():
        return "that sweep is not exact (run with `method` exact)"
    theirs = (r.scheme, r.granularity, r.include_kv, r.kv_cache_dtype)
    ours = (settings.preset.name.upper(), settings.granularity, settings.include_kv, settings.kv_cache_dtype)
    if theirs != ours:
        return (
            f"it swept scheme/granularity/KV rows/KV dtype {theirs}, this sweep {ours}; compare sweeps with the "
            "same settings"
        )
    return None


def check_comparable(exact_run, settings: SweepSettings, rollouts, same_file: str | None = None) -> None:
    """Refuse an exact sweep that measured something else than this one, or other rollouts (not read again when
    `rollouts` were read from the exact sweep's own directory, `same_file`)."""
    import torch

    from ..model.rollouts import load_rollouts

    why = settings_differ(exact_run, settings)
    if why:
        raise FP8ProbeError(f"`compare` {exact_run.directory}: {why}")
    if same_file is not None and Path(same_file).resolve() == Path(exact_run.directory).resolve():
        return
    other = load_rollouts(exact_run.directory)
    same = all(
        torch.equal(getattr(other, t), getattr(rollouts, t)) for t in ("input_ids", "attention_mask", "response_mask")
    )
    if not same:
        raise FP8ProbeError(
            f"`compare` {exact_run.directory}: its rollouts differ from this sweep's; pass "
            f"`rollouts` {exact_run.directory} so that both score the same tokens"
        )


def agreement(fast_df, exact_df, bench, settings: SweepSettings) -> AgreementRecord:
    """The figures of agreement.json (see the module docstring): the fast sweep's settings give the scheme and the
    recipes' budget (`agreement_budget`; default half the whole-model FP8 mismatch); both recipes are measured on the
    bench (measurement/bench.py)."""
    from .selection import make_recipe
    from .settings import RecipeContext, RecipeSettings

    scheme, budget = settings.preset.name, settings.agreement_budget
    exact = exact_df.set_index("unit")
    fast = fast_df.set_index("unit")
    # the rows the fast sweep estimated (a path sweep, benchmarks/path_sweep.py, keeps measured KV rows: no estimate)
    units = [
        u
        for u in fast.index
        if fast.loc[u, "kind"] != "model"
        and u in exact.index
        and (fast.loc[u, "method"] in ESTIMATED or not math.isnan(float(fast.loc[u, "kl_fisher"])))
    ]
    est = {u: float(fast.loc[u, "kl_fisher"]) for u in units}
    ex = {u: float(exact.loc[u, "kl_q_p"]) for u in units}
    if not units or any(math.isnan(v) for v in est.values()):
        raise FP8ProbeError("the fast table has no estimate for every row it shares with the exact sweep")
    ratios = sorted(est[u] / ex[u] for u in units if ex[u] > 0)
    whole = float(exact.loc["model.fp8_all", "kl_q_p"])
    if budget is None:
        budget = whole / 2
    # the plain prefix search on either table, measured on the same rollouts (no refinement, split or engine figure)
    ask = RecipeSettings(budget=budget, refine=0, holdout=0, engine="none")
    context, recipes = RecipeContext(scheme=scheme), {}
    for name, table in (("exact", exact_df), ("fast", fast_df)):
        try:
            r = make_recipe(table, bench, ask, context=context)
            recipes[name] = {
                "fp8_groups": len(r.quantized),
                "measured_kl_q_p": r.measured,
                "predicted_kl_q_p": r.predicted,
                "bytes_saved": r.bytes_saved,
                "quantized": sorted(r.quantized),
            }
        except FP8ProbeError as e:  # e.g. nothing fits the budget: say so instead of failing the sweep
            recipes[name] = {"error": str(e)}
    same = "quantized" in recipes["exact"] and recipes["exact"].get("quantized") == recipes["fast"].get("quantized")
    return AgreementRecord(
        rows=len(units),
        spearman=spearman([est[u] for u in units], [ex[u] for u in units]),
        top10_overlap=top_overlap(est, ex, 10),
        scale=ratios[len(ratios) // 2] if ratios else float("nan"),
        budget={"metric": "kl_q_p", "value": budget, "whole_model_exact": whole},
        recipes={**recipes, "same": bool(same)},
    )


def describe(a: AgreementRecord) -> str:
    """The line a sweep prints about its agreement with the exact sweep."""
    rec = a.recipes
    line = (
        f"agreement with the exact sweep over {a.rows} rows: Spearman {a.spearman:.3f}, top-10 overlap "
        f"{a.top10_overlap}/10, estimate/exact median {a.scale:.2f}"
    )
    if "measured_kl_q_p" in rec["exact"] and "measured_kl_q_p" in rec["fast"]:
        line += (
            f"; recipes at kl_q_p <= {a.budget['value']:.3g}: {'the same' if rec['same'] else 'different'} "
            f"({rec['fast']['fp8_groups']} vs {rec['exact']['fp8_groups']} groups in FP8, measured "
            f"{rec['fast']['measured_kl_q_p']:.3g} vs {rec['exact']['measured_kl_q_p']:.3g})"
        )
    return line


def exact_run_for(rollouts_dir: str | None, settings: SweepSettings):
    """The exact sweep a fast one of `settings` is compared with: its `compare` (refused when it measured something
    else), or the `rollouts_dir` when it holds a finished exact sweep of the same settings (else its rollouts are only
    reused)."""
    from ..sweeps.files import RUN_FILE, read_sweep

    if settings.compare:
        return read_sweep(settings.compare)
    if rollouts_dir and (Path(rollouts_dir) / RUN_FILE).exists():
        run = read_sweep(rollouts_dir)
        why = settings_differ(run, settings)
        if why is None:
            return run
        log.info("not compared with the sweep in %s: %s", rollouts_dir, why)
    return None
