"""`fp8probe export`: a vLLM checkpoint (llm-compressor) and each RL framework's rollout config for recipes
(deploy/export.py), with what the export could not do logged as warnings."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..deploy.frameworks.verl import VerlSettings
from ..model.settings import ModelSource

if TYPE_CHECKING:  # the CLI imports this module for --help: deploy/export.py loads torch
    from ..deploy.export import Exported

log = logging.getLogger(__name__)


def run_export(
    source: ModelSource,
    recipes,
    out,
    rollouts: str | None = None,
    max_model_len: int | None = None,
    targets=("vllm",),
    verl: VerlSettings | None = None,
) -> Exported:
    """Export the student `source` names under `recipes` into `out` for `targets` (calibrating static scales on the
    `rollouts` of a sweep directory when a recipe needs them; verl's OPD and fully-async targets as `verl` says);
    returns deploy.export's Exported (a Result: the plan per target)."""
    from ..deploy.export import export
    from ..model.rollouts import load_rollouts

    done = export(
        source,
        recipes,
        out,
        rollouts=load_rollouts(rollouts) if rollouts else None,
        max_model_len=max_model_len,
        targets=targets,
        verl=verl,
    )
    for w in done.warnings():
        log.warning("%s", w)
    return done
