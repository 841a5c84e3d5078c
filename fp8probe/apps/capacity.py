"""`run_capacity` and `run_budget`: the two commands that read configs and tables only (no student is loaded)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import FP8ProbeError
from ..core.settings import Settings, opt
from ..deploy.serving import KV_DTYPE_BYTES


@dataclass(frozen=True)
class CapacitySettings(Settings):
    """The candidate beside BF16 with an auto KV cache: a `recipe`'s FP8 units (else every unit in `scheme`) and the
    KV cache in `kv_cache_dtype`."""

    recipe: str | None = opt(None, "recipe.yaml written by `fp8probe recipe` (default: every unit in the scheme)")
    scheme: str = opt("FP8_DYNAMIC", "whole-model scheme when no recipe")
    kv_cache_dtype: str = opt("fp8", "the candidate's KV-cache dtype (the baseline is always auto)",
                              choices=KV_DTYPE_BYTES)


@dataclass(frozen=True)
class BudgetSettings(Settings):
    """How a budget is read off a runs table: the relative quality loss accepted, the bootstrap behind its interval,
    and which objective's runs (a table with several)."""

    tolerance: float = opt(0.02, "largest relative quality loss accepted (your choice)", low=0.0)
    bootstrap: int = opt(1000, "bootstrap resamples for the interval", low=0)
    seed: int = opt(0, "seed of the resamples", low=0)
    objective: str | None = opt(None, "the objective whose runs to fit (a table with several: opd, grpo, grpo-is)")


def run_capacity(model: str | None, settings: CapacitySettings, serving, out=None, plot: bool = False,
                 trust_remote_code: bool = False, allow_pickle: bool = False) -> dict:
    """KV-cache capacity, BF16 vs the recipe (or every unit in `scheme`), by vLLM's accounting, from the config alone
    (deploy/capacity.py); with `out`, DIR/capacity.json (and DIR/capacity.png with `plot`)."""
    from ..core.files import atomic_write_json, check_writable, output_dir
    from ..deploy.capacity import capacity
    from ..model.structure import list_units, meta_model
    from ..model.student import load_config
    from ..recipe.recipe import Recipe, read_recipe

    if plot and not out:
        raise FP8ProbeError("`plot` needs `out` DIR")
    if out:
        check_writable(out)
    cfg = load_config(model, trust_remote_code, allow_pickle)
    units = list_units(meta_model(cfg))
    if settings.recipe:
        rec = read_recipe(settings.recipe)
        rec.check_model(units, settings.recipe)
    else:
        rec = Recipe.whole_model(units, settings.scheme)
    rep = capacity(cfg, rec, kv_cache_dtype=settings.kv_cache_dtype, serving=serving)
    rep["model"] = model or "smollm2-135m"
    rep["recipe"] = settings.recipe
    if out:
        with output_dir(out) as d:
            atomic_write_json(d / "capacity.json", rep)
            if plot:
                from ..plots import capacity_bars

                capacity_bars(rep, d / "capacity.png")
    return rep


def run_budget(runs, out, settings: BudgetSettings = BudgetSettings()):
    """The budget fitted to a runs table (recipe/budget.py), written as DIR/budget.json and DIR/budget.png."""
    from ..core.files import atomic_write_json, check_writable, output_dir
    from ..plots import budget_fit
    from ..recipe.budget import fit_budget

    check_writable(out)
    b = fit_budget(runs, tolerance=settings.tolerance, bootstrap=settings.bootstrap, seed=settings.seed,
                   objective=settings.objective)
    with output_dir(out) as d:
        atomic_write_json(d / "budget.json", b.to_json())
        budget_fit(b, d / "budget.png")
    return b


def describe_budget(b, out) -> str:
    lo, hi = b.interval or (float("nan"), float("nan"))
    spread = f"; the seeds alone spread {b.seed_spread:.1%}" if b.seed_spread is not None else ""
    return (f"budget: {b.metric} <= {b.value:.4g} (90 % {'paired ' if b.paired else ''}bootstrap interval {lo:.4g} .. "
            f"{hi:.4g}) at a relative quality loss <= {b.tolerance:g}{spread}, from {len(b.runs)} runs -> "
            f"{out}/budget.json")
