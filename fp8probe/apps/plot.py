"""`fp8probe plot`: every figure a run directory's files allow (plots/, reading only the files the commands write)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.results import Result


def run_plot(run_dir, out=None, fmt: str = "png") -> PlotResult:
    """`fp8probe plot`: every figure the files of `run_dir` allow."""
    from ..plots import plot_run

    written = plot_run(run_dir, out, fmt)
    return PlotResult(next(iter(written.values())).parent, written)


@dataclass(frozen=True)
class PlotResult(Result):
    figures: dict  # figure name -> its file

    def describe(self, seconds: float) -> str:
        return f"plot: {len(self.figures)} figures ({', '.join(self.figures)}) -> {self.out}"
