"""The command line's flags, built from the command table (commands.py) and the library's settings (options.py).
Imports no torch: `fp8probe --help` is instant."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..core.errors import EXIT_USAGE
from ..deploy.frameworks import TARGETS
from .commands import COMMANDS
from .options import add_settings

TARGET_LINES = "\n".join(f"  {t.name:<17} {t.form:<10} {t.how}" for t in TARGETS.values())


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that points at --help, like every other error."""

    def error(self, message: str):
        print(f"fp8probe: error: {message}; see `{self.prog} --help`", file=sys.stderr)
        sys.exit(EXIT_USAGE)


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # a default worth showing: not None, not empty, not a switch's
        shown = action.default is not None and action.default != [] and action.nargs != 0
        return super()._get_help_string(action) if shown else action.help


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="fp8probe",
        description="Per-layer FP8 sensitivity and mismatch-budgeted FP8 recipes for RL / "
        "on-policy-distillation students.",
    )
    ap.add_argument("--version", action="version", version=f"fp8probe {__version__}")
    verb = ap.add_mutually_exclusive_group()
    verb.add_argument("-q", "--quiet", action="store_true", help="only warnings and the final summary")
    verb.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for name, c in COMMANDS.items():
        epilog = ["examples:", *(f"  fp8probe {e}" for e in c.examples)] if c.examples else []
        epilog += (
            ["targets (what each rollout framework can apply; its file under OUT/frameworks/):", TARGET_LINES]
            if name == "export"
            else []
        )
        p = sub.add_parser(name, help=c.help, epilog="\n".join(epilog) or None, formatter_class=_Help)
        for flag, kw in c.flags:
            p.add_argument(flag, **kw)
        for cls in c.settings:
            add_settings(p, cls)
    return ap


def flags_of(ap: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """Settings fields (argparse dests) -> the flag that sets them (MODEL for the positional): `command`'s own, then
    any other command's (an error may point at another command's setting: "a sweep run with --method exact")."""
    subs = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices
    out = {}
    for name in [n for n in subs if n != command] + [command]:
        out.update(
            {
                a.dest: a.option_strings[0] if a.option_strings else a.dest.upper()
                for a in subs[name]._actions
                if a.option_strings or name == command
            }
        )
    return out
