"""What a sweep measures and how, as typed settings parsed once at the edge (`fp8probe sweep`'s flags are built
from these fields)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import FP8ProbeError
from ..core.schemes import KV_CACHE_DTYPES, SCHEMES, KVCacheScheme, Scheme
from ..core.settings import Settings, opt
from .methods import METHODS


@dataclass(frozen=True)
class SweepSettings(Settings):
    """What a sweep measures (`scheme`, a row per unit or fused `group`, KV-cache rows in `kv_cache_dtype` unless not
    `include_kv`), how (`method` exact | fisher | auto: `top_k`, `controls`, `fisher_samples`; the label draws and
    auto's controls are seeded with the rollouts' seed; `verl_figures`: the whole-model rows also on their own samples,
    as verl logs them), compared with which exact sweep (`compare`, `agreement_budget`), and where the rows are measured
    (`workers` Ray actors, at `ray_address`, with `threads_per_worker` each). The library's `sweep()` takes it whole
    (its default: method exact)."""

    scheme: str = opt("FP8_DYNAMIC", f"FP8 scheme: {', '.join(SCHEMES)}")
    granularity: str = opt(
        "unit", "a row per Linear (unit) or per fused group as vLLM loads it (group)", choices=("unit", "group")
    )
    include_kv: bool = opt(True, "skip the per-layer FP8 KV-cache rows", flag="--no-kv")
    kv_cache_dtype: str = opt("fp8", f"KV rows in {', '.join(KV_CACHE_DTYPES)}")
    method: str = opt(
        "fisher",
        "fisher: estimate every row from one pass with backward (fast; the default); "
        "exact: measure every row; auto: estimate, then measure the top-k highest, controls others and "
        "the whole model",
        choices=tuple(METHODS),
    )
    top_k: int = opt(24, "method auto: rows measured exactly", low=0)
    controls: int = opt(8, "method auto: random other rows measured exactly, as a check", low=0)
    fisher_samples: int = opt(2, "label draws per position for the estimate, one backward each", low=1)
    verl_figures: bool = opt(
        False,
        "also score the whole-model rows on each one's own samples, as verl logs the mismatch (rollout_corr/kl, "
        "k3_kl, chi2_token, rollout_probs_diff_*, pearson): one more generation per row (exact and auto)",
    )
    compare: str | None = opt(None, "an exact sweep of the same rollouts: write agreement.json", metavar="EXACT_DIR")
    agreement_budget: float | None = opt(
        None,
        "kl_q_p budget of the agreement's recipes (default: half the whole-model FP8 mismatch)",
        low=0.0,
        metavar="X",
    )
    workers: int = opt(1, "Ray workers measuring the rows, one replica each (pip install 'fp8probe[ray]')", low=1)
    ray_address: str | None = opt(
        None, "join this Ray cluster (left running) instead of starting a local one", metavar="ADDR"
    )
    threads_per_worker: int | None = opt(None, "CPU threads per worker (default: cores / workers)", low=1, metavar="T")

    def __post_init__(self):
        super().__post_init__()
        Scheme.from_name(self.scheme)
        KVCacheScheme.from_name(self.kv_cache_dtype)
        if self.threads_per_worker is not None and self.workers == 1 and not self.ray_address:
            raise FP8ProbeError("`threads_per_worker` needs `workers` N (N > 1) or `ray_address`")
        if self.verl_figures and not METHODS[self.method].reference:
            raise FP8ProbeError(
                f"`verl_figures` scores the whole-model rows a sweep measures, and method {self.method} measures "
                "none: pass `method` auto or exact"
            )
        if (self.workers > 1 or self.ray_address) and not METHODS[self.method].measures:
            *others, last = [m for m, kind in METHODS.items() if kind.measures]
            measuring = f"{', '.join(others)} or {last}"
            raise FP8ProbeError(
                f"Ray workers (`workers`, `ray_address`) measure rows exactly and method "
                f"{self.method} measures none: pass `method` {measuring} (or run without Ray)"
            )

    @property
    def preset(self) -> Scheme:
        return Scheme.from_name(self.scheme)

    @property
    def kv(self) -> KVCacheScheme:
        return KVCacheScheme.from_name(self.kv_cache_dtype)

    @property
    def kind(self):
        """How the method scores its rows (methods.MethodKind: reference pass, estimate, exact rows)."""
        return METHODS[self.method]

    def recorded(self, seed: int) -> dict:
        """run.json's `method` (and what a resume must match): its name and the settings its kind records (the
        estimate's label draws, estimator and `seed`, the rollouts' seed; auto's exact rows), under
        the names run.json has always used."""
        from ..measurement.fisher import DEFAULT_ESTIMATOR

        values = {
            "samples": self.fisher_samples,
            "estimator": DEFAULT_ESTIMATOR,
            "seed": seed,
            "top_k": self.top_k,
            "controls": self.controls,
        }
        return {"method": self.method, **{k: values[k] for k in self.kind.recorded}}
