"""`fp8probe audit` on a real export of the embedded student (llm-compressor, FP8_DYNAMIC weights with an FP8 KV
cache calibrated on its rollouts, the first and last blocks and one down_proj BF16): the clean export passes, and
six defects planted in copies of it are each found where they were planted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import planted_copy

from fp8probe.deploy.audit import audit_checkpoint
from fp8probe.deploy.export import export
from fp8probe.model.rollouts import make_rollouts
from fp8probe.model.settings import ModelSource
from fp8probe.model.structure import fused_groups
from fp8probe.recipe.recipe import Recipe

pytestmark = pytest.mark.slow  # the real embedded student and llm-compressor

KEPT = ("model.layers.0.", "model.layers.29.", "model.layers.1.mlp.down_proj")


@pytest.fixture(scope="module")
def exported(embedded, tmp_path_factory):
    root = tmp_path_factory.mktemp("audit-embedded")
    groups = fused_groups(embedded.units)
    rec = Recipe.from_groups(
        embedded.units, "FP8_DYNAMIC", [g for g in groups if not g.startswith(KEPT)], kv_cache_dtype="fp8"
    )
    rec.write(root / "recipe")
    r = make_rollouts(embedded, num_prompts=4, max_new_tokens=8, seed=0)
    ckpt = export(ModelSource(), root / "recipe" / "recipe.yaml", root / "ckpt", rollouts=r).out
    return Path(ckpt)


def _rename(t):
    for k in [k for k in t if k.startswith("model.layers.5.mlp.down_proj.")]:
        t[k.replace("down_proj", "down_projx")] = t.pop(k)


def _double(t):
    t["model.layers.7.self_attn.o_proj.weight_scale"] *= 2


def _kv(t):
    t["model.layers.3.self_attn.v_scale"] = torch.ones_like(t["model.layers.3.self_attn.v_scale"])


def _remove(t):
    del t["model.layers.9.mlp.up_proj.weight_scale"]


DEFECTS = {
    "layer renamed": (dict(tensors=_rename), "tensors", "model.layers.5.mlp.down_proj"),
    "fused group split": (
        dict(config=lambda q: q["ignore"].append("model.layers.4.mlp.up_proj")),
        "fused-split",
        "model.layers.4.mlp.gate_up_proj",
    ),
    "ignore entry dropped": (
        dict(config=lambda q: q["ignore"].remove("model.layers.1.mlp.down_proj")),
        "membership",
        "model.layers.1.mlp.down_proj",
    ),
    "weight scale doubled": (dict(tensors=_double), "weight-scale", "model.layers.7.self_attn.o_proj"),
    "KV scale reset to 1.0": (dict(tensors=_kv), "kv-scale", "model.layers.3.self_attn.v_scale"),
    "scale removed": (dict(tensors=_remove), "tensors", "model.layers.9.mlp.up_proj"),
}


def test_the_clean_export_passes_and_every_planted_defect_is_found(embedded, exported, tmp_path):
    clean = audit_checkpoint(exported, student=embedded)
    assert clean.findings == [], [f.line() for f in clean.findings]
    n = len(embedded.quantizable)
    assert clean.checked["engine_fp8"] == clean.checked["recipe_fp8"] == clean.checked["weights"] == n - 15
    assert clean.checked["kv_scales"] == 60
    for name, (edit, kind, where) in DEFECTS.items():
        bad = planted_copy(exported, tmp_path / name.replace(" ", "-"), **edit)
        # the weight check only where it is what finds the defect (it reads every FP8 weight: the slow part)
        a = audit_checkpoint(bad, student=embedded if kind == "weight-scale" else None)
        assert any(f.kind == kind and f.where == where for f in a.findings), (name, [f.line() for f in a.findings])
        shutil.rmtree(bad)
