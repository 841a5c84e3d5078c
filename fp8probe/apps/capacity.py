"""`fp8probe capacity`: KV-cache capacity by vLLM's accounting, from the config alone (no student is loaded)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.files import check_writable, output_dir
from ..core.records import CapacityRecord
from ..core.results import Result
from ..deploy.serving import CapacitySettings


def run_capacity(
    model: str | None,
    settings: CapacitySettings,
    serving,
    out=None,
    plot: bool = False,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> CapacityResult:
    """KV-cache capacity, BF16 vs the recipe (or every unit in `scheme`), by vLLM's accounting, from the config alone
    (deploy/capacity.py); with `out`, DIR/capacity.json (and DIR/capacity.png with `plot`)."""
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
    rep = replace(rep, model=model or "smollm2-135m", recipe=settings.recipe)
    if out:
        with output_dir(out) as d:
            rep.write(d / CapacityRecord.KIND)
            if plot:
                from ..plots import capacity_bars

                capacity_bars(rep, d / "capacity.png")
    return CapacityResult(Path(out) if out else None, rep)


@dataclass(frozen=True)
class CapacityResult(Result):
    report: CapacityRecord  # capacity.json

    def describe(self, seconds: float) -> str:
        """What `fp8probe capacity` prints: the report, and where it was written."""
        from ..deploy.capacity import format_report

        return format_report(self.report) + (f"\ncapacity: -> {self.out}/capacity.json" if self.out else "")
