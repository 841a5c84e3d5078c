"""`run_recipe`: the FP8 recipe of a finished sweep under a mismatch budget or a memory target, measured on the
sweep's own rollouts, written as DIR/recipe.yaml (llm-compressor's format) and DIR/recipe.json."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS
from ..core.results import Result
from ..core.schemes import KV_CACHE_SCHEMES
from ..core.settings import Settings, opt
from ..deploy.frameworks import TARGETS
from ..recipe.context import COSTS
from ..recipe.forms import FORMS, check_request
from ..recipe.refine import DEFAULT_REFINE_PASSES, default_passes

GOALS = ("budget", "min_bytes_saved", "effective_bits", "fp8_share")  # exactly one: a budget, or a memory target


@dataclass(frozen=True)
class RecipeSettings(Settings):
    """Exactly one goal, `budget` or a memory target (`min_bytes_saved`, `effective_bits`, `fp8_share`); the
    constraints on what is searched; how groups are priced and ranked; the refinement and the held-out report."""

    budget: float | None = opt(None, "largest allowed measured mismatch (the recipe saves the most bytes within it)",
                               low=0.0, group="goal", required=True)
    min_bytes_saved: int | None = opt(None, "instead of a budget: save at least this many weight bytes, with the "
                                      "least mismatch", low=0, group="goal", metavar="BYTES")
    effective_bits: float | None = opt(None, "instead: at most B bits per weight of every Linear, lm_head included "
                                       "(BF16 16, FP8 8; as ModelOpt's auto_quantize counts)", low=8.0, high=16.0,
                                       group="goal", metavar="B")
    fp8_share: float | None = opt(None, "instead: at least this fraction of every Linear's weights in FP8", low=0.0,
                                  high=1.0, group="goal", metavar="F")
    metric: str = opt("kl_q_p", f"the metric the budget bounds: {', '.join(METRICS)}", choices=METRICS,
                      metavar="METRIC")
    kv_cache_dtype: str | None = opt(None, "also put the KV cache in FP8, as vLLM's --kv-cache-dtype names it; "
                                     "written as llm-compressor's kv_cache_scheme with calibrated k/v scales, and "
                                     "counted in the budget", choices=KV_CACHE_SCHEMES,
                                     aliases=("--kv-cache-scheme",))
    keep_first: int = opt(0, "keep the first N blocks in BF16", low=0)
    keep_last: int = opt(0, "keep the last N blocks in BF16", low=0)
    keep: tuple[str, ...] = opt((), "units or groups to keep in BF16")
    force: tuple[str, ...] = opt((), "units or groups to put in FP8 regardless")
    form: str | None = opt(None, "the recipes searched: free (default), keywords, first-last, all (every Linear), "
                           "none (FP8 KV cache only)", choices=FORMS)
    target: str | None = opt(None, "a rollout framework: its form, FP8 scheme and KV-cache scales (see `fp8probe "
                             "export`)", choices=lambda: TARGETS)
    costs: str = opt("single", "how groups are priced: single (the sweep's rows), or with the rest of the recipe the "
                     "rows choose in FP8: context (a measured pass per group), path (path attributions)", choices=COSTS)
    damage_model: int = opt(0, "rank and predict by a damage model fitted on N measured random recipes (0: off)",
                            low=0, metavar="N")
    refine: int | None = opt(None, f"measured passes refining a free recipe (0: off; default {DEFAULT_REFINE_PASSES} "
                             "under a budget, 0 under a memory target)", low=0, metavar="PASSES")
    engine: str = opt("vllm-cuda", "also report the recipe's figure as this rollout engine computes it (the search "
                      "and budgets use the simulation; none: off)", choices=("vllm-cuda", "vllm-cpu", "none"))
    holdout: int = opt(2, "select on one set, report on another: every k-th prompt of the rollouts is held out and "
                       "the recipe's measured mismatch is its value there, with its interval (0: search and report "
                       "on all the rollouts)", low=0, metavar="K")

    def __post_init__(self):
        super().__post_init__()
        goals = [g for g in GOALS if getattr(self, g) is not None]
        if len(goals) != 1:
            raise FP8ProbeError("give exactly one of " + ", ".join(f"`{g}`" for g in GOALS))
        if self.holdout == 1:
            raise FP8ProbeError("`holdout` 1 would hold out every prompt: use k >= 2, or 0 for no split")
        check_request(self.form or "free", self.kv_cache_dtype, self.keep, self.force, self.keep_first,
                      self.keep_last, self.costs, self.damage_model)

    @property
    def refine_passes(self) -> int:
        """The refinement's measured passes: as given, or the goal's default (recipe.refine.default_passes)."""
        return self.refine if self.refine is not None else default_passes(self.memory is not None)

    @property
    def memory(self):
        """The memory target (recipe.selection.MemoryTarget), or None with a budget."""
        from ..recipe.selection import MemoryTarget

        kind = next((k for k in GOALS[1:] if getattr(self, k) is not None), None)
        return MemoryTarget(kind.replace("min_", ""), getattr(self, kind)) if kind else None


def run_recipe(sweep_dir, settings: RecipeSettings, out, device: str = "cpu", trust_remote_code: bool = False,
               allow_pickle: bool = False) -> RecipeResult:
    """The recipe of `sweep_dir` (its table, rollouts and model) as `settings` say, written into `out`."""
    from ..core.files import check_writable, output_dir
    from ..deploy.frameworks import recipe_form
    from ..model.rollouts import load_rollouts
    from ..model.student import load_student
    from ..recipe.selection import make_recipe
    from ..sweeps.files import read_sweep

    run = read_sweep(sweep_dir)
    target = TARGETS[settings.target] if settings.target else None
    form, scheme, kv_scale = recipe_form(target, settings.form, settings.kv_cache_dtype, run.run["scheme"], sweep_dir)
    rollouts = load_rollouts(sweep_dir)
    check_writable(out)
    t0 = time.perf_counter()
    student = load_student(run.model_source, device=device, dtype=run.run.get("dtype", "float32"),
                           trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
    run.check_student(student)
    rollouts.check_fits(student.model.config, f"the rollouts of {sweep_dir}")
    try:
        recipe = make_recipe(run.table, settings.budget, student, rollouts, scheme=scheme, metric=settings.metric,
                             kv_cache_dtype=settings.kv_cache_dtype, keep_first=settings.keep_first,
                             keep_last=settings.keep_last, keep=settings.keep, force=settings.force,
                             batch_size=run.run["batch_size"], sweep_dir=str(run.directory.resolve()), form=form,
                             kv_scale=kv_scale, target=target.name if target else None, memory=settings.memory,
                             refine_passes=settings.refine_passes, holdout=settings.holdout, costs=settings.costs,
                             engine=None if settings.engine == "none" else settings.engine,
                             damage_recipes=settings.damage_model)
    except FP8ProbeError as e:
        if target is None:
            raise
        raise FP8ProbeError(f"{target.title}: {e}") from e
    with output_dir(out) as d:
        recipe.write(d)
    return RecipeResult(Path(out), recipe, settings, time.perf_counter() - t0)


@dataclass(frozen=True)
class RecipeResult(Result):
    recipe: object  # recipe.recipe.Recipe: recipe.yaml, recipe.json
    settings: RecipeSettings
    search_seconds: float  # loading the student and the search

    def describe(self, seconds: float) -> str:
        """The line `fp8probe recipe` ends with: what it chose, predicted and measured (on the search set, and on the
        held-out prompts with its interval), what it saves, in how long (loading the student and the search)."""
        r, s, m, out, searched = self.recipe, self.settings, self.settings.memory, self.out, self.search_seconds
        goal = f"<= budget {s.budget}" if s.budget is not None else f"(memory target {m.kind} {m.given})"
        if r.split:
            lo, hi = r.measured_interval
            measured = (f"measured {r.measured_search:.4g} on the search set ({r.split['search_prompts']} prompts) "
                        f"{goal}, {r.measured:.4g} [{lo:.4g}, {hi:.4g}] on the {r.split['heldout_prompts']} held out")
        else:
            measured = f"measured {r.measured:.4g} {goal}"
        e = r.measured_engine
        if e and e.get("measured") is not None:
            measured += "; as {} computes it {:.4g} [{:.4g}, {:.4g}]".format(e["engine"], e["measured"], *e["interval"])
        return (f"recipe{f' for {s.target}' if s.target else ''} (form {r.form}): {len(r.quantized)}/"
                f"{len(r.quantized) + len(r.kept)} fused groups in {r.scheme}"
                f"{' + FP8 KV cache' if r.kv_cache_dtype else ''}; "
                f"{s.metric} predicted {r.predicted:.4g}, {measured}; {r.bytes_saved / 2**20:.1f} MiB saved, "
                f"{r.effective_bits:.2f} effective bits; {len(r.search)} measured passes in {searched:.0f} s -> "
                f"{Path(out) / 'recipe.yaml'}")
