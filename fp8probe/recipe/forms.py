"""The shapes of recipe a rollout framework can apply (deploy.frameworks says which framework takes which), as a
registry: each `Form` says what it expresses, which recipes the search may choose among, and what it refuses.

    free        any set of fused groups in BF16 (an ignore list of module names)
    keywords    first/last N blocks in BF16 plus substring keywords (NeMo-RL); any free recipe is expressible
    first-last  the first N and last M decoder blocks in BF16, the rest in FP8
    all         every Linear in FP8 (lm_head, embeddings and MoE routers stay BF16)
    none        no FP8 weights (BF16 rollouts); an FP8 KV cache only where the framework takes one
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..core.errors import FP8ProbeError
from ..core.schemes import check_recipe_kv


@dataclass(frozen=True)
class Form:
    """A shape of recipe. `candidates(free, rank, n_blocks, keep_first, keep_last)` lists what the search chooses
    among: candidates[k] the groups in FP8 beside the forced ones, from the fewest (k = 0) to the most; `free` are
    the groups neither kept nor forced, `rank` orders groups from the least sensitive."""

    name: str
    candidates: Callable
    chooses: bool = False  # any set of groups: the search ranks them and a refinement may swap them
    edges: bool = False  # whole leading/trailing blocks only: keep_first/keep_last are its candidates' floor
    every: bool = False  # every group or none: a model whose scheme refuses a group cannot take it
    weights: bool = True  # FP8 weights at all (none: the FP8 KV cache alone)
    narrower: tuple[str, ...] = ()  # the other forms a framework taking this one can also express
    smallest: str = ""  # its smallest FP8 recipe, in words

    @property
    def fixed(self) -> bool:
        """Its recipe is fixed (all, none): nothing to keep, force or search, and no sweep's scores needed."""
        return not (self.chooses or self.edges)


def _ranked(free, rank, n_blocks, keep_first, keep_last) -> list:
    ranked = rank(free)
    return [ranked[:k] for k in range(len(ranked) + 1)]


def _edges(free, rank, n_blocks, keep_first, keep_last) -> list:
    """For each number of FP8 blocks, the split (first N, last M BF16) whose FP8 middle scores least."""
    out = []
    for kept in range(n_blocks - keep_first - keep_last, -1, -1):  # from all kept to none kept
        kept_total = kept + keep_first + keep_last
        best = None
        for first in range(keep_first, kept_total - keep_last + 1):
            last = kept_total - first
            mid = [g for g in free if first <= g.block < n_blocks - last]
            score = sum(g.score for g in mid)
            if best is None or score < best[0]:
                best = (score, mid)
        out.append(best[1])
    return out


FORMS: dict[str, Form] = {
    f.name: f
    for f in (
        # what each expresses: the table in this module's docstring
        Form("free", _ranked, chooses=True, smallest="the least sensitive group"),
        Form("keywords", _ranked, chooses=True, smallest="the least sensitive group"),
        Form("first-last", _edges, edges=True, narrower=("all", "none"), smallest="the smallest first-last recipe"),
        Form("all", lambda free, *_: [[], free], every=True, narrower=("none",), smallest="every Linear"),
        Form("none", lambda *_: [[]], weights=False, smallest="the FP8 KV cache alone"),
    )
}


def narrower(name: str) -> tuple[str, ...]:
    """The forms a framework that takes form `name` can express: itself and the narrower ones (one that takes any
    set of groups takes every form)."""
    f = FORMS[name]
    return tuple(FORMS) if f.chooses else (name, *f.narrower)


def check_request(
    form: str,
    kv_cache_dtype: str | None,
    keep,
    force,
    keep_first: int,
    keep_last: int,
) -> None:
    """What a recipe request's form takes, checked before anything is loaded (and without torch): a known form, a KV
    dtype a recipe can hold, no keep/force for a fixed form, and a KV cache for the form without FP8 weights.
    RecipeSettings (recipe/settings.py) calls it on construction: the rules live here
    once."""
    if form not in FORMS:
        raise FP8ProbeError(f"unknown `form` {form!r}; choose from {', '.join(FORMS)}")
    check_recipe_kv(kv_cache_dtype)
    if FORMS[form].fixed and (keep or force or keep_first or keep_last):
        raise FP8ProbeError(f"`form` {form} takes no `keep`/`force`/`keep_first`/`keep_last`: its recipe is fixed")
    if not FORMS[form].weights and kv_cache_dtype is None:
        raise FP8ProbeError("`form` none (no FP8 weights) measures the FP8 KV cache alone: add `kv_cache_dtype` fp8")
