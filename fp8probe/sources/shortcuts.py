"""The rollout shortcuts a command measures, as a user names them (recipe files, FP8 KV caches, stale checkpoints,
a teacher, the engine): typed settings, checked before any output exists, turned into Sources once a student is
loaded."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from dataclasses import replace as with_

from ..core.schemes import KV_CACHE_DTYPES, SCHEMES, KVCacheScheme, Scheme
from ..core.settings import Settings, opt
from ..measurement.engines import ENGINES
from .config import KV_SCALES
from .sources import Source, kv_cache, recipe, stale

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shortcuts(Settings):
    """The rollout shortcuts a command measures: FP8 `recipe` files (their weights and KV cache), FP8 KV caches
    (`kv_cache_dtype`), other checkpoints of the student as the rollout policy (`stale`), a `teacher` sharing its
    tokenizer (the OPD-signal distortion), every figure as `engine` computes it (default: the simulation)."""

    recipe: tuple[str, ...] = opt((), "recipe.yaml file(s): FP8 weights (+ their FP8 KV cache)")
    fp8: str | None = opt(
        None,
        "every unit the scheme fits in FP8 (whole-model FP8, the calibration's fp8:SCHEME level): a scheme name",
        choices=tuple(SCHEMES),
    )
    kv_cache_dtype: tuple[str, ...] = opt((), f"FP8 KV cache(s): {', '.join(KV_CACHE_DTYPES)}")
    kv_scales: str = opt(
        "unit",
        "the FP8 KV cache's k/v scales: unit (1.0, what vLLM and the RL frameworks' online quantization run on a "
        "checkpoint without scales) or calibrated (amax / 448 over the rollouts, what llm-compressor stores); a "
        "recipe's KV cache keeps its own",
        choices=KV_SCALES,
    )
    stale: tuple[str, ...] = opt((), "other checkpoint(s) of the student as the rollout policy")
    teacher: str | None = opt(None, "a teacher sharing the student's tokenizer: adds the OPD-signal distortion")
    engine: str = opt(
        "sim",
        "sim: every shortcut in the reference-dtype model, as recipes and budgets are measured; "
        "vllm-cuda / vllm-cpu: every figure as vLLM 0.32 computes it",
        choices=ENGINES,
    )

    def check(self, model) -> None:
        """Everything readable and covered by the engine, before any output exists (`model`: the ModelSource)."""
        from ..recipe.recipe import read_recipe

        eng = ENGINES[self.engine]
        for path in self.recipe:
            rec = read_recipe(path)
            eng.check(rec.preset, KVCacheScheme() if rec.kv_cache_scheme else None)
        if self.fp8:
            eng.check(Scheme.from_name(self.fp8), None)
        for kv in self.kv_cache_dtype:
            eng.check(Scheme.from_name("FP8_DYNAMIC"), KVCacheScheme.from_name(kv))
        for path in [*self.stale, *([self.teacher] if self.teacher else [])]:
            with_(model, model=path).check()

    def sources(self, student, allow_pickle: bool = False, stale_steps: int | None = None) -> list[Source]:
        """The shortcuts as Sources of `student` (`stale_steps`: how many optimizer steps older the `stale`
        checkpoints are, when known: their configuration's lag)."""
        from ..recipe.recipe import Recipe, read_recipe

        out = [recipe(student, read_recipe(p), name=f"recipe {p}") for p in self.recipe]
        if self.fp8:
            whole = Recipe.whole_model(student.units, self.fp8)
            out.append(recipe(student, whole, name=f"fp8 {self.fp8} (every unit)"))
        out += [kv_cache(student, d, self.kv_scales) for d in self.kv_cache_dtype]
        out += [stale(student, c, allow_pickle=allow_pickle, lag=stale_steps) for c in self.stale]
        return out

    def load_teacher(self, model):
        if not self.teacher:
            return None
        log.info("loading the teacher %s", self.teacher)
        return with_(model, model=self.teacher).load()
