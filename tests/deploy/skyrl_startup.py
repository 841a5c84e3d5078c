"""SkyRL's own start-up checks on a written config, run inside a virtual environment where the released SkyRL wheel is
installed (tests/framework_venv.py): what `python3 -m skyrl.train.entrypoints.main_base` does with its arguments before
it starts Ray.

    VENV/bin/python skyrl_startup.py < [[override, ...], ...]

prints one JSON line, a list with one answer per job: {"ok": true, "engine_init_kwargs": {...}} (what SkyRL sets on
vLLM's parsed arguments) or {"ok": false, "error": "..."}. The checks, SkyRL 0.3.0's own code in main()'s order:
SkyRLTrainConfig.from_cli_overrides (OmegaConf.from_cli, the '+' refusal, the typed dataclasses and their
__post_init__) and skyrl.train.utils.validate_cfg.

SkyRL 0.3.0 declares Python >= 3.11 but its tinker types put a `typing.TypedDict` in a pydantic model, which pydantic
refuses below Python 3.12; this machine has 3.11, so `typing.TypedDict` is first set to typing_extensions' (the class
Python 3.12's typing has).
"""

from __future__ import annotations

import json
import sys
import typing

import typing_extensions

typing.TypedDict = typing_extensions.TypedDict


def run(overrides: list[str]) -> dict:
    from skyrl.train.config import SkyRLTrainConfig, get_config_as_dict
    from skyrl.train.utils import validate_cfg

    try:
        cfg = SkyRLTrainConfig.from_cli_overrides(overrides)
        validate_cfg(cfg)
        return {"ok": True, "engine_init_kwargs": get_config_as_dict(cfg.generator.inference_engine.engine_init_kwargs)}
    except BaseException as e:  # noqa: BLE001 - every failure is the answer
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


if __name__ == "__main__":
    print(json.dumps([run(job) for job in json.loads(sys.stdin.read())]))
