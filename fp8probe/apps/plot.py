"""`fp8probe plot`: every figure a run directory's files allow (plots/, reading only the files the commands write)."""

from __future__ import annotations


def run_plot(run_dir, out=None, fmt: str = "png") -> str:
    """`fp8probe plot`: every figure the files of `run_dir` allow; returns the summary line."""
    from ..plots import plot_run

    written = plot_run(run_dir, out, fmt)
    return f"plot: {len(written)} figures ({', '.join(written)}) -> {next(iter(written.values())).parent}"
