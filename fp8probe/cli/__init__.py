"""The command line: `fp8probe COMMAND ...` (main.py parses, parser.py and options.py build the flags)."""

from .main import main  # noqa: F401
