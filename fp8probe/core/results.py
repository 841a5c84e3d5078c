"""What every entry point of apps/ returns: `run_x(inputs, settings, out) -> XResult`, a dataclass holding what the
command made and where its files went (`out`, None where it writes none), that says what the command prints
(`describe(seconds)`, given the command's wall time) and with which exit code it ends (`exit_code`, core/errors.py:
0 unless the command documents others, as check does). The CLI prints one and exits with the other; a library caller
reads the fields."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import EXIT_OK


@dataclass(frozen=True)
class Result:
    out: Path | None

    @property
    def exit_code(self) -> int:
        return EXIT_OK

    def describe(self, seconds: float) -> str:
        raise NotImplementedError(f"{type(self).__name__} does not say what its command prints")
