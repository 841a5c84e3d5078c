"""Progress bars: lively on a terminal, sparse in a CI log."""

from __future__ import annotations

import sys
import warnings


def bar_interval() -> float:
    """Seconds between progress-bar refreshes: lively on a terminal, sparse in a CI log."""
    return 0.2 if sys.stderr.isatty() else 20.0


def quiet_dependencies() -> None:
    """Warnings off, transformers' own logging and progress bars off: a command's output is fp8probe's lines."""
    warnings.filterwarnings("ignore")
    try:
        from transformers.utils import logging as tlog

        tlog.set_verbosity_error()
        tlog.disable_progress_bar()
    except ImportError:
        pass
