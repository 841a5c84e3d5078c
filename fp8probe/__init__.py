"""fp8probe: per-layer FP8 sensitivity, mismatch-budgeted FP8 recipes, and what they buy in KV cache.

The public API is `__all__`. Names are imported on first use, so that `import fp8probe` (and the CLI's
`--help`) stays instant: torch, transformers and pandas load only when a function that needs them is
called. Importing the package touches no device and configures no logging.
"""

from __future__ import annotations

import importlib
import sys
import types

__version__ = "0.1.1"

# public name -> the module that is its one home
_HOMES = {
    "FP8ProbeError": "errors",
    "Scheme": "schemes",
    "KVCacheScheme": "schemes",
    "fake_quant": "fp8",
    "Student": "student",
    "Unit": "student",
    "load_student": "student",
    "Rollouts": "rollouts",
    "make_rollouts": "rollouts",
    "save_rollouts": "rollouts",
    "load_rollouts": "rollouts",
    "METRICS": "metrics",
    "mismatch": "mismatch",
    "Perturbation": "measure",
    "measure": "measure",
    "sweep": "sweep",
    "read_sweep": "runs",
    "Recipe": "recipe",
    "make_recipe": "selection",
    "read_recipe": "recipe",
    "capacity": "capacity",
    "export": "export",
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


class _Package(types.ModuleType):
    """Keeps `fp8probe.sweep` (and measure, capacity, export, mismatch) the public function: the import system
    binds a submodule to the package attribute of its name when it is first loaded, which would shadow it."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and _HOMES.get(name) == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
