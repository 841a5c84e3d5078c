"""Every mismatch source on one scale: the ladder (one row per source, every metric, measured on the same rollouts
against one reference; a combination's row also carries the sum of its parts, so that (non-)additivity shows)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.metrics import METRICS
from .settings import LadderSettings
from .sources import Source

if TYPE_CHECKING:
    from ..measurement.reference import Reference
    from ..model.settings import RolloutSettings


def ladder(
    student,
    rollouts,
    sources: list[Source],
    settings: LadderSettings = LadderSettings(prefix_shift=False),
    *,
    teacher=None,
    reference: Reference | None = None,
    sampling: RolloutSettings | None = None,
    progress: bool = False,
):
    """One row per source with every metric (METRICS), measured on the same rollouts against one reference;
    a combination's row adds `sum_of_parts` (its parts' kl_q_p added up). With the settings' `prefix_shift`, the
    prefix shift of each source (prefix.PREFIX_COLUMNS: continuations of `sampling`'s response length and seed, else
    the rollouts' own length and seed 0); with a `teacher`, its OPD-signal distortion (opd.OPD_COLUMNS); every figure
    as the shortcuts' engine computes it (measure.measure), in batches of `sampling`'s size (else 8). The
    sources are given (the apps build them from the settings: the noise ruler, the shortcuts, their combination).
    Returns a DataFrame."""
    import pandas as pd
    from tqdm.auto import tqdm

    from ..measurement.measure import measure
    from ..measurement.opd import OPD_COLUMNS, OPDSignal
    from ..measurement.prefix import PREFIX_COLUMNS, PrefixShift
    from ..measurement.reference import Reference

    engine = settings.shortcuts.engine
    batch_size = sampling.batch_size if sampling is not None else 8
    if reference is None:
        reference = Reference(student, rollouts, batch_size)
    shift = PrefixShift.sampled_as(student, reference, rollouts, sampling, engine) if settings.prefix_shift else None
    opd = OPDSignal(student, teacher, reference, engine) if teacher is not None else None
    rows, by_name = [], {}
    for s in tqdm(sources, desc="ladder", unit="source", disable=not progress):
        m = measure(reference, student, rollouts, s.perturbation, engine, batch_size).metrics
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
