"""matplotlib figures for the files fp8probe writes (figures.py), and `plot_run`, which draws every figure a run
directory's files allow (`fp8probe plot RUN_DIR`)."""

from .figures import (
    budget_fit,
    calibration_plot,
    capacity_bars,
    fast_exact_pair,
    fast_vs_exact,
    frontier,
    ladder_plot,
    plan_plot,
    plot_run,
    predicted_frontier,
    recipes_of,
    sensitivity_by_block,
    sensitivity_heatmap,
    token_kl,
)

__all__ = [
    "budget_fit",
    "calibration_plot",
    "capacity_bars",
    "fast_exact_pair",
    "fast_vs_exact",
    "frontier",
    "plan_plot",
    "ladder_plot",
    "plot_run",
    "predicted_frontier",
    "recipes_of",
    "sensitivity_by_block",
    "sensitivity_heatmap",
    "token_kl",
]
