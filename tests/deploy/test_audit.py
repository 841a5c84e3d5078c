"""`fp8probe audit`: an exported checkpoint against its recipe, and six defects planted in copies of it, each found
where it was planted (deploy/audit.py). The export is llm-compressor's (a tiny llama, static FP8 inputs and an FP8
KV cache, one block kept BF16); the module set is resolved as vLLM 0.32 resolves it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import planted_copy, tiny_model, tiny_student, tiny_tokenizer

from fp8probe.core.errors import FP8ProbeError
from fp8probe.deploy.audit import audit_checkpoint, engine_quantizes
from fp8probe.deploy.export import export
from fp8probe.model.rollouts import make_rollouts
from fp8probe.model.settings import ModelSource
from fp8probe.model.structure import fused_groups
from fp8probe.recipe.recipe import Recipe


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    tiny_model("llama").save_pretrained(root / "model")
    tiny_tokenizer().save_pretrained(root / "model")
    st = tiny_student("llama")  # the same weights, fp32
    r = make_rollouts(st, num_prompts=4, max_new_tokens=8, seed=0)
    groups = fused_groups(st.units)
    rec = Recipe.from_groups(st.units, "FP8", [g for g in groups if ".layers.1." not in g], kv_cache_dtype="fp8")
    rec.write(root / "recipe")
    ckpt = export(ModelSource(str(root / "model")), root / "recipe" / "recipe.yaml", root / "ckpt", rollouts=r).out
    return Path(ckpt), st


def test_the_clean_export_passes(exported):
    ckpt, st = exported
    a = audit_checkpoint(ckpt, student=st)
    assert a.findings == []
    n = len(st.quantizable)
    assert a.checked["modules"] == n and a.checked["engine_fp8"] == a.checked["recipe_fp8"] == n - 7
    assert a.checked["input_scales"] == n - 7 and a.checked["kv_scales"] == 2 * st.model.config.num_hidden_layers
    assert a.checked["weights"] == n - 7


def _rename(t):
    for k in [k for k in t if k.startswith("model.layers.0.mlp.down_proj.")]:
        t[k.replace("down_proj", "down_projx")] = t.pop(k)


def _double(t):
    t["model.layers.2.self_attn.o_proj.weight_scale"] = t["model.layers.2.self_attn.o_proj.weight_scale"] * 2


def _kv_reset(t):
    t["model.layers.0.self_attn.k_scale"] = torch.ones_like(t["model.layers.0.self_attn.k_scale"])


def _remove(t):
    del t["model.layers.2.mlp.up_proj.input_scale"]


DEFECTS = {
    "layer renamed": (dict(tensors=_rename), "tensors", "model.layers.0.mlp.down_proj"),
    "fused group split": (
        dict(config=lambda q: q["ignore"].append("model.layers.0.self_attn.k_proj")),
        "fused-split",
        "model.layers.0.self_attn.qkv_proj",
    ),
    "ignore entry dropped": (
        dict(config=lambda q: q["ignore"].remove("model.layers.1.mlp.down_proj")),
        "membership",
        "model.layers.1.mlp.down_proj",
    ),
    "weight scale doubled": (dict(tensors=_double), "weight-scale", "model.layers.2.self_attn.o_proj"),
    "KV scale reset to 1.0": (dict(tensors=_kv_reset), "kv-scale", "model.layers.0.self_attn.k_scale"),
    "scale removed": (dict(tensors=_remove), "input-scale", "model.layers.2.mlp.up_proj.input_scale"),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_each_planted_defect_is_found_where_it_was_planted(exported, tmp_path, defect):
    ckpt, st = exported
    edit, kind, where = DEFECTS[defect]
    bad = planted_copy(ckpt, tmp_path / "bad", **edit)
    a = audit_checkpoint(bad, student=st)
    assert any(f.kind == kind and f.where == where for f in a.findings), [f.line() for f in a.findings]
    # nothing far from the defect: every finding names the planted module (or its layer / tensor)
    stem = where.rsplit(".", 1)[0] if kind in ("kv-scale", "input-scale", "fused-split") else where
    assert all(f.where.startswith(stem) or stem.startswith(f.where) for f in a.findings), [f.line() for f in a.findings]


def test_a_plain_audit_checks_the_weights_against_the_student_the_export_recorded(exported, tmp_path):
    """export writes student.json (the model's name as an absolute path and the sha256 of its BF16 weights); a plain
    audit loads that student and checks every FP8 weight against it: one weight scale doubled is a finding without
    `model`. A student moved away, or changed since, is said so in one line and its weights are not checked. Seen
    failing with the recorded student ignored (the doubled scale read clean)."""
    import shutil

    from fp8probe.deploy.audit import recorded_student
    from fp8probe.model.identity import content_hash

    ckpt, st = exported
    rec = json.loads((ckpt / "student.json").read_text())
    assert rec["schema_version"] == 1 and rec["name"] == str((ckpt.parent / "model").resolve())
    assert rec["sha256"] == content_hash(st.model, round_to=torch.bfloat16)
    bad = planted_copy(ckpt, tmp_path / "bad", tensors=_double)
    a = audit_checkpoint(bad, student=recorded_student(bad)[0])
    assert [(f.kind, f.where) for f in a.findings] == [("weight-scale", "model.layers.2.self_attn.o_proj")]
    moved = tmp_path / "moved"
    shutil.copytree(bad, moved)
    rec["name"] = str(tmp_path / "gone")
    (moved / "student.json").write_text(json.dumps(rec))
    student, whose = recorded_student(moved)
    assert student is None and whose["status"].startswith("not at hand")
    other = tmp_path / "other"  # the same architecture, other weights
    tiny_model("llama", seed=1).save_pretrained(other)
    tiny_tokenizer().save_pretrained(other)
    rec["name"] = str(other)
    (moved / "student.json").write_text(json.dumps(rec))
    student, whose = recorded_student(moved)
    assert student is None and whose["status"].startswith("changed since the export")


def test_vllms_resolution_of_ignore_patterns():
    """The rules of vLLM 0.32's should_ignore_layer / find_matched_target, by hand: a fused layer follows its shards,
    a split is refused, "re:" patterns match from the start, the "Linear" target matches every linear layer."""
    qc = {"config_groups": {"g": {"targets": ["Linear"]}}, "ignore": ["lm_head", "re:.*layers\\.3\\..*"]}
    shards = [f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    assert engine_quantizes("model.layers.0.self_attn.qkv_proj", shards, qc) == (True, None)
    three = [s.replace("layers.0", "layers.3") for s in shards]
    assert engine_quantizes("model.layers.3.self_attn.qkv_proj", three, qc) == (False, None)
    split = dict(qc, ignore=[shards[1]])
    quantized, refused = engine_quantizes("model.layers.0.self_attn.qkv_proj", shards, split)
    assert not quantized and "k_proj ignored, q_proj, v_proj not" in refused
    mid = dict(qc, ignore=["re:layers\\.3"])  # re.match anchors at the start: this matches nothing
    assert engine_quantizes("model.layers.3.self_attn.qkv_proj", three, mid) == (True, None)
    named = {"config_groups": {"g": {"targets": ["re:.*mlp.*"]}}, "ignore": []}
    assert engine_quantizes("model.layers.0.self_attn.o_proj", ["model.layers.0.self_attn.o_proj"], named) == (
        False,
        None,
    )
    assert engine_quantizes("model.layers.0.mlp.down_proj", ["model.layers.0.mlp.down_proj"], named) == (True, None)


def test_the_command(cli, exported, tmp_path):
    """`fp8probe audit`: exit 0 clean and 1 with findings, one line per finding, audit.json; bad input one line, exit
    2, nothing written."""
    ckpt, _ = exported
    model = ckpt.parent / "model"
    r = cli("audit", ckpt, "--model", model, "--out", tmp_path / "a")
    assert r.code == 0 and r.out.startswith("clean: 21 Linear modules (14 in FP8"), (r.code, r.out, r.err)
    rep = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert rep["clean"] and rep["schema_version"] == 1 and rep["checked"]["weights"] == 14
    bad = planted_copy(
        ckpt, tmp_path / "bad", tensors=_kv_reset, config=lambda q: q["ignore"].remove("model.layers.1.mlp.down_proj")
    )
    r = cli("audit", bad, "--out", tmp_path / "b")  # no `model`: the student the export recorded
    lines = r.out.splitlines()
    assert r.code == 1 and lines[0].startswith("5 finding(s)") and "FP8 weights against the student's" in lines[0], (
        r.out
    )
    assert len(lines) == 6 and any(ln.startswith("kv-scale: model.layers.0.self_attn.k_scale") for ln in lines)
    rep = json.loads((tmp_path / "b" / "audit.json").read_text())
    assert len(rep["findings"]) == 5 and rep["student"]["status"].startswith("checked")
    for args, match in [
        ((tmp_path / "none",), "no such export directory"),
        ((model,), "no compressed-tensors quantization_config"),
        ((tmp_path,), "has no config.json"),
        ((ckpt, "--recipe", tmp_path / "none.yaml"), "no such recipe file"),
    ]:
        out = tmp_path / "c"
        r = cli("audit", *args, "--out", out)
        assert r.code == 2 and len(r.lines) == 1 and match in r.lines[0], (args, r.err)
        assert not out.exists()


@pytest.fixture(scope="module")
def all_targets(tmp_path_factory):
    """One export to every target of two recipes (block FP8 with block 0 kept, and vLLM's online FP8 made for
    SkyRL), as test_frameworks exports them."""
    root = tmp_path_factory.mktemp("audit-all")
    tiny_model("llama", num_key_value_heads=4, num_hidden_layers=4).save_pretrained(root / "model")
    tiny_tokenizer().save_pretrained(root / "model")
    st = tiny_student("llama", num_key_value_heads=4, num_hidden_layers=4)
    groups = fused_groups(st.units)
    keep = {"model.layers.0.", "model.layers.2.mlp.gate_up"}
    recipes = {
        "block": Recipe.from_groups(
            st.units, "FP8_BLOCK", [g for g in groups if not any(g.startswith(k) for k in keep)], kv_cache_dtype="fp8"
        ),
        "online": Recipe.from_groups(
            st.units, "FP8_TENSOR_DYNAMIC", list(groups), kv_cache_dtype="fp8", kv_scale="unit", target="skyrl"
        ),
    }
    paths = []
    for name, r in recipes.items():
        r.write(root / name)
        paths.append(root / name / "recipe.yaml")
    out = export(
        ModelSource(str(root / "model")),
        paths,
        root / "out",
        targets=["all"],
        rollouts=make_rollouts(st, num_prompts=4, max_new_tokens=6),
    ).out
    return Path(out), st


def test_every_framework_fragment_is_read_as_its_framework_reads_it(all_targets, tmp_path):
    ckpt, st = all_targets
    a = audit_checkpoint(ckpt, student=st)
    assert a.findings == [], [f.line() for f in a.findings]
    assert a.checked["frameworks"] == ["nemo-rl", "skyrl", "verl-sglang"]
    assert a.checked["framework_recipes"]["skyrl"].endswith("online/recipe.yaml")  # each target its own recipe
    fw = ckpt / "frameworks"

    def planted(name, edit):
        bad = tmp_path / f"{len(list(tmp_path.iterdir()))}-{name}"  # each plant its own copy
        shutil.copytree(ckpt, bad)
        f = bad / "frameworks" / name
        f.write_text(edit(f.read_text()))
        return [x for x in audit_checkpoint(bad, student=st).findings if x.kind == "framework"]

    # NeMo-RL's keyword for the kept gate/up dropped: it would quantize them
    text = (fw / "nemo-rl.yaml").read_text()
    assert "model.layers.2.mlp.gate_proj" in text
    got = planted("nemo-rl.yaml", lambda t: t.replace("- model.layers.2.mlp.gate_proj\n", ""))
    assert [f.where for f in got] == ["nemo-rl: model.layers.2.mlp.gate_proj"]
    # verl-SGLang's ignore list loses its first entry (block 0's modules, kept by the recipe)
    got = planted("verl-sglang.sh", lambda t: t.replace('IGNORED_LAYERS="', 'IGNORED_LAYERS="x.', 1))
    assert got and all(f.where.startswith("verl-sglang: model.layers.") for f in got)
    # ... and the other way round: an entry added that keeps an FP8 module of the recipe (block 3's o_proj) in BF16
    got = planted(
        "verl-sglang.sh", lambda t: t.replace('IGNORED_LAYERS="', 'IGNORED_LAYERS="model.layers.3.self_attn.o_proj,', 1)
    )
    assert [(f.where, f.message) for f in got] == [
        ("verl-sglang: model.layers.3.self_attn.o_proj", "the recipe puts it in FP8, verl-sglang keeps it BF16")
    ]
    # SkyRL's FP8 KV cache dropped
    got = planted("skyrl.sh", lambda t: "\n".join(ln for ln in t.splitlines() if "kv_cache_dtype" not in ln) + "\n")
    assert [f.where for f in got] == ["skyrl: kv_cache_dtype"]


def test_a_moe_checkpoint_is_refused_not_misread(tmp_path, tiny_dirs):
    """MoE experts' per-expert tensors are not resolved yet: one line says so instead of findings that are not."""
    d = tmp_path / "moe"
    shutil.copytree(tiny_dirs["qwen3_moe"], d)
    c = json.loads((d / "config.json").read_text())
    c["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {}, "ignore": []}
    (d / "config.json").write_text(json.dumps(c))
    st = tiny_student("qwen3_moe")
    (d / "recipe.yaml").write_text(Recipe.whole_model(st.units, "FP8_DYNAMIC").to_yaml())
    with pytest.raises(FP8ProbeError, match="MoE experts"):
        audit_checkpoint(d)
