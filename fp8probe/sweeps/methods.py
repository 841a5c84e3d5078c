"""How a sweep scores its rows, as a registry (torch-free: the CLI lists the names for --help):

    exact   the reference pass, then every row measured against it
    fisher  every row estimated from one pass with backward (measurement/fisher.py): no reference, no exact row
    auto    the estimate, then the `top_k` highest estimates, `controls` other rows drawn at random and the
            whole-model rows measured exactly

SweepSettings (settings.py) holds a run's settings; its `kind` says what runs. The memory model (memory.py) and the
sweep itself read the kind's `reference` and `estimate`, `by` names the estimate (sweep.ESTIMATES) and `exact`
picks the rows measured exactly. The path attribution (`path`) left the package for benchmarks/path_sweep.py: no
better than the fisher estimate at any size measured on either student (docs/modelopt.md); the rows it writes still
read as estimated (ESTIMATED).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class MethodKind:
    name: str
    words: str  # what the sweep does, in the log
    reference: bool  # the reference pass runs (and its per-block records are held)
    estimate: bool  # the fast estimate runs
    exact: Callable  # (rows, estimates, SweepSettings, seed) -> the units measured exactly
    recorded: tuple[str, ...] = ()  # what run.json records beside the name (SweepSettings.recorded)
    by: str = "fisher"  # which estimate, where `estimate`

    @property
    def measures(self) -> bool:
        """Whether any row is measured exactly (what Ray workers do: sweeps/scaleout.py)."""
        return self.exact is not _no_row


def _every_row(rows, estimates, settings, seed) -> set[str]:
    return {r.unit for r in rows}


def _no_row(rows, estimates, settings, seed) -> set[str]:
    return set()


def top_and_controls(rows, estimates, settings, seed) -> set[str]:
    """The rows --method auto measures exactly: the whole-model rows, the settings' `top_k` highest estimates and
    `controls` of the others drawn at random (with `seed`), which show how far the estimate holds below the top."""
    units = [r.unit for r in rows if r.kind != "model"]
    ranked = sorted(units, key=lambda u: -estimates[u])  # stable: ties keep model order
    top = ranked[: settings.top_k]
    rest = ranked[settings.top_k :]
    controls = random.Random(seed).sample(rest, min(settings.controls, len(rest)))
    return {*top, *controls, *(r.unit for r in rows if r.kind == "model")}


_ESTIMATE = ("samples", "estimator", "seed")
METHODS: dict[str, MethodKind] = {
    m.name: m
    for m in (
        MethodKind("exact", "reference pass and sweep", reference=True, estimate=False, exact=_every_row),
        MethodKind("fisher", "fast estimate", reference=False, estimate=True, exact=_no_row, recorded=_ESTIMATE),
        MethodKind(
            "auto",
            "reference pass, fast estimate, exact top rows",
            reference=True,
            estimate=True,
            exact=top_and_controls,
            recorded=(*_ESTIMATE, "top_k", "controls"),
        ),
    )
}
# the `method` of a sensitivity.csv row that holds an estimate, not a measurement ("path": benchmarks/path_sweep.py)
ESTIMATED = ("fisher", "path")
