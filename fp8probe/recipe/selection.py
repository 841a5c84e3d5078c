"""Choosing a recipe: from a sensitivity table to the FP8 recipe that saves the most under a mismatch budget.

Selection works on whole fused groups (q/k/v together, gate/up together, all experts of a layer), the only
splits vLLM can load:

1. score each group from the sweep: the sum of its units' excess mismatch (metrics.excess: the distance
   from the metric's zero point in the worse direction) when the sweep was per unit, and rank groups by
   score per byte saved, cheapest first;
2. predict a recipe's mismatch as the sum of its groups' scores (per-unit scores do not add up exactly);
3. measure real combinations with the hooks and bisect over the ranked list for the longest prefix whose
   *measured* mismatch stays within the budget: a handful of measured passes, not one per group.

Forms (forms.FORMS, a registry of Form) restrict the candidates to what a rollout framework can apply: "free" and
"keywords" rank every group; "first-last" takes, for each number of FP8 blocks, the split (first N, last M
blocks BF16) whose FP8 middle scores least, and bisects over that count; "all" is one candidate (every
group), "none" none (the FP8 KV cache alone). Groups whose shapes the scheme cannot take
(student.scheme_blockers) are never candidates. The KV cache is measured as the engine scales it:
calibrated scales (a checkpoint) or 1.0 (engines that quantize online).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS, excess
from ..core.metrics import metric as metric_info
from ..core.metrics import no_mismatch
from ..core.schemes import VLLM_VERSION, KVCacheScheme, Scheme
from ..measurement.bench import Bench
from ..measurement.measure import Measured, measure
from ..measurement.perturbation import Perturbation
from ..measurement.reference import Reference
from ..model.structure import layer_attention_types, scheme_blockers, text_config
from .forms import FORMS, Form
from .recipe import Recipe
from .refine import Goal, refine
from .settings import MemoryTarget, RecipeContext, RecipeSettings

log = logging.getLogger(__name__)


@dataclass
class GroupScore:
    group: str
    units: list[str]
    block: int
    score: float
    bytes_saved: int
    params: int = 0  # weights in the group (what effective bits and the FP8 share count)
    kv_layer: int | None = None  # a layer's FP8 KV cache instead of weights (no units; its bytes at the workload)

    @property
    def per_byte(self) -> float:
        return self.score / max(self.bytes_saved, 1)


def group_scores(
    sensitivity, metric: str = "kl_q_p", members: dict[str, list[str]] | None = None, kv_tokens: int | None = None
) -> list[GroupScore]:
    """One score per fused group from a sensitivity table (per unit or per group).

    `members` maps each group to its unit names (Student.groups()); without it, a per-unit table's rows
    name the members. With `kv_tokens` (the KV tokens in flight at the user's workload), also one per layer's FP8
    KV cache (the sweep's kind "kv" rows), saving its bytes per token at that many tokens: a KV layer and a weight
    group then compete on bytes saved per unit of mismatch.
    """
    import pandas as pd

    metric_info(metric)
    df = sensitivity if isinstance(sensitivity, pd.DataFrame) else pd.read_csv(sensitivity)
    if metric not in df.columns:
        raise FP8ProbeError(f"metric {metric!r} is not a column of the sensitivity table")
    kv = _kv_scores(df[df["kind"] == "kv"], metric, kv_tokens) if kv_tokens else []
    df = df[~df["kind"].isin(["kv", "model"])]
    if df.empty:
        raise FP8ProbeError("the sensitivity table has no unit rows")
    if df[metric].isna().any():
        raise FP8ProbeError(
            f"the sweep's estimated rows (method fisher or path) hold only kl_q_p, not {metric}: "
            "use `metric` kl_q_p, or a sweep run with `method` exact"
        )
    out = []
    for g, rows in df.groupby("group", sort=False):
        score = sum(max(excess(metric, float(v)), 0.0) for v in rows[metric])
        units = members[g] if members and g in members else list(rows["unit"])
        out.append(
            GroupScore(
                g,
                units,
                int(rows["block"].min()),
                float(score),
                int(rows["bytes_saved"].sum()),
                int(rows["params"].sum()) if "params" in rows else 0,
            )
        )
    return out + kv


def _kv_scores(rows, metric: str, kv_tokens: int) -> list[GroupScore]:
    """One candidate per layer's FP8 KV cache: the sweep's kv row, its bytes at `kv_tokens` tokens in flight."""
    if rows.empty:
        raise FP8ProbeError(
            "the sweep has no KV-cache rows (one per layer), so the KV cache cannot be chosen per layer: "
            "run the sweep with its KV rows (the default), or drop `kv_tokens` for the whole KV cache in FP8"
        )
    if rows[metric].isna().any():
        raise FP8ProbeError(f"the sweep's KV rows hold no {metric}: use `metric` kl_q_p or an exact sweep")
    return [
        GroupScore(
            r.unit,
            [],
            int(r.block),
            max(excess(metric, float(getattr(r, metric))), 0.0),
            int(r.kv_bytes_saved_per_token) * int(kv_tokens),
            0,
            int(r.block),
        )
        for r in rows.itertuples()
    ]


def _windowed(kv_groups: list[GroupScore], windows: list, context: int | None) -> list[GroupScore]:
    """The KV candidates with a sliding-window layer's bytes at what it holds: at most its window W of each sequence's
    `context` tokens (vLLM frees the blocks behind the window), so kv_tokens x min(context, W) / context. `windows`:
    per layer, None (full attention) or its window (model.structure.layer_attention_types)."""
    sliding = sorted({w for w in windows if w is not None})
    if not sliding:
        return kv_groups
    if context is None:
        log.info(
            "recipe: sliding-window layers' KV bytes counted at every token in flight (each context taken as within "
            "the window of %s); give `kv_context` where sequences are longer",
            ", ".join(map(str, sliding)),
        )
        return kv_groups
    out = []
    for g in kv_groups:
        w = windows[g.kv_layer]
        out.append(g if w is None or w >= context else replace(g, bytes_saved=g.bytes_saved * w // context))
    return out


def _pinned_kv(kv_groups: list[GroupScore], windows: list, kept: set[str]) -> set[str]:
    """The KV layers a per-layer map must put in FP8: on a model with sliding-window layers (`windows`, as _windowed
    takes them), every full-attention layer's, since vLLM 0.32 cannot lay out a BF16 full-attention layer beside the
    sliding layers' padded pages (an assertion in unify_kv_cache_spec_page_size; deploy/capacity.py _mixed_layout);
    `kept`: the groups the user asked to keep (one of these is refused)."""
    if not any(w is not None for w in windows):
        return set()
    log.info(
        "recipe: beside sliding-window layers vLLM groups the layers of one KV spec, so a map's capacity is not its "
        "layers' bytes (Gemma 3 270M: 4 sliding layers BF16 hold 1.33x the KV tokens of a BF16 cache where their bytes "
        "say 1.64x); "
        "the recipe's line gives its map's capacity as vLLM lays it out"
    )
    pinned = {g.group for g in kv_groups if windows[g.kv_layer] is None}
    if pinned & kept:
        raise FP8ProbeError(
            f"`keep` {sorted(pinned & kept)[0]}: vLLM {VLLM_VERSION} cannot keep a full-attention layer's KV cache "
            "in BF16 beside sliding-window layers; keep sliding-window layers' KV caches only"
        )
    log.info(
        "recipe: the full-attention layers' KV caches (layers %s) are FP8 in any per-layer map: vLLM %s cannot keep "
        "one BF16 beside sliding-window layers",
        ", ".join(str(g.kv_layer) for g in sorted(kv_groups, key=lambda g: g.kv_layer) if g.group in pinned),
        VLLM_VERSION,
    )
    return pinned


def rank_groups(groups: list[GroupScore]) -> list[GroupScore]:
    """Least sensitive per byte saved first (ties: later blocks first, then name, for a stable order)."""
    return sorted(groups, key=lambda g: (g.per_byte, -g.block, g.group))


def _check_table_matches(
    sensitivity, student, known: set[str], members: dict[str, list[str]], unit_group: dict[str, str]
) -> None:
    """Refuse a table from another model, or one that lost rows."""
    missing = [g for g in known if g not in unit_group and g not in members]
    if missing:
        raise FP8ProbeError(f"the sweep lists groups this model lacks ({missing[0]} ...): was it run on another model?")
    sizes = {u.name: u.params for u in student.quantizable}
    sizes.update({g: sum(u.params for u in us) for g, us in student.groups().items()})
    if not isinstance(sensitivity, (str, Path)) and "params" in sensitivity.columns:
        for unit, params in zip(sensitivity["unit"], sensitivity["params"]):
            if unit in sizes and int(params) != sizes[unit]:
                raise FP8ProbeError(
                    f"the sweep gives {unit} {int(params):,} parameters, this model {sizes[unit]:,}: "
                    "was it run on another model?"
                )
    unscored = [g for g in members if g not in known]
    if unscored:
        raise FP8ProbeError(
            f"the sweep scores {len(known)} of this model's {len(members)} fused groups (none for "
            f"{unscored[0]}): is it truncated? run the sweep again"
        )


def linear_params(student) -> int:
    """The weights effective bits and the FP8 share count (MemoryTarget): every Linear, lm_head and routers too
    (lm_head at its full size even when tied to the embeddings, as ModelOpt's cost model counts it)."""
    return sum(u.params for u in student.quantizable) + sum(
        math.prod(u.shape) for u in student.units if u.kind in ("lm_head", "router")
    )


MAX_PASSES = 12  # measured passes of the bisection under a budget, at most
FILL_WINDOW = 14  # a memory target's last groups: chosen among the next this many ranked groups (2**14 sets)
FILL_SLACK = 0.005  # ... landing at most this share of what FP8 can reach above the closest fit, least predicted


def make_recipe(
    sensitivity, bench: Bench, settings: RecipeSettings, *, context: RecipeContext = RecipeContext()
) -> Recipe:
    """The FP8 recipe of the settings' form that saves the most weight bytes while the measured `metric` stays
    <= budget (a budget on the metric's excess over its zero point: 0.05 on token_mult_prob_error allows 1.05),
    or, with a memory target instead of a budget, the one with the least measured `metric` that saves at least
    that much, measured on the bench (measurement/bench.py: the student, its rollouts, the batch size). Refinement
    passes (settings.refine_passes) refine a free recipe with that many more measured passes (refine.py). `context`:
    the sweep's scheme, where it is, and a rollout framework's KV scales.

    holdout k >= 2 selects on one set and reports on another: every k-th prompt of the rollouts (with its samples)
    is held out (Rollouts.split), every measured pass of the search and the refinement runs on the rest, and the
    recipe's `measured` is its value on the held-out prompts with a 90 % bootstrap interval over them
    (`measured_search` the search set's, `split` what was held out). A figure chosen to sit under the budget on the
    rollouts it was chosen on is biased low there; the held-out one is not. Without a split, the search measures
    against the bench's own reference; with one, against the search set's. `engine` (an engines.py profile, e.g.
    "vllm-cuda"; "none": off) adds the same figure as that rollout engine computes it (`measured_engine`): the search
    and the budget use the simulation; the engine is what will run.

    form (recipe.FORMS): "free" / "keywords" (any fused groups), "first-last" (the first N and last M blocks
    BF16, the rest FP8), "all" (every group FP8), "none" (no FP8 weights: the KV cache alone). The settings are
    checked once, on construction (RecipeSettings); nothing here checks them again."""
    s, scheme, student, rollouts = settings, Scheme.from_name(context.scheme), bench.student, bench.rollouts
    budget, memory, metric, kv_cache_dtype = s.budget, s.memory, s.metric, s.kv_cache_dtype
    shape, holdout = FORMS[s.searched_form], s.holdout
    plan = _Plan.of(sensitivity, student, scheme, s)
    if holdout and not rollouts.can_split(holdout):
        log.warning(
            "recipe: %d prompts are too few to hold out every k-th (k = %d) with two on each side: the "
            "recipe is measured on the rollouts it was chosen on (sample more prompts for a held-out figure)",
            rollouts.num_prompts,
            holdout,
        )
        holdout = 0
    search_set, held, split = rollouts.split(holdout) if holdout else (rollouts, None, None)
    kv_scheme = (
        KVCacheScheme(fmt=KVCacheScheme.from_name(kv_cache_dtype).fmt, scale=context.kv_scale)
        if kv_cache_dtype
        else None
    )
    search = _Search(plan, bench.on(search_set) if held is not None else bench, scheme, metric, kv_scheme)
    if context.scales is not None:  # the sweep's per-sequence amax: the search set's scales without a pass
        search.kept = (context.scales, split["search_sequences"] if split else range(rollouts.num_sequences))
    weights = linear_params(student)  # what effective bits and the FP8 share count
    if memory is not None:
        k = search.reach(memory, weights, shape)
    elif shape.every:
        k = search.everything(budget)
    else:
        k = search.longest_prefix(budget, shape, MAX_PASSES)
    final, refines = plan.chosen(k), s.refine_passes > 0 and shape.chooses
    # the search set's own figure of the choice: what a budget bounded and refinement starts from; with a held-out
    # split and neither (a memory target's prefix chosen by rank, unrefined), it decides nothing and is not measured
    found, result = (None, None) if held is not None and not refines and k not in search.memo else search.result(k)[:2]
    refined = None
    if refines:
        goal = Goal(budget=budget) if memory is None else Goal(min_value=memory.amount(weights), value=memory.value)
        refined = refine(
            final,
            plan.free,
            plan.forced,
            search.measure_groups,
            s.refine_passes,
            goal=goal,
            start_measured=search.result(k),
            metric=metric,
        )
        final, found, result = refined.groups, refined.measured, refined.metrics
    report = _report(final, (found, result), search, held, None if s.engine == "none" else s.engine)
    fp8_params = sum(g.params for g in final)
    if plan.kv_per_layer and not kv_layers_of(final):  # no layer's KV cache in FP8: the recipe has none
        log.info("recipe: no layer's FP8 KV cache fits at %d tokens in flight: the KV cache stays BF16", s.kv_tokens)
        kv_cache_dtype = None
    return Recipe.from_groups(
        student.units,
        scheme.name,
        {g.group for g in final},
        model=student.name,
        kv_cache_dtype=kv_cache_dtype,
        **plan.membership(final, scheme),
        budget=budget,
        metric=metric,
        predicted=search.predict(final),
        **report,
        split=split,
        bytes_saved=sum(g.bytes_saved for g in final if g.kv_layer is None),
        kv_skip_layers=sorted(set(student.layers) - set(kv_layers_of(final)))
        if kv_cache_dtype and plan.kv_per_layer
        else [],
        kv_tokens=s.kv_tokens if kv_cache_dtype and plan.kv_per_layer else None,
        kv_context=s.kv_context if kv_cache_dtype and plan.kv_per_layer else None,
        search=search.log() + (refined.log if refined is not None else []),
        sweep=context.sweep_dir,
        form=s.searched_form,
        target=context.target,
        kv_scale=context.kv_scale if kv_cache_dtype else "calibrated",
        memory_target=memory.to_json() if memory is not None else None,
        fp8_share=fp8_params / weights if weights else 0.0,
        effective_bits=16 - 8 * fp8_params / weights if weights else 16.0,
    )


def _report(final, found, search, held, engine) -> dict:
    """What recipe.json reports of the chosen recipe (`found`: its excess and metrics on the search set, None when
    the search never measured it): with a held-out set, its value there with the search set's calibration (the
    static and KV scales an export calibrates before the held-out prompts are seen) and the interval, beside the
    search set's; without one, the search set's. With `engine`, the same figure as it computes."""
    (found, result), student, scheme, metric = found, search.bench.student, search.scheme, search.metric
    report = dict(measured=found, measured_metrics=result, measured_search=found, measured_interval=None)
    where = search.bench
    if held is not None:
        ref = Reference(student, held, where.batch_size, calibrate=False)
        ref.calibration = search.calibration(final)
        where = Bench.around(ref, student, held, where.batch_size)
        value, metrics, evidence = measure_groups(final, where, scheme, metric, search.kv, search.plan.kv_per_layer)
        interval = evidence.excess_interval(metric) if evidence else [value, value]
        report.update(measured=value, measured_metrics=metrics, measured_interval=interval)
        log.info(
            "recipe: %s %s on the search set, %.4g [%.4g, %.4g] on the held-out prompts",
            metric,
            "not measured" if found is None else f"{found:.4g}",
            value,
            *interval,
        )
    if engine is not None:
        from ..measurement.measure import measured_as

        p = _perturbation(final, student, scheme, search.kv, search.plan.kv_per_layer)
        report["measured_engine"] = measured_as(where, p, engine, metric)
    return report


@dataclass
class _Plan:
    """What the search chooses among: the scored groups, the ones kept, forced and blocked, and the candidates
    (candidates[k]: the groups in FP8 beside the forced ones, from the fewest, k = 0, to the most)."""

    groups: list[GroupScore]
    members: dict[str, list[str]]
    blocked: dict[str, str]  # groups the scheme's kernels refuse -> why (always BF16)
    keep_set: set[str]
    forced: list[GroupScore]
    free: list[GroupScore]
    candidates: list[list[GroupScore]]
    kv_per_layer: bool = False  # the FP8 KV cache chosen layer by layer (GroupScore.kv_layer), not in every layer

    @classmethod
    def of(cls, sensitivity, student, scheme, settings: RecipeSettings) -> "_Plan":
        """The settings' form, metric and constraints on this student."""
        s = settings
        metric, form, keep, force, keep_first, keep_last = (
            s.metric,
            FORMS[s.searched_form],
            s.keep,
            s.force,
            s.keep_first,
            s.keep_last,
        )
        members = {g: [u.name for u in us] for g, us in student.groups().items()}
        blocked = scheme_blockers(student.quantizable, scheme)
        if form.every and blocked:
            g, why = next(iter(blocked.items()))
            raise FP8ProbeError(
                f"{scheme.name} cannot quantize {len(blocked)} of this model's {len(members)} fused "
                f"groups ({g}: {why}; vLLM refuses these shapes), so every-Linear-in-FP8 cannot run "
                "on it; `form` none with `kv_cache_dtype` fp8 makes the FP8 KV cache alone"
            )
        groups = [g for g in group_scores(sensitivity, metric, members, s.kv_tokens) if g.group not in blocked]
        kv_groups = [g for g in groups if g.kv_layer is not None]
        groups = [g for g in groups if g.kv_layer is None]
        # a student's unit and group names, to map unit-level keep/force names to their group
        unit_group = {u.name: u.group for u in student.quantizable}
        for u in student.quantizable:
            unit_group.setdefault(u.group, u.group)
        _check_table_matches(sensitivity, student, {g.group for g in groups} | set(blocked), members, unit_group)
        if kv_groups and len(kv_groups) != len(student.layers):
            raise FP8ProbeError(
                f"the sweep has KV rows for {len(kv_groups)} of this model's {len(student.layers)} layers: "
                "was it run on another model?"
            )
        windows = layer_attention_types(text_config(student.model.config), True) if kv_groups else []
        kv_groups = _windowed(kv_groups, windows, s.kv_context)
        groups += kv_groups
        for g in kv_groups:
            unit_group[g.group] = g.group  # `keep`/`force` may name a layer's KV cache by its row's name

        def groups_of(names, what):
            missing = [n for n in names if n not in unit_group]
            if missing:
                raise FP8ProbeError(f"`{what}` {missing[0]}: no such unit or group; see `fp8probe units`")
            return {unit_group[n] for n in names}

        n_blocks = student.model.config.num_hidden_layers
        asked_keep = groups_of(keep, "keep")
        keep_set = set(asked_keep)
        if not form.edges:
            keep_set |= {g.group for g in groups if g.block < keep_first or g.block >= n_blocks - keep_last}
        pinned = _pinned_kv(kv_groups, windows, asked_keep)
        keep_set -= pinned  # an edge the user kept by position yields to what vLLM requires
        force_set = groups_of(force, "force") | pinned
        unquantizable = sorted(force_set & set(blocked))
        if unquantizable:
            raise FP8ProbeError(
                f"`force` {unquantizable[0]}: {scheme.name} cannot quantize it ({blocked[unquantizable[0]]})"
            )
        if keep_set & force_set:
            raise FP8ProbeError(f"{sorted(keep_set & force_set)[0]} is both kept and forced; choose one")
        by_name = {g.group: g for g in groups}
        free = [g for g in groups if g.group not in keep_set and g.group not in force_set]
        candidates = form.candidates(free, rank_groups, n_blocks, keep_first, keep_last)
        forced = [by_name[g] for g in sorted(force_set)]
        return cls(groups, members, blocked, keep_set, forced, free, candidates, bool(kv_groups))

    def chosen(self, k: int) -> list[GroupScore]:
        return self.forced + self.candidates[k]

    def fill(self, k: int, need: float, value, slack: float) -> list[GroupScore]:
        """A memory target's candidate: the ranked prefix of k - 1 groups and, in place of the k-th alone (whose bytes
        may overshoot the target by a whole group), the set of the next FILL_WINDOW ranked groups that meets the
        target closest (value(chosen) - need, the least over every such set, within `slack`), the least predicted
        mismatch among those (ties: the fewer bytes, then a fixed order). `value`: MemoryTarget.value (additive). The
        k-th group alone is one of the sets, so the fill never lands further above the target than the prefix did
        (by more than `slack`)."""
        import numpy as np

        ranked, head = self.candidates[-1], self.candidates[k - 1]
        window = ranked[k - 1 : k - 1 + FILL_WINDOW]
        deficit = need - value(self.forced + head)
        masks = (np.arange(1, 2 ** len(window))[:, None] >> np.arange(len(window))) & 1
        got = masks @ np.array([value([g]) for g in window], dtype=float)
        score = masks @ np.array([g.score for g in window], dtype=float)
        over = np.where(got >= deficit, got - deficit, np.inf)
        near = np.flatnonzero(over <= over.min() + slack)
        best = near[np.lexsort((near, got[near], score[near]))[0]]
        return head + [g for g, m in zip(window, masks[best]) if m]

    def membership(self, final: list[GroupScore], scheme: Scheme) -> dict:
        """recipe.json's quantized / kept groups, their units and the kept groups' scores and reasons."""
        quantized = {g.group for g in final}
        kept = [g.group for g in self.groups if g.group not in quantized and g.kv_layer is None] + list(self.blocked)
        kept_kv = [g.group for g in self.groups if g.group not in quantized and g.kv_layer is not None]
        by_name = {g.group: g for g in self.groups}
        return dict(
            quantized=[g.group for g in self.groups if g.group in quantized and g.kv_layer is None],
            kept=kept,
            group_units={**{g.group: g.units for g in self.groups}, **{g: self.members[g] for g in self.blocked}},
            kept_scores=[
                {
                    "group": g,
                    "score": by_name[g].score,
                    "bytes_saved": by_name[g].bytes_saved,
                    "reason": "keep" if g in self.keep_set else "budget",
                }
                for g in kept + kept_kv
                if g in by_name
            ]
            + [
                {"group": g, "score": None, "bytes_saved": 0, "reason": f"{scheme.name}: {why}"}
                for g, why in self.blocked.items()
            ],
        )


def measure_groups(
    gs, bench: Bench, scheme: Scheme, metric: str, kv: KVCacheScheme | None, kv_per_layer: bool = False
) -> tuple[float, dict, Measured | None]:
    """These groups in FP8 (+ the KV cache) measured on the bench: (the metric's excess, every metric, the Measured
    behind them; None for no FP8 at all)."""
    p = _perturbation(gs, bench.student, scheme, kv, kv_per_layer)
    if not p.units and not p.kv_layers:
        return excess(metric, no_mismatch()[metric]), no_mismatch(), None
    m = measure(bench, p)
    res = {k: m.metrics[k] for k in METRICS}
    return excess(metric, res[metric]), res, m


def _perturbation(gs, student, scheme: Scheme, kv: KVCacheScheme | None, kv_per_layer: bool = False) -> Perturbation:
    """These groups' units in `scheme`, with the FP8 KV cache when `kv` is given: in the layers among the groups
    (`kv_per_layer`), else in every layer."""
    units = tuple(u for g in gs for u in g.units)
    if kv is None:
        return Perturbation(units, scheme)
    layers = kv_layers_of(gs) if kv_per_layer else tuple(student.layers)
    return Perturbation(units, scheme, layers, kv)


def kv_layers_of(gs) -> tuple[int, ...]:
    """The layers whose KV cache these groups put in FP8."""
    return tuple(sorted(g.kv_layer for g in gs if g.kv_layer is not None))


class _Search:
    """Measured passes over the plan's candidates, each measured once (memo), and the three ways to choose one."""

    def __init__(self, plan: _Plan, bench: Bench, scheme, metric, kv_scheme):
        self.plan, self.bench, self.scheme, self.metric, self.kv = plan, bench, scheme, metric, kv_scheme
        self.memo: dict[int, dict] = {}
        self.kept = None  # (the sweep's SequenceAmax of the rollouts, the search set's sequences in them)

    @property
    def student(self):
        return self.bench.student

    def calibration(self, gs=()):
        """The search set's static input scales and K/V amax (what an export calibrates) for these groups in FP8: the
        reference's when one was made, else the sweep's per-sequence amax over the search set's sequences where it
        kept them for every unit of `gs` (and the KV cache), else one calibration pass alone (the same numbers, no
        lm_head, nothing kept); None where nothing is calibrated (dynamic input scales, no calibrated KV cache)."""
        if self.bench.holds_reference():  # made by a measured pass, or the bench's own
            return self.bench.reference().calibration
        kv = self.kv if self.kv is not None and self.kv.scale == "calibrated" else None
        if not self.scheme.static_input and kv is None:
            return None
        units = [u for g in gs for u in g.units] if self.scheme.static_input else []
        layers, strategy = (self.student.layers, kv.strategy) if kv is not None else ((), "tensor")
        if self.kept is not None and self.kept[0].covers(units, layers, strategy):
            log.info("recipe: the search set's static scales from the sweep's per-sequence amax (no calibration pass)")
            return self.kept[0].calibration(self.kept[1])
        from ..measurement.calibration import calibrate

        return calibrate(
            self.student, self.bench.rollouts, list(self.student.unit_names), batch_size=self.bench.batch_size
        )

    @staticmethod
    def predict(gs) -> float:
        """A set of groups' predicted mismatch: the sum of their scores."""
        return sum(g.score for g in gs)

    def predicted(self, k: int) -> float:
        return self.predict(self.plan.chosen(k))

    def measure_groups(self, gs) -> tuple[float, dict, Measured | None]:
        """One measured pass of these groups in FP8 (+ the KV cache) on the search set: (the metric's excess, every
        metric, the per-token statistics behind them for refine's paired test)."""
        return measure_groups(gs, self.bench, self.scheme, self.metric, self.kv, self.plan.kv_per_layer)

    def measured(self, k: int) -> float:
        if k not in self.memo:
            self.memo[k] = self.measure_groups(self.plan.chosen(k))
            log.info(
                "recipe search: %d of %d groups in FP8 -> %s = %.4g (predicted %.4g)",
                len(self.plan.chosen(k)),
                len(self.plan.groups),
                self.metric,
                self.memo[k][0],
                self.predicted(k),
            )
        return self.memo[k][0]

    def result(self, k: int) -> tuple[float, dict, Measured | None]:
        """(excess, every metric, the evidence) of the first k candidates, measured once."""
        self.measured(k)
        return self.memo[k]

    def log(self) -> list[dict]:
        return [
            {
                "move": "prefix",
                "groups_fp8": len(self.plan.chosen(k)),
                "bytes_saved": sum(g.bytes_saved for g in self.plan.chosen(k)),
                "predicted": self.predicted(k),
                "measured": v[0],
            }
            for k, v in sorted(self.memo.items())
        ]

    def reach(self, memory: MemoryTarget, weights: int, form: Form) -> int:
        """The fewest candidates that meet the memory target (by their bytes: nothing measured)."""
        n = len(self.plan.candidates) - 1
        need = memory.amount(weights)
        have = [memory.value(self.plan.chosen(k)) for k in range(n + 1)]
        k = next((k for k in range(n + 1) if have[k] >= need), None)
        if k is not None and k > 0 and form.chooses:
            self.plan.candidates[k] = self.plan.fill(k, need, memory.value, FILL_SLACK * have[-1])
        if k is None:
            others = ", the others cannot take " + self.scheme.name if self.plan.blocked else ""
            raise FP8ProbeError(
                f"{memory.describe(need)} is more than {'FP8' if form.chooses else 'this form'} can "
                f"reach on this model: at most {memory.describe(have[-1])} ({len(self.plan.chosen(n))} "
                f"of {len(self.plan.members)} fused groups{others}); lower the target"
            )
        return k

    def everything(self, budget: float) -> int:
        """Form all: every group, if it fits."""
        if self.measured(1) > budget:
            raise FP8ProbeError(
                f"every Linear in {self.scheme.name}{' with the FP8 KV cache' if self.kv else ''} (the "
                f"only FP8 recipe of form all) measures {self.metric} {self.measured(1):.3g} > budget "
                f"{budget}; at this budget keep the weights BF16 (`form` none for the KV cache alone)"
            )
        return 1

    def longest_prefix(self, budget: float, form: Form, max_passes: int) -> int:
        """The most candidates whose measured mismatch stays within the budget: bisection, started at the
        prediction's guess, at most max_passes measured passes."""
        n, per_layer = len(self.plan.candidates) - 1, self.plan.kv_per_layer
        if self.measured(0) > budget:
            what = (
                form.smallest
                if not form.weights
                else (f"only the forced groups{' and the FP8 KV cache' if self.kv and not per_layer else ''} in FP8")
            )
            raise FP8ProbeError(
                f"even with {what} the measured {self.metric} is {self.measured(0):.3g} > budget "
                f"{budget}; raise the budget{', or drop `kv_cache_dtype` (a BF16 KV cache)' if self.kv else ''}"
            )
        lo, hi = 0, n + 1  # measured(lo) <= budget; hi: first k known to exceed (n + 1: none known)
        if n == 0 or self.measured(n) <= budget:
            lo = n
        else:
            hi = n
            guess = max((k for k in range(n + 1) if self.predicted(k) <= budget), default=0)
            guess = min(max(guess, 1), n - 1) if n > 1 else 0
            if guess > 0:
                (lo, hi) = (guess, hi) if self.measured(guess) <= budget else (lo, guess)
            while hi - lo > 1 and len(self.memo) < max_passes:
                mid = (lo + hi) // 2
                if self.measured(mid) <= budget:
                    lo = mid
                else:
                    hi = mid
        if lo == 0 and not self.plan.forced and self.kv is None and n:
            raise FP8ProbeError(
                f"no fused group fits the budget: {form.smallest} alone measures {self.metric} "
                f"{self.measured(1):.3g} > {budget}; raise the budget"
            )
        return lo
