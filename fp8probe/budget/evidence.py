"""A budget's calibration levels as `check` reads them: each level's configuration, its dose on the check's scale
and its own measured loss, with what that loss says against the tolerance.

A calibration trains the student with each level's rollout configuration, so a level is direct evidence for its
configuration: a level whose loss interval lies above the tolerance shows that configuration costs too much, and
(the loss grows with the dose within a kind) so does anything of its kind measuring at or above its dose. The
rules that turn this into a verdict are admission.judge's; this module only reads the levels out of budget.json:

    runs          each run's level name, kind and dose (what names the ruler's levels)
    levels        the noise ruler's levels (0 and σ): dose, mean loss, its interval, seeds
    other_levels  every other level (fp8, kv, stale:K): the same, with its name and kind
    kinds         the ruler's reading at a level of another kind (Reading), paired by seed

`seeds_to_decide` sizes what would settle a level whose loss interval straddles the tolerance, by the square-root
law as the prompts are sized (admission.decide_factor: 90 % power at a 90 % interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ..core.stats import LEVEL, decide_factor, expansion
from ..sources.config import RolloutConfig


class Verdict(str, Enum):
    """What `check` says of a configuration against a budget (check.json's `verdict`, the exit code's source): a
    str, so it is written and compared as its name."""

    ADMIT = "ADMIT"
    REJECT = "REJECT"
    UNCERTAIN = "UNCERTAIN"

    def __str__(self) -> str:  # printed as its name, f-strings too, in any Python (enum.StrEnum is 3.11's)
        return self.value


class Reading(str, Enum):
    """The noise ruler's curve read at a level of another kind (budget.json's words, kept as written)."""

    AS_PREDICTED = "as the ruler predicts"
    COSTS_MORE = "costs more than the ruler predicts"
    COSTS_LESS = "costs less than the ruler predicts"

    @classmethod
    def of(cls, text) -> Reading | None:
        return None if text is None else cls(text)


@dataclass(frozen=True)
class Level:
    """One calibration level: its name (calibrate's), kind, configuration (None: a name no configuration parses),
    dose on the check's scale, mean loss with its 90 % interval over `seeds` paired runs, and the ruler's reading."""

    name: str
    kind: str
    config: RolloutConfig | None
    dose: float
    loss: float
    loss_interval: tuple[float, float] | None
    seeds: int
    reading: Reading | None = None
    predicted: float | None = None

    def admits(self, tolerance: float) -> bool:
        """Its loss's upper end is within the tolerance."""
        return self.loss_interval is not None and self.loss_interval[1] <= tolerance

    def rejects(self, tolerance: float) -> bool:
        """Its loss's lower end is above the tolerance."""
        return self.loss_interval is not None and self.loss_interval[0] > tolerance

    def loss_text(self) -> str:
        lo, hi = self.loss_interval or (math.nan, math.nan)
        return f"{self.loss:+.1%} [{lo:+.1%}, {hi:+.1%}]"

    def seeds_to_decide(self, tolerance: float) -> int | None:
        """About how many seeds at this level would put its loss interval on one side of the tolerance 9 times in
        10, if the mean stays where it is (None: the mean is at the tolerance, or no interval)."""
        if self.loss_interval is None or self.seeds < 2 or self.loss == tolerance:
            return None
        lo, hi = self.loss_interval
        half = (hi - self.loss if self.loss < tolerance else self.loss - lo) / expansion(self.seeds, LEVEL)
        n = self.seeds * (half / abs(self.loss - tolerance)) ** 2 * decide_factor()
        return max(math.ceil(n - 1e-9), self.seeds + 1)

    def to_json(self) -> dict:
        return {
            "level": self.name,
            "kind": self.kind,
            "mismatch": self.dose,
            "loss": self.loss,
            "loss_interval": list(self.loss_interval) if self.loss_interval else None,
            "seeds": self.seeds,
            "reading": self.reading.value if self.reading else None,
        }


def levels_of(budget) -> list[Level]:
    """Every level of a calibrated budget, the mismatch-free one included, in the table's order (none for a number
    or a budget that records no levels)."""
    from ..sources.sources import parse_source

    names = {}
    for r in budget.runs or []:
        names.setdefault((str(r.get("kind", "noise")), _key(r.get("mismatch"))), str(r.get("level")))
    readings = {e["level"]: e for es in (budget.kinds or {}).values() for e in es}
    out = []
    for lv in budget.levels or []:
        kind = "none" if not lv.get("mismatch") else "noise"
        out.append(_level(lv, names.get((kind, _key(lv["mismatch"]))), kind, readings, parse_source))
    for lv in budget.other_levels or []:
        out.append(_level(lv, lv.get("level"), lv.get("kind"), readings, parse_source))
    seen = {x.name for x in out}
    for kind, es in (budget.kinds or {}).items():  # a budget written with its kinds' evidence alone
        for e in es:
            if e["level"] not in seen:
                out.append(_level({**e, "runs": e.get("seeds", 0)}, e["level"], kind, readings, parse_source))
    return out


def _key(x) -> float | None:
    return None if x is None else round(float(x), 12)


def _level(lv: dict, name, kind, readings, parse_source) -> Level:
    config = None
    if name is not None:
        try:
            config = parse_source(name).config
        except Exception:  # a level name no configuration parses: dose rules only
            config = None
    e = readings.get(name, {})
    li = lv.get("loss_interval")
    return Level(
        name=str(name) if name is not None else f"{kind} at {lv['mismatch']:.4g}",
        kind=str(kind),
        config=config,
        dose=float(lv["mismatch"]),
        loss=float(lv["loss"]),
        loss_interval=tuple(li) if li else None,
        seeds=int(lv.get("runs", lv.get("seeds", 0)) or 0),
        reading=Reading.of(e.get("reading")),
        predicted=e.get("predicted"),
    )
