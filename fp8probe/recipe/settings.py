"""What `fp8probe recipe` is asked for (RecipeSettings: the goal, the constraints on what is searched, how groups are
priced and ranked, the refinement and the held-out report) and what a recipe is made within (RecipeContext: the
sweep's scheme and batch size, and what a rollout framework imposes). Light: the CLI reads it for its flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import FP8ProbeError
from ..core.metrics import METRICS
from ..core.schemes import KV_CACHE_SCHEMES
from ..core.settings import Settings, opt
from .forms import FORMS, check_request
from .refine import DEFAULT_REFINE_PASSES, default_passes

GOALS = ("budget", "min_bytes_saved", "effective_bits", "fp8_share")  # exactly one: a budget, or a memory target


@dataclass(frozen=True)
class RecipeSettings(Settings):
    """Exactly one goal, `budget` or a memory target (`min_bytes_saved`, `effective_bits`, `fp8_share`); the
    constraints on what is searched; how groups are priced and ranked; the refinement and the held-out report."""

    budget: float | None = opt(
        None,
        "largest allowed measured mismatch (the recipe saves the most bytes within it)",
        low=0.0,
        group="goal",
        required=True,
    )
    min_bytes_saved: int | None = opt(
        None,
        "instead of a budget: save at least this many weight bytes, with the least mismatch",
        low=0,
        group="goal",
        metavar="BYTES",
    )
    effective_bits: float | None = opt(
        None,
        "instead: at most B bits per weight of every Linear, lm_head included "
        "(BF16 16, FP8 8; as ModelOpt's auto_quantize counts)",
        low=8.0,
        high=16.0,
        group="goal",
        metavar="B",
    )
    fp8_share: float | None = opt(
        None,
        "instead: at least this fraction of every Linear's weights in FP8",
        low=0.0,
        high=1.0,
        group="goal",
        metavar="F",
    )
    metric: str = opt(
        "kl_q_p", f"the metric the budget bounds: {', '.join(METRICS)}", choices=METRICS, metavar="METRIC"
    )
    kv_cache_dtype: str | None = opt(
        None,
        "also put the KV cache in FP8, as vLLM's --kv-cache-dtype names it; "
        "written as llm-compressor's kv_cache_scheme with calibrated k/v scales, and "
        "counted in the budget",
        choices=KV_CACHE_SCHEMES,
        aliases=("--kv-cache-scheme",),
    )
    kv_tokens: int | None = opt(
        None,
        "with kv_cache_dtype: choose the FP8 KV cache layer by layer, each layer saving its KV bytes at this many "
        "tokens in flight (sequences x context, as capacity counts them) beside the weight groups; the layers left "
        "out stay in the model dtype (vLLM's kv_cache_dtype_skip_layers)",
        low=1,
        metavar="TOKENS",
    )
    kv_context: int | None = opt(
        None,
        "with kv_tokens: the tokens one sequence holds at its longest (prompt + response); a sliding-window layer "
        "(Gemma 3's window of 512) keeps at most its window of them, so its KV bytes count at "
        "kv_tokens x min(context, window) / context; without it, every context is taken as inside the window",
        low=1,
        metavar="TOKENS",
    )
    keep_first: int = opt(0, "keep the first N blocks in BF16", low=0)
    keep_last: int = opt(0, "keep the last N blocks in BF16", low=0)
    keep: tuple[str, ...] = opt((), "units or groups to keep in BF16")
    force: tuple[str, ...] = opt((), "units or groups to put in FP8 regardless")
    form: str | None = opt(
        None,
        "the recipes searched: free (default), keywords, first-last, all (every Linear), none (FP8 KV cache only)",
        choices=FORMS,
    )
    refine: int | None = opt(
        None,
        f"measured passes refining a free recipe (0: off; default {DEFAULT_REFINE_PASSES} "
        "under a budget, 0 under a memory target)",
        low=0,
        metavar="PASSES",
    )
    engine: str = opt(
        "vllm-cuda",
        "also report the recipe's figure as this rollout engine computes it (the search "
        "and budgets use the simulation; none: off)",
        choices=("vllm-cuda", "vllm-cpu", "none"),
    )
    holdout: int = opt(
        2,
        "select on one set, report on another: every k-th prompt of the rollouts is held out and "
        "the recipe's measured mismatch is its value there, with its interval (0: search and report "
        "on all the rollouts)",
        low=0,
        metavar="K",
    )

    def __post_init__(self):
        # the request's rules first (forms.check_request): they say what to do where a bare list of choices would not
        # (an engine-only KV dtype names the command that measures it)
        check_request(
            self.searched_form,
            self.kv_cache_dtype,
            self.keep,
            self.force,
            self.keep_first,
            self.keep_last,
        )
        super().__post_init__()
        goals = [g for g in GOALS if getattr(self, g) is not None]
        if len(goals) != 1:
            raise FP8ProbeError("give exactly one of " + ", ".join(f"`{g}`" for g in GOALS))
        if self.kv_context is not None and (self.kv_tokens is None or self.kv_context > self.kv_tokens):
            raise FP8ProbeError(
                "`kv_context` is one sequence's share of `kv_tokens`: give `kv_tokens` too, at least as many"
            )
        if self.kv_tokens is not None:
            if self.kv_cache_dtype is None:
                raise FP8ProbeError("`kv_tokens` chooses the FP8 KV cache per layer: give `kv_cache_dtype` too")
            if not FORMS[self.searched_form].chooses:
                raise FP8ProbeError(
                    f"`kv_tokens` chooses KV layers beside weight groups; form {self.searched_form} chooses none "
                    "(use form free or keywords)"
                )
            if self.effective_bits is not None or self.fp8_share is not None:
                raise FP8ProbeError(
                    "`kv_tokens` counts a KV layer's bytes, which effective bits and the FP8 share do not: "
                    "give `budget` or `min_bytes_saved`"
                )
        if self.holdout == 1:
            raise FP8ProbeError("`holdout` 1 would hold out every prompt: use k >= 2, or 0 for no split")

    @property
    def searched_form(self) -> str:
        """The form searched (forms.FORMS): as given, else free."""
        return self.form or "free"

    @property
    def refine_passes(self) -> int:
        """The refinement's measured passes: as given, or the goal's default (recipe.refine.default_passes)."""
        return self.refine if self.refine is not None else default_passes(self.memory is not None)

    @property
    def memory(self):
        """The memory target (MemoryTarget, below), or None with a budget."""
        kind = next((k for k in GOALS[1:] if getattr(self, k) is not None), None)
        return MemoryTarget(kind.replace("min_", ""), getattr(self, kind)) if kind else None


@dataclass(frozen=True)
class RecipeContext:
    """What a recipe is made within, beside what was asked and the bench it is measured on: the scheme of the sweep its
    table comes from (and where it is, recorded in recipe.json), and how a rollout framework scales an FP8 KV cache
    (`kv_scale`: "calibrated" checkpoint scales or "unit", 1.0) and its name (deploy.frameworks.recipe_form
    resolves both, with the form, above this layer). `scales`: the sweep's per-sequence static amax of these
    rollouts (measurement.scales.SequenceAmax, SweepRun.sequence_scales), where it kept them: the search set's static
    scales are read from them instead of measured by a calibration pass."""

    scheme: str = "FP8_DYNAMIC"
    sweep_dir: str | None = None
    kv_scale: str = "calibrated"
    target: str | None = None
    scales: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class MemoryTarget:
    """What a recipe must at least save, in one of the three ways a user says it.

    bytes_saved: weight bytes (BF16 -> FP8, less the scales the checkpoint adds), as `bytes_saved` in the
    sweep; effective_bits / fp8_share: over the weights of every Linear layer, as ModelOpt's auto_quantize
    counts them (its default "weight" cost model): the decoder blocks' attention and MLP projections
    (experts included) and also lm_head and MoE routers, which fp8probe always keeps BF16; not embeddings
    or norms. BF16 = 16 bits, FP8 = 8 bits, scales not counted: effective_bits = 16 - 8 x fp8_share.
    """

    kind: str  # "bytes_saved", "effective_bits" or "fp8_share"
    given: float

    def __post_init__(self):
        lo, hi = {"bytes_saved": (0, float("inf")), "effective_bits": (8, 16), "fp8_share": (0, 1)}[self.kind]
        if not lo <= self.given <= hi:
            field = "min_bytes_saved" if self.kind == "bytes_saved" else self.kind
            raise FP8ProbeError(f"`{field}` {self.given} is outside [{lo}, {hi}]")

    def amount(self, linear_weights: int) -> float:
        """The least value() a recipe must reach (linear_weights: linear_params(student))."""
        if self.kind == "bytes_saved":
            return self.given
        share = self.given if self.kind == "fp8_share" else (16 - self.given) / 8
        return share * linear_weights

    def value(self, groups) -> float:
        return sum(g.bytes_saved for g in groups) if self.kind == "bytes_saved" else sum(g.params for g in groups)

    def describe(self, amount: float) -> str:
        return f"{amount / 2**20:.1f} MiB saved" if self.kind == "bytes_saved" else f"{amount:,.0f} FP8 weights"

    def to_json(self) -> dict:
        return {"kind": self.kind, "value": self.given}
