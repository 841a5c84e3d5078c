"""Measure one configuration (a set of units in FP8, optionally an FP8 KV cache) on the rollouts."""

from __future__ import annotations

from .fp8 import KVCacheScheme, Scheme
from .mismatch import METRICS
from .reference import Reference
from .sweep import Row, measure_row


def measure(student, rollouts, scheme="FP8_DYNAMIC", units=None, kv=None, reference: Reference | None = None,
            batch_size: int = 8) -> dict[str, float]:
    """Mismatch metrics of `units` (names; all quantizable units when None) in `scheme`, plus an FP8 KV
    cache in every layer when `kv` is given ("fp8", "fp8_e5m2" or a KVCacheScheme), against the reference."""
    scheme = Scheme.from_name(scheme)
    kv_scheme = KVCacheScheme.from_name(kv) if kv is not None else KVCacheScheme()
    if reference is None:
        reference = Reference(student, rollouts, batch_size, kv_strategy=kv_scheme.strategy)
    names = [u.name for u in student.quantizable] if units is None else list(units)
    blocks = [student.unit(n).block for n in names]
    n_layers = student.model.config.num_hidden_layers
    kv_layers = list(range(n_layers)) if kv is not None else []
    start = 0 if kv_layers else (min(blocks) if blocks else n_layers - 1)
    row = Row("measure", "model", -1, "model", 0, 0, 0, start, names, kv_layers)
    result = measure_row(reference, student, row, scheme, kv_scheme)
    return {k: result[k] for k in METRICS}
