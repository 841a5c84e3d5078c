"""Rollout frameworks: one module each registers what its engine can apply (a Target) and the config fragment it
reads (a renderer); base.py holds the registry, `express` (a recipe in a framework's terms) and `render`.
Adding a framework touches one file here and the import below."""

from .base import (
    IS_CLIP,
    RENDERERS,
    TARGETS,
    Expression,
    Inexpressible,
    Target,
    TargetSettings,
    express,
    ignore_keywords,
    recipe_form,
    render,
    resolve_targets,
)
from . import vllm, verl, nemo_rl, slime, openrlhf, trl, skyrl  # noqa: E402,F401  (registration order)

__all__ = [
    "IS_CLIP",
    "RENDERERS",
    "TARGETS",
    "Expression",
    "Inexpressible",
    "Target",
    "TargetSettings",
    "express",
    "ignore_keywords",
    "recipe_form",
    "render",
    "resolve_targets",
]
