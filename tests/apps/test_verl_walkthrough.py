"""The verl OPD walkthrough (docs/verl-opd.md) runs as written, in order, on the embedded student: its Python blocks
execute, each `$ fp8probe ...` line runs through the command line with the exit code its printed lines imply, and
every line the page shows as printed is among what the command printed (numbers aside: they differ by a few ulps
between CPUs). `$ cat FILE` shows the file's lines the same way."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "verl-opd.md"
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?")


def steps() -> list[tuple[str, str, list[str]]]:
    """The page's blocks in order: ("python", source, []) or ("$", command, the lines shown after it)."""
    out = []
    for lang, body in re.findall(r"```(python|console)\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S):
        if lang == "python":
            out.append(("python", body, []))
            continue
        for line in body.splitlines():
            if line.startswith("$ "):
                out.append(("$", line[2:], []))
            else:
                out[-1][2].append(line)
    return out


def _shape(line: str) -> str:
    return NUMBER.sub("#", line.strip())


def _exit_code(shown: list[str]) -> int:
    """What the shown lines say the command exits with (core/errors.py's codes)."""
    first = shown[0] if shown else ""
    if first.startswith("fp8probe: error:"):
        return 2
    return {"REJECT": 1, "UNCERTAIN": 3}.get(first.split(":")[0], 0)


@pytest.mark.slow
def test_verl_walkthrough_runs_as_written(cli, tmp_path, monkeypatch, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="fp8probe")  # the log lines a terminal shows on stderr
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")  # the shipped budgets, where the page names them
    ran = steps()
    commands = [c for kind, c, _ in ran if kind == "$"]
    assert [c.split()[1] for c in commands if c.startswith("fp8probe")] == [
        "sweep",
        "recipe",
        "recipe",
        "check",
        "export",
        "audit",
        "budget",
        "check",
        "check",
    ]
    for kind, text, shown in ran:
        if kind == "python":
            exec(compile(text, str(PAGE), "exec"), {})
            continue
        args = shlex.split(text)
        if args[0] == "cat":
            printed = (tmp_path / args[1]).read_text().splitlines()
        else:
            assert args[0] == "fp8probe", text
            caplog.clear()
            r = cli(*args[1:])
            assert r.code == _exit_code(shown), (text, r.code, r.err[-2000:])
            printed = (r.out + r.err).splitlines() + [x.getMessage() for x in caplog.records]
        have = {_shape(x) for x in printed}
        for line in shown:
            if line.strip() and line.strip() != "...":
                assert _shape(line) in have, (text, line)
    # the files each step hands the next
    assert (tmp_path / "runs/opd/export/frameworks/verl-opd.sh").exists()
    assert (tmp_path / "runs/opd/verl-budget/runs.csv").exists()
    assert (tmp_path / "runs/opd/check/check.json").exists()
