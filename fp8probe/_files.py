"""Writing output files so that a failed or killed command leaves nothing half-written behind.

Every file is written to a temporary name beside its target and renamed into place (atomic on POSIX).
`output_dir` creates the output directory and, if the command fails, removes what it created, except
the resume state (`*.partial.*`), which exists precisely to survive a crash.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import FP8ProbeError


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def check_writable(path: str | Path) -> Path:
    """Fail early, in one line, when the output directory cannot be created or written."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise FP8ProbeError(f"output path {path} exists and is not a directory; choose another --out")
    parent = p if p.exists() else next((a for a in p.parents if a.exists()), Path("."))
    if not parent.is_dir():
        raise FP8ProbeError(f"cannot create {path}: {parent} is a file, not a directory; choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FP8ProbeError(f"cannot write to {path}: {parent} is not writable; choose another --out")
    return p


@contextmanager
def output_dir(path: str | Path, keep: tuple[str, ...] = ()):
    """Create `path` for a command's outputs; on failure remove what this command added to it.

    Resume state survives: files named *.partial.*, and the `keep` names when such a file exists.
    """
    p = check_writable(path)
    created = not p.exists()
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FP8ProbeError(f"cannot create output directory {path}: {e.strerror}; choose another --out") from e
    before = set(p.iterdir())
    try:
        yield p
    except BaseException:
        added = [x for x in p.iterdir() if x not in before]
        resumable = any(".partial." in x.name for x in p.iterdir())
        for x in added:
            if ".partial." in x.name or (resumable and x.name in keep):
                continue
            shutil.rmtree(x) if x.is_dir() else x.unlink()
        if created and not any(p.iterdir()):
            p.rmdir()
        raise


def bar_interval() -> float:
    """Seconds between progress-bar refreshes: lively on a terminal, sparse in a CI log."""
    import sys

    return 0.2 if sys.stderr.isatty() else 20.0
