"""Progress bars: lively on a terminal, sparse in a CI log."""

from __future__ import annotations

import sys


def bar_interval() -> float:
    """Seconds between progress-bar refreshes: lively on a terminal, sparse in a CI log."""
    return 0.2 if sys.stderr.isatty() else 20.0
