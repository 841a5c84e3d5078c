"""fp8probe: per-layer FP8 sensitivity, mismatch-budgeted FP8 recipes, and what they buy in KV cache.

The public API is `__all__`. Names are imported on first use, so that `import fp8probe` (and the CLI's
`--help`) stays instant: torch, transformers and pandas load only when a function that needs them is
called. Importing the package touches no device and configures no logging.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.1"

# public name -> the module that is its one home (below this package). Three tiers: the objects and functions a
# notebook composes (students, rollouts, measurements, recipes), the settings a run is described by, and the entry
# points the CLI itself calls (each validates its settings before it writes anything, and writes its own files).
_HOMES = {
    # objects and functions
    "FP8ProbeError": "core.errors",
    "Scheme": "core.schemes",
    "KVCacheScheme": "core.schemes",
    "fake_quant": "core.numerics",
    "METRICS": "core.metrics",
    "Student": "model.student",
    "Unit": "model.structure",
    "load_student": "model.student",
    "Rollouts": "model.rollouts",
    "make_rollouts": "model.rollouts",
    "save_rollouts": "model.rollouts",
    "load_rollouts": "model.rollouts",
    "mismatch": "measurement.mismatch",
    "Perturbation": "measurement.perturbation",
    "Bench": "measurement.bench",
    "measure": "measurement.measure",
    "Measured": "measurement.measure",
    "measure_scheme": "measurement.measure",
    "Reference": "measurement.reference",
    "sweep": "sweeps.sweep",
    "read_sweep": "sweeps.files",
    "Recipe": "recipe.recipe",
    "make_recipe": "recipe.selection",
    "RecipeContext": "recipe.settings",
    "read_recipe": "recipe.recipe",
    "check": "budget.admission",
    "capacity": "deploy.capacity",
    "export": "deploy.export",
    "plan": "planning.plan",
    # settings (typed, validated on construction; the CLI's flags are generated from them)
    "ModelSource": "model.settings",
    "RolloutSettings": "model.settings",
    "SweepSettings": "sweeps.settings",
    "MeasureSettings": "measurement.settings",
    "RecipeSettings": "recipe.settings",
    "TargetSettings": "deploy.frameworks.base",
    "Shortcuts": "sources.shortcuts",
    "LadderSettings": "sources.settings",
    "CheckSettings": "budget.settings",
    "Serving": "deploy.serving",
    "CapacitySettings": "deploy.serving",
    "BudgetSettings": "budget.settings",
    "TrainSettings": "training.settings",
    "CalibrateSettings": "training.settings",
    "PlanSettings": "planning.plan",
    # entry points: one per command
    "run_rollouts": "apps.inputs",
    "run_sweep": "apps.sweep",
    "run_measure": "apps.measure",
    "run_recipe": "apps.recipe",
    "run_export": "apps.export",
    "run_ladder": "apps.ladder",
    "run_check": "apps.check",
    "run_series": "apps.series",
    "run_audit": "apps.audit",
    "run_capacity": "apps.capacity",
    "run_budget": "apps.budget",
    "run_calibrate": "apps.calibrate",
    "run_plan": "apps.plan",
    "run_plot": "apps.plot",
    "run_units": "apps.inputs",
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
