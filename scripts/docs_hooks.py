"""mkdocs hooks.

- The figures the docs show live once, in recipes/ (written by recipes/regenerate.py); they are added to the site
  under the same paths instead of being copied into docs/.
- `<!-- settings: module.Class -->` in a page becomes the class's docstring and a table of its fields, read from
  the field declarations themselves (core/settings.py `opt`): the flag, the default, what is allowed, the help.
  The CLI builds its flags from the same declarations, so the table cannot drift from `--help`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"<!-- settings: ([\w.]+) -->")


def on_files(files, config):
    from mkdocs.structure.files import File  # mkdocs only here: the settings tables are read (and tested) without it

    for png in sorted((ROOT / "recipes").rglob("*.png")):
        files.append(File(str(png.relative_to(ROOT)), str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _allowed(f) -> str:
    from fp8probe.core.settings import choices_of

    m = f.metadata
    choices = choices_of(f)
    if choices is not None:
        return ", ".join(f"`{c}`" for c in choices)
    parts = []
    if m.get("low") is not None:
        parts.append(f"{'>' if m.get('open_low') else '>='} {m['low']}")
    if m.get("high") is not None:
        parts.append(f"<= {m['high']}")
    return ", ".join(parts)


def _default(cls, f) -> str:
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return "required"
    value = (
        cls.default(f.name)
        if f.metadata
        else (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
    )
    return f"`{value!r}`"


def settings_table(path: str) -> str:
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    lines = [
        f"## {name}",
        "",
        f"`{path}`",
        "",
        inspect.getdoc(cls) or "",
        "",
        "| field | flag | type | default | allowed | help |",
        "|---|---|---|---|---|---|",
    ]
    for f in dataclasses.fields(cls):
        if not f.init:  # derived in __post_init__ from the fields above (CheckSettings.verl from verl_async)
            continue
        m = f.metadata
        cli = m.get("cli", {}) if m else {}
        flag = (
            ""
            if not m
            else ("positional" if cli.get("positional") else f"`{cli.get('flag') or '--' + f.name.replace('_', '-')}`")
        )
        kind = f.type.replace(" | ", " or ")
        lines.append(
            f"| `{f.name}` | {flag} | `{kind}` | {_cell(_default(cls, f))} | {_cell(_allowed(f))} | "
            f"{_cell(m.get('help', '') if m else '')} |"
        )
    return "\n".join(lines)


SELF_CHECK = "<!-- self-consistency -->"


def self_consistency_table() -> str:
    """Every level of every shipped budget (recipes/*/calibration*/budget-*.json) checked as `check` checks it, beside
    the verdict its own loss implies (budget/evidence.py self_check): rendered at build time from the shipped files."""
    import json

    from fp8probe.budget.admission import self_check
    from fp8probe.budget.fit import read_budget

    lines = [
        "| budget | level | dose (check's 90 % interval) | its own loss | implied | check | judged on |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in sorted(ROOT.glob("recipes/*/calibration*/budget-*.json")):
        b = read_budget(str(path))
        f = path.parent / "doses.json"
        doses = json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}
        name = f"{path.parent.name}/{path.name}"
        for r in self_check(b, doses):
            lo, hi = r["interval"]
            lines.append(
                f"| {name} | `{r['level']}` | {r['dose']:.4g} [{lo:.4g}, {hi:.4g}] | {r['loss']} ({r['seeds']} "
                f"seeds) | {r['implied']} | {r['verdict']} | {_cell(r['judged_on'])} |"
            )
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    if SELF_CHECK in markdown:
        markdown = markdown.replace(SELF_CHECK, self_consistency_table())
    return MARK.sub(lambda m: settings_table(m.group(1)), markdown)
