"""Faults injected into a running sweep: SIGINT, SIGTERM, a second sweep into the same directory (lock), a
full disk. In each, nothing finished is lost, nothing half-written remains, and --resume ends with the table
an uninterrupted run writes, without measuring the finished rows again.
"""

from __future__ import annotations

import errno
import os
import signal
import time

import pandas as pd
import pytest
from conftest import cli_process, same_arithmetic

COMMON = ["--method", "exact", "--num-prompts", 6, "--max-new-tokens", 12, "--seed", 5]
SENTINEL = 12345.0


@pytest.fixture(scope="module")
def deep(deep_tiny_dir):
    return deep_tiny_dir


@pytest.fixture(scope="module")
def reference_table(deep, tmp_path_factory):
    """The directory of an uninterrupted sweep with the same settings (its table and run.json)."""
    out = tmp_path_factory.mktemp("full") / "full"
    p = cli_process("-q", "sweep", deep, "--out", out, *COMMON)
    assert p.wait(timeout=600) == 0, p.stderr.read()
    return out


def _wait_rows(partial, n, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if partial.exists() and partial.read_text().count("\n") > n:
            return
        assert proc.poll() is None, f"the sweep ended early: {proc.stderr.read()}"
        time.sleep(0.01)
    raise AssertionError("no rows appeared")


def _plant_sentinel(partial) -> str:
    """Overwrite one finished row's kl_q_p: if resume measured it again, the sentinel would be gone."""
    df = pd.read_csv(partial)
    unit = df["unit"].iloc[2]
    lines = partial.read_text().splitlines(keepends=True)
    cols = lines[0].rstrip("\n").split(",")
    k = cols.index("kl_q_p")
    for i, ln in enumerate(lines[1:], 1):
        parts = ln.rstrip("\n").split(",")
        if parts[0] == unit:
            parts[k] = repr(SENTINEL)
            lines[i] = ",".join(parts) + "\n"
    partial.write_text("".join(lines))
    return unit


def _resume_and_compare(deep, out, reference_table, sentinel_unit):
    p = cli_process("-q", "sweep", deep, "--out", out, "--resume", *COMMON)
    assert p.wait(timeout=600) == 0, p.stderr.read()
    got = pd.read_csv(out / "sensitivity.csv")
    want = pd.read_csv(reference_table / "sensitivity.csv")
    # compared exactly: both runs recorded the same arithmetic (conftest.cli_process: same flags and threads)
    assert same_arithmetic(out, reference_table)
    row = got["unit"] == sentinel_unit
    assert got.loc[row, "kl_q_p"].item() == SENTINEL, "resume measured a finished row again"
    got.loc[row, "kl_q_p"] = want.loc[row, "kl_q_p"]
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert not (out / "sensitivity.partial.csv").exists() and not (out / "sweep.partial.json").exists()
    assert not (out / ".fp8probe.lock").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_cleanly_and_resumes(deep, tmp_path, reference_table, sig):
    out = tmp_path / "run"
    p = cli_process("-q", "sweep", deep, "--out", out, *COMMON)
    partial = out / "sensitivity.partial.csv"
    _wait_rows(partial, 15, p)
    p.send_signal(sig)
    assert p.wait(timeout=120) == 130
    err = [ln for ln in p.stderr.read().splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("fp8probe: error: interrupted; finished rows are kept in"), err
    assert "--resume" in err[0]
    names = sorted(x.name for x in out.iterdir())
    assert names == ["rollouts.json", "rollouts.safetensors", "sensitivity.partial.csv", "sweep.partial.json"]
    assert partial.read_text().endswith("\n")  # no half-written row
    unit = _plant_sentinel(partial)
    _resume_and_compare(deep, out, reference_table, unit)


def test_lock_refuses_a_second_sweep_and_dies_with_its_holder(deep, tmp_path, reference_table):
    out = tmp_path / "run"
    first = cli_process("-q", "sweep", deep, "--out", out, *COMMON)
    partial = out / "sensitivity.partial.csv"
    _wait_rows(partial, 5, first)
    # stopped, it keeps its lock and its partial table while the second starts (running, it could finish first)
    os.kill(first.pid, signal.SIGSTOP)
    second = cli_process("-q", "sweep", deep, "--out", out, "--resume", *COMMON)
    assert second.wait(timeout=120) == 2
    err = second.stderr.read().strip()
    assert err.startswith("fp8probe: error: another fp8probe command is writing into") and "\n" not in err
    assert first.poll() is None and partial.exists(), "the refused sweep disturbed the running one"
    os.kill(first.pid, signal.SIGKILL)  # the kernel releases the lock of a killed process
    first.wait()
    unit = _plant_sentinel(partial)
    _resume_and_compare(deep, out, reference_table, unit)


def test_full_disk_keeps_finished_rows(cli, deep, tmp_path, reference_table, monkeypatch):
    """ENOSPC while appending row 8: one line, exit 2, 7 rows kept; then ENOSPC while writing the final table:
    the partial state survives again; with space back, --resume finishes with the uninterrupted table."""
    import fp8probe.core.files
    import fp8probe.sweeps.files as runs

    out = tmp_path / "run"
    real_append = runs.PartialWriter.append
    calls = {"n": 0}

    def append(self, row):
        calls["n"] += 1
        if calls["n"] == 8:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        return real_append(self, row)

    monkeypatch.setattr(runs.PartialWriter, "append", append)
    r = cli("-q", "sweep", deep, "--out", out, *COMMON)
    assert r.code == 2 and len(r.lines) == 1, r.err
    assert r.lines[0].startswith("fp8probe: error: no space left on device") and "--resume" in r.lines[0]
    assert "Traceback" not in r.err
    assert len(pd.read_csv(out / "sensitivity.partial.csv")) == 7
    assert not (out / "sensitivity.csv").exists() and not (out / "run.json").exists()
    monkeypatch.setattr(runs.PartialWriter, "append", real_append)

    real_write = fp8probe.core.files.atomic_write_bytes

    def full_for_table(path, data):
        if str(path).endswith("sensitivity.csv"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_write(path, data)

    monkeypatch.setattr(fp8probe.core.files, "atomic_write_bytes", full_for_table)
    r = cli("-q", "sweep", deep, "--out", out, "--resume", *COMMON)
    assert r.code == 2 and "no space left on device" in r.lines[0], r.err
    rows = pd.read_csv(out / "sensitivity.partial.csv")
    assert len(rows) == len(pd.read_csv(reference_table / "sensitivity.csv"))  # every row is safe
    assert not (out / "sensitivity.csv").exists()
    monkeypatch.setattr(fp8probe.core.files, "atomic_write_bytes", real_write)
    unit = _plant_sentinel(out / "sensitivity.partial.csv")
    _resume_and_compare(deep, out, reference_table, unit)


def test_atomic_write_keeps_the_old_file_on_a_full_disk(tmp_path, monkeypatch):
    from fp8probe.core.files import atomic_write_text

    target = tmp_path / "run.json"
    atomic_write_text(target, "old\n")
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        atomic_write_text(target, "new\n" * 1000)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temporary left behind
