"""The vLLM venv is built once when two processes ask for it at once (CI prefetches it while its fast suite
runs): the second waits on the lock and reuses the first's venv. The builder is stood in for (no pip): it records
each build."""

from __future__ import annotations

import threading
import time
from pathlib import Path


def test_two_callers_at_once_build_the_venv_once(tmp_path, monkeypatch):
    from fp8probe.deploy import vllm_check

    builds = []

    def fake_run(cmd, check=False, **kw):
        if cmd[1:3] == ["-m", "venv"]:  # `python -m venv ROOT`: slow enough that the other caller arrives meanwhile
            builds.append(cmd[3])
            time.sleep(0.3)
            (Path(cmd[3]) / "bin").mkdir(parents=True)
            (Path(cmd[3]) / "bin" / "python").write_text("")
        return None

    monkeypatch.setenv("FP8PROBE_VLLM_VENV", str(tmp_path / "venv"))
    monkeypatch.setattr(vllm_check.subprocess, "run", fake_run)
    got = []
    threads = [threading.Thread(target=lambda: got.append(vllm_check.vllm_venv())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert got == [tmp_path / "venv" / "bin" / "python"] * 2
    assert (tmp_path / "venv" / ".fp8probe-ready").exists()
