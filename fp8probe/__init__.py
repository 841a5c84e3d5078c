"""fp8probe: per-layer FP8 sensitivity, mismatch-budgeted FP8 recipes, and what they buy in KV cache.

The public API is `__all__`. Names are imported on first use, so that `import fp8probe` (and the CLI's
`--help`) stays instant: torch, transformers and pandas load only when a function that needs them is
called. Importing the package touches no device and configures no logging.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.1"

# public name -> the module that is its one home (below this package)
_HOMES = {
    "FP8ProbeError": "core.errors",
    "Scheme": "core.schemes",
    "KVCacheScheme": "core.schemes",
    "fake_quant": "core.numerics",
    "Student": "model.student",
    "Unit": "model.student",
    "load_student": "model.student",
    "Rollouts": "model.rollouts",
    "make_rollouts": "model.rollouts",
    "save_rollouts": "model.rollouts",
    "load_rollouts": "model.rollouts",
    "METRICS": "core.metrics",
    "mismatch": "measurement.mismatch",
    "Perturbation": "measurement.measure",
    "measure": "measurement.measure",
    "sweep": "sweeps.sweep",
    "read_sweep": "sweeps.files",
    "Recipe": "recipe.recipe",
    "make_recipe": "recipe.selection",
    "read_recipe": "recipe.recipe",
    "capacity": "deploy.capacity",
    "export": "deploy.export",
}

__all__ = ["__version__", *_HOMES]


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fp8probe' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_HOMES))
