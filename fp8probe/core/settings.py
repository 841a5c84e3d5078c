"""Typed settings: frozen dataclasses whose fields declare their help, bounds and choices once.

    @dataclass(frozen=True)
    class RolloutSettings(Settings):
        num_prompts: int = opt(16, "use the first N prompts", low=1)

A Settings is validated on construction (a bad value raises FP8ProbeError naming the field: `num_prompts`), and the
CLI builds its flags from the same fields (cli/options.py), so the library, its help and the command line cannot
drift apart. Fields that name something parsed (a scheme, an engine) hold the name and check it on construction;
the parsed object is a property, made once.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, field, fields

from .errors import FP8ProbeError


def opt(default=MISSING, help: str = "", *, low=None, high=None, open_low: bool = False, choices=None, **cli):
    """A settings field: its default, one line of help, numeric bounds (`low`, `high`; `open_low`: > low), the
    values it takes (`choices`: a collection, or a callable giving one), and how the command line spells it
    (`cli`: flag="--no-kv" for a negated switch, aliases=("--old-name",) for other spellings a flag answers to,
    positional=True, metavar, group=NAME for one-of groups)."""
    meta = {"help": help, "low": low, "high": high, "open_low": open_low, "choices": choices, "cli": cli}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda d=tuple(default): d, metadata=meta)
    return field(default=default, metadata=meta)


def out_of_bounds(v, low=None, high=None, open_low: bool = False) -> str | None:
    """Why number `v` is not allowed ("must be >= 1"), or None."""
    if isinstance(v, float) and not math.isfinite(v):
        return "is not a finite number"
    if low is not None and (v <= low if open_low else v < low):
        return f"must be {'>' if open_low else '>='} {low}"
    if high is not None and v > high:
        return f"must be <= {high}"
    return None


def choices_of(f) -> list | None:
    c = f.metadata.get("choices")
    return list(c() if callable(c) else c) if c is not None else None


class Settings:
    """Base of every settings dataclass: bounds and choices of each field checked on construction."""

    def __post_init__(self):
        for f in fields(self):
            value, m = getattr(self, f.name), f.metadata
            if value is None or not m:
                continue
            values = value if isinstance(value, tuple) else (value,)
            allowed = choices_of(f)
            for v in values:
                if allowed is not None and v not in allowed:
                    raise FP8ProbeError(f"`{f.name}` {v!r} is not one of {', '.join(map(str, allowed))}")
                why = (
                    None
                    if isinstance(v, bool) or not isinstance(v, (int, float))
                    else out_of_bounds(v, m.get("low"), m.get("high"), m.get("open_low"))
                )
                if why:
                    raise FP8ProbeError(f"`{f.name}` {v} {why}")

    @classmethod
    def default(cls, name: str):
        """A field's default (what the CLI shows as its flag's default)."""
        f = next(f for f in fields(cls) if f.name == name)
        return f.default_factory() if f.default_factory is not MISSING else f.default
