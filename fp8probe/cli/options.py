"""Flags from the library's settings (core/settings.py): one --flag per field, its type, bounds, choices and help
from the field itself; and settings back from the parsed flags."""

from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, fields

from ..core.settings import choices_of, out_of_bounds


def number(kind, low=None, open_low=False, high=None):
    """An argparse type: a finite int/float within bounds, with a message that says what is allowed."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        why = out_of_bounds(v, low, high, open_low)
        if why:
            raise argparse.ArgumentTypeError(f"{text!r} {why}" if "finite" in why else f"{text} {why}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _scalar(annotation: str):
    return next((t for name, t in (("int", int), ("float", float)) if re.search(rf"\b{name}\b", annotation)), str)


def add_settings(p, cls, **overrides):
    """One argument per field of `cls` that has settings metadata (`overrides`: other defaults by field name)."""
    groups = {}
    for f in fields(cls):
        m = f.metadata
        if not m:
            continue
        cli = m["cli"]
        default = overrides.get(f.name, cls.default(f.name))
        kw = {"help": m["help"], "dest": f.name}
        if cli.get("metavar"):
            kw["metavar"] = cli["metavar"]
        if "bool" in f.type:
            kw["action"] = "store_false" if default else "store_true"
        else:
            kind = _scalar(f.type)
            kw["type"] = number(kind, m["low"], m["open_low"], m["high"]) if kind is not str else str
            if default is not MISSING:  # a required setting has no default to show
                kw["default"] = list(default) if isinstance(default, tuple) else default
            if "tuple" in f.type:
                kw["nargs"] = cli.get("nargs", "*")
            if choices_of(f) is not None:
                kw["choices"] = choices_of(f)
        if cli.get("positional"):
            kw.pop("dest")
            p.add_argument(f.name, nargs="?", **kw)
            continue
        where = p
        if cli.get("group"):
            if cli["group"] not in groups:
                groups[cli["group"]] = p.add_mutually_exclusive_group(required=cli.get("required", False))
            where = groups[cli["group"]]
        elif cli.get("required"):
            kw["required"] = True
        where.add_argument(cli.get("flag") or "--" + f.name.replace("_", "-"), *cli.get("aliases", ()), **kw)


def settings_from(cls, args, **extra):
    """An instance of `cls` from the parsed flags (lists back to tuples); `extra`: fields the flags do not set."""
    kw = {f.name: getattr(args, f.name) for f in fields(cls) if f.metadata and hasattr(args, f.name)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}, **extra)
