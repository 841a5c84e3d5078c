"""What `fp8probe ladder` is asked for (LadderSettings): the shortcuts beside a ruler of seeded weight noise. Light:
the CLI reads it for its flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.settings import Settings, opt
from .shortcuts import Shortcuts
from .sources import NOISE_RULER


@dataclass(frozen=True)
class LadderSettings(Settings):
    """The shortcuts, on a ruler of seeded weight noise (`noise` levels, `noise_seed`; default NOISE_RULER), all
    at once too when `combine`, with the prefix shift of each unless not `prefix_shift`."""

    shortcuts: Shortcuts = field(default_factory=Shortcuts)
    noise: tuple[float, ...] | None = opt(
        None,
        "relative weight-noise levels σ (x each tensor's std); default: " + " ".join(f"{x:g}" for x in NOISE_RULER),
        low=0.0,
        open_low=True,
    )
    noise_seed: int = opt(0, "seed of the noise draws", low=0)
    combine: bool = opt(False, "also measure the recipe, KV and stale sources together")
    prefix_shift: bool = opt(True, "skip the prefix-shift columns (faster)", flag="--no-prefix-shift")
