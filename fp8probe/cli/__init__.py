"""The command line: `fp8probe COMMAND ...` (main.py)."""

from .main import main

__all__ = ["main"]
