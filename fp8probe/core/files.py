"""Writing output files so that a failed or killed command leaves nothing half-written behind.

Every file is written to a temporary name beside its target and renamed into place (atomic on POSIX):
a full disk or a kill mid-write leaves the previous version (or nothing), never half a file.
`output_dir` creates the output directory, holds a lock on it (a second command writing into the same
directory is refused while the first runs; the kernel drops the lock when a process dies, even by
SIGKILL), and, if the command fails, removes what it created, except the resume state (`*.partial.*`),
which exists precisely to survive a crash. When resume state survives, the exception carries the
directory in `resumable_dir`, so the CLI can say "rerun with --resume".
"""

from __future__ import annotations

import fcntl
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


@contextmanager
def atomic_dir(target: str | Path):
    """Build a directory under a temporary name beside `target`; on success it is renamed to `target` (which
    must not exist, or be empty), on failure removed. Yields the temporary path."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        yield tmp
        if target.exists():
            target.rmdir()  # empty, or this raises and the temporary is removed
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def waiting_lock(path: str | Path):
    """Hold an exclusive flock on the file `path` (created if missing) for the block, waiting while another process
    holds it; the kernel drops it when the holder dies, even by SIGKILL. For building something once that two
    processes may ask for at the same time (the second waits, then finds it built); `output_dir` refuses instead."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


def check_writable(path: str | Path) -> Path:
    """Fail early, in one line, when the output directory cannot be created or written."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise FP8ProbeError(f"output path {path} exists and is not a directory; choose another `out`")
    parent = p if p.exists() else next((a for a in p.parents if a.exists()), Path("."))
    if not parent.is_dir():
        raise FP8ProbeError(f"cannot create {path}: {parent} is a file, not a directory; choose another `out`")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FP8ProbeError(f"cannot write to {path}: {parent} is not writable; choose another `out`")
    return p


LOCK = ".fp8probe.lock"


def is_resume_state(path: Path) -> bool:
    return ".partial." in path.name


@contextmanager
def output_dir(path: str | Path, keep: tuple[str, ...] = ()):
    """Create `path` for a command's outputs, locked; on failure remove what this command added to it.

    Resume state survives: files named *.partial.*, and the `keep` names when such a file exists.
    """
    p = check_writable(path)
    created = not p.exists()
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FP8ProbeError(f"cannot create output directory {path}: {e.strerror}; choose another `out`") from e
    lock = _lock(p)
    before = set(p.iterdir())
    try:
        yield p
    except BaseException as e:
        added = [x for x in p.iterdir() if x not in before and x.name != LOCK]
        resumable = any(is_resume_state(x) for x in p.iterdir())
        for x in added:
            if is_resume_state(x) or (resumable and x.name in keep):
                continue
            shutil.rmtree(x) if x.is_dir() else x.unlink()
        if resumable:
            e.resumable_dir = str(p)
        _unlock(p, lock)
        if created and not any(p.iterdir()):
            p.rmdir()
        raise
    _unlock(p, lock)


def _lock(p: Path):
    """An exclusive, non-blocking flock on DIR/.fp8probe.lock; refuse when another command holds it."""
    while True:
        f = open(p / LOCK, "a")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise FP8ProbeError(
                f"another fp8probe command is writing into {p} right now; wait for it to finish or choose another `out`"
            ) from None
        try:
            if os.fstat(f.fileno()).st_ino == os.stat(p / LOCK).st_ino:
                return f  # still the file on disk, not one the previous holder unlinked on its way out
        except FileNotFoundError:
            pass
        f.close()


def _unlock(p: Path, f) -> None:
    (p / LOCK).unlink(missing_ok=True)
    f.close()
