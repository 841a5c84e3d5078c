"""`run_recipe`: the FP8 recipe of a finished sweep under a mismatch budget or a memory target, measured on the
sweep's own rollouts, written as DIR/recipe.yaml (llm-compressor's format) and DIR/recipe.json."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.files import check_writable, output_dir
from ..core.results import Result
from ..deploy.frameworks import TargetSettings
from ..recipe.settings import RecipeContext, RecipeSettings

__all__ = ["run_recipe", "RecipeResult", "RecipeSettings", "TargetSettings"]


def run_recipe(
    sweep_dir,
    settings: RecipeSettings,
    out,
    device: str = "cpu",
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    target: TargetSettings = TargetSettings(),
) -> RecipeResult:
    """The recipe of `sweep_dir` (its table, rollouts and model) as `settings` say, for `target`'s framework (its form,
    scheme and KV scales, resolved here: above the recipe layer), written into `out`."""
    from ..deploy.frameworks import recipe_form
    from ..measurement.bench import Bench
    from ..model.rollouts import load_rollouts
    from ..model.student import load_student
    from ..recipe.selection import make_recipe
    from ..sweeps.files import read_sweep

    run, framework = read_sweep(sweep_dir), target.chosen
    form, scheme, kv_scale = recipe_form(framework, settings.form, settings.kv_cache_dtype, run.run.scheme, sweep_dir)
    try:
        settings = replace(settings, form=form)  # the target's form, checked against the rest of the settings
    except FP8ProbeError as e:
        raise FP8ProbeError(f"{framework.title}: {e}") from e
    rollouts = load_rollouts(sweep_dir)
    context = RecipeContext(
        scheme=scheme,
        sweep_dir=str(run.directory.resolve()),
        kv_scale=kv_scale,
        target=framework.name if framework else None,
        scales=run.sequence_scales(rollouts),
    )
    check_writable(out)
    t0 = time.perf_counter()
    student = load_student(
        run.model_source,
        device=device,
        dtype=run.run.dtype or "float32",
        trust_remote_code=trust_remote_code,
        allow_pickle=allow_pickle,
    )
    run.check_student(student)
    rollouts.check_fits(student.model.config, f"the rollouts of {sweep_dir}")
    try:
        recipe = make_recipe(run.table, Bench(student, rollouts, run.run.batch_size), settings, context=context)
    except FP8ProbeError as e:
        if framework is None:
            raise
        raise FP8ProbeError(f"{framework.title}: {e}") from e
    capacity = kv_map_capacity(student.model.config, recipe)
    with output_dir(out) as d:
        recipe.write(d)
    return RecipeResult(Path(out), recipe, settings, time.perf_counter() - t0, context.target, capacity)


def kv_map_capacity(cfg, recipe, kv_memory: int = 8 * 2**30) -> tuple[float, int] | None:
    """A KV map's (KV tokens over BF16's in the same memory as vLLM lays them out: deploy/capacity.py, its grouping
    beside sliding-window layers included, which bytes do not see; max_model_len: the recipe's context), or None."""
    if not recipe.kv_skip_layers:
        return None
    from ..deploy.capacity import capacity
    from ..deploy.serving import Serving

    rec = capacity(cfg, recipe, "fp8", Serving(kv_cache_memory=kv_memory, max_model_len=recipe.kv_context))
    return rec.ratio_kv_tokens, rec.max_model_len


@dataclass(frozen=True)
class RecipeResult(Result):
    recipe: object  # recipe.recipe.Recipe: recipe.yaml, recipe.json
    settings: RecipeSettings
    search_seconds: float  # loading the student and the search
    target: str | None = None  # the rollout framework it was made for
    kv_capacity: tuple | None = None  # a KV map's (KV tokens over BF16's by vLLM's accounting, max_model_len)

    def describe(self, seconds: float) -> str:
        """The line `fp8probe recipe` ends with: what it chose, predicted and measured (on the search set, and on the
        held-out prompts with its interval), what it saves, in how long (loading the student and the search)."""
        r, s, m, out, searched = self.recipe, self.settings, self.settings.memory, self.out, self.search_seconds
        goal = f"<= budget {s.budget}" if s.budget is not None else f"(memory target {m.kind} {m.given})"
        if r.split:
            lo, hi = r.measured_interval
            searched_as = (
                f"measured {r.measured_search:.4g} on the search set ({r.split['search_prompts']} prompts) {goal}"
                if r.measured_search is not None
                else f"chosen by rank {goal}, unmeasured on the search set"
            )
            measured = (
                f"{searched_as}, {r.measured:.4g} [{lo:.4g}, {hi:.4g}] on the {r.split['heldout_prompts']} held out"
            )
        else:
            measured = f"measured {r.measured:.4g} {goal}"
        e = r.measured_engine
        if e and e.get("measured") is not None:
            measured += "; as {} computes it {:.4g} [{:.4g}, {:.4g}]".format(e["engine"], e["measured"], *e["interval"])
        return (
            f"recipe{f' for {self.target}' if self.target else ''} (form {r.form}): {len(r.quantized)}/"
            f"{len(r.quantized) + len(r.kept)} fused groups in {r.scheme}"
            f"{_kv_words(r, self.kv_capacity)}; "
            f"{s.metric} predicted {r.predicted:.4g}, {measured}; {r.bytes_saved / 2**20:.1f} MiB saved, "
            f"{r.effective_bits:.2f} effective bits; {len(r.search)} measured passes in {searched:.0f} s -> "
            f"{Path(out) / 'recipe.yaml'}"
        )


def _kv_words(r, capacity: tuple | None) -> str:
    """The KV cache's part of the recipe's line: in every layer, or per layer with the layers kept BF16 and why (their
    measured mismatch per byte saved at the workload ranked them last)."""
    if not r.kv_cache_dtype:
        return ""
    if not r.kv_skip_layers:
        return " + FP8 KV cache"
    kept = sorted(
        (k for k in r.kept_scores if k["group"].endswith(".kv_cache")), key=lambda k: -k["score"] / k["bytes_saved"]
    )
    why = ", ".join(
        f"{k['group'].split('.')[2]} ({r.metric} {k['score']:.3g}{', kept as asked' if k['reason'] == 'keep' else ''})"
        for k in kept[:4]
    )
    more = f" and {len(kept) - 4} more" if len(kept) > 4 else ""
    return (
        f" + FP8 KV cache in all but {len(r.kv_skip_layers)} layers at {r.kv_tokens:,} tokens in flight"
        f"{f' ({r.kv_context:,} a sequence)' if r.kv_context else ''} (BF16, their "
        f"KV rows' mismatch per byte the highest: layer {why}{more})"
        + (
            f"; by vLLM's accounting {capacity[0]:.2f}x the KV tokens of BF16 (max_model_len {capacity[1]:,})"
            if capacity
            else ""
        )
    )
