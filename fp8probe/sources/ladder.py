"""Every mismatch source on one scale: the ladder (one row per source, every metric, measured on the same rollouts
against one reference; a combination's row also carries the sum of its parts, so that (non-)additivity shows)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.metrics import METRICS
from .sources import Source

if TYPE_CHECKING:
    from ..measurement.reference import Reference


def ladder(student, rollouts, sources: list[Source], reference: Reference | None = None, batch_size: int = 8,
           progress: bool = False, prefix_tokens: int | None = None, prefix_seed: int = 0, teacher=None,
           engine: str = "sim"):
    """One row per source with every metric (METRICS), measured on the same rollouts against one reference;
    a combination's row adds `sum_of_parts` (its parts' kl_q_p added up). With `prefix_tokens`, the prefix
    shift of each source (prefix.PREFIX_COLUMNS); with a `teacher`, its OPD-signal distortion
    (opd.OPD_COLUMNS); every figure as `engine` computes it (measure.candidate_model). Returns a DataFrame."""
    import pandas as pd
    from tqdm.auto import tqdm

    from ..measurement.measure import measure_candidate
    from ..measurement.opd import OPD_COLUMNS, OPDSignal
    from ..measurement.prefix import PREFIX_COLUMNS, PrefixShift, prompt_ids
    from ..measurement.reference import Reference

    if reference is None:
        reference = Reference(student, rollouts, batch_size)
    shift = PrefixShift(student, reference, prompt_ids(student, rollouts), prefix_tokens, seed=prefix_seed,
                        batch_size=batch_size, engine=engine) if prefix_tokens else None
    opd = OPDSignal(student, teacher, reference, engine) if teacher is not None else None
    rows, by_name = [], {}
    for s in tqdm(sources, desc="ladder", unit="source", disable=not progress):
        m = measure_candidate(reference, student, rollouts, s.perturbation, engine, batch_size)
        by_name[s.name] = m
        parts = [by_name[p]["kl_q_p"] for p in s.parts if p in by_name]
        row = {"source": s.name, "kind": s.kind, "sigma": s.value if s.value is not None else float("nan"),
               **{k: m[k] for k in METRICS},
               "sum_of_parts": sum(parts) if s.parts and len(parts) == len(s.parts) else float("nan")}
        if shift is not None:
            row.update(shift.measure(s.perturbation))
        if opd is not None:
            row.update(opd.measure(s.perturbation))
        rows.append(row)
    columns = LADDER_COLUMNS + (PREFIX_COLUMNS if shift else []) + (OPD_COLUMNS if opd else [])
    return pd.DataFrame(rows, columns=columns)


LADDER_COLUMNS = ["source", "kind", "sigma", *METRICS, "sum_of_parts"]
