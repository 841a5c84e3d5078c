"""Every mismatch source on one scale: the ladder (one row per source, every metric, measured on the same rollouts
against one reference; a combination's row also carries the sum of its parts, so that (non-)additivity shows)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.metrics import METRICS
from .settings import LadderSettings
from .sources import Source

if TYPE_CHECKING:
    from ..measurement.bench import Bench


def ladder(
    bench: Bench,
    sources: list[Source],
    settings: LadderSettings = LadderSettings(prefix_shift=False),
    *,
    teacher=None,
    progress: bool = False,
):
    """One row per source with every metric (METRICS), measured on the bench's rollouts against its one reference;
    a combination's row adds `sum_of_parts` (its parts' kl_q_p added up). With the settings' `prefix_shift`, the
    prefix shift of each source (prefix.PREFIX_COLUMNS: continuations of the bench's response length and seed);
    with a `teacher`, its OPD-signal distortion (opd.OPD_COLUMNS); every figure as the shortcuts' engine computes it
    (measure.measure), in the bench's batches. The sources are given (the apps build them from the settings: the
    noise ruler, the shortcuts, their combination). Returns a DataFrame."""
    import pandas as pd
    from tqdm.auto import tqdm

    from ..measurement.measure import measure
    from ..measurement.opd import OPD_COLUMNS, OPDSignal
    from ..measurement.prefix import PREFIX_COLUMNS, PrefixShift

    engine = settings.shortcuts.engine
    shift = PrefixShift.sampled_as(bench, engine) if settings.prefix_shift else None
    opd = OPDSignal(bench.student, teacher, bench.reference(), engine) if teacher is not None else None
    rows, by_name = [], {}
    for s in tqdm(sources, desc="ladder", unit="source", disable=not progress):
        m = measure(bench, s.perturbation, engine=engine).metrics
        by_name[s.name] = m
        parts = [by_name[p]["kl_q_p"] for p in s.parts if p in by_name]
        row = {
            "source": s.name,
            "kind": s.kind,
            "sigma": s.value if s.value is not None else float("nan"),
            **{k: m[k] for k in METRICS},
            "sum_of_parts": sum(parts) if s.parts and len(parts) == len(s.parts) else float("nan"),
        }
        if shift is not None:
            row.update(shift.measure(s.perturbation))
        if opd is not None:
            row.update(opd.measure(s.perturbation))
        rows.append(row)
    columns = LADDER_COLUMNS + (PREFIX_COLUMNS if shift else []) + (OPD_COLUMNS if opd else [])
    return pd.DataFrame(rows, columns=columns)


LADDER_COLUMNS = ["source", "kind", "sigma", *METRICS, "sum_of_parts"]
