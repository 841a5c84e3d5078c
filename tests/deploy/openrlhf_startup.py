"""OpenRLHF's own start-up on a written command line: the `if __name__ == "__main__":` block of the released
`openrlhf/cli/train_ppo_ray.py` (its argument parser, `hierarchize`, and every check and default it applies), run up to
its last statement, `train(args)`, which starts Ray.

    python openrlhf_startup.py WHEEL_ROOT < [[arg, ...], ...]

prints one JSON line, a list with one answer per job: {"ok": true, "correction": {...}} (the importance-sampling
correction as the parsed arguments hold it) or {"ok": false, "error": "..."}. The module's own top-level imports (Ray,
DeepSpeed, vLLM through its trainer) are not needed by that block and are not run; `openrlhf.utils.config` (which
`hierarchize` lives in, and which imports only the standard library) is loaded from the wheel by path.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import sys
import types
from pathlib import Path


def main_block(wheel: Path):
    """The code of train_ppo_ray.py's `if __name__ == "__main__":` block, without its final `train(args)`."""
    src = next(wheel.rglob("openrlhf/cli/train_ppo_ray.py"))
    tree = ast.parse(src.read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    body = list(block.body)
    assert ast.unparse(body[-1]) == "train(args)", ast.unparse(body[-1])
    return compile(ast.Module(body[:-1], []), str(src), "exec")


def load_config(wheel: Path) -> None:
    path = next(wheel.rglob("openrlhf/utils/config.py"))
    spec = importlib.util.spec_from_file_location("openrlhf.utils.config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("openrlhf", "openrlhf.utils"):  # the packages' own __init__ import the trainers: not run
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["openrlhf.utils.config"] = module


def run(code, argv: list[str]) -> dict:
    import argparse
    import os
    from datetime import datetime

    ns = {"argparse": argparse, "os": os, "datetime": datetime, "__name__": "__main__"}
    sys.argv = ["train_ppo_ray.py", *argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            exec(code, ns)
    except SystemExit as e:  # argparse refuses the command line
        return {"ok": False, "error": f"SystemExit {e.code}: {err.getvalue().strip().splitlines()[-1:]}"}
    except BaseException as e:  # noqa: BLE001 - every failure is the answer
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    a = ns["args"].algo.advantage
    keys = ("is_correction_level", "is_correction_mode", "is_correction_threshold")
    return {"ok": True, "correction": {k: getattr(a, k) for k in keys}}


if __name__ == "__main__":
    wheel = Path(sys.argv[1])
    load_config(wheel)
    code = main_block(wheel)
    print(json.dumps([run(code, job) for job in json.loads(sys.stdin.read())]))
