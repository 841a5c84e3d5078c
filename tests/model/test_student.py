"""Units and fused groups for every supported architecture, and the embedded student."""

import pytest
from conftest import ARCHS, tiny_model

from fp8probe import FP8ProbeError, load_student
from fp8probe.model.structure import list_units


@pytest.mark.parametrize("arch", ARCHS)
def test_units_and_groups(arch):
    model = tiny_model(arch)
    units = list_units(model)
    q = [u for u in units if u.quantizable]
    blocks = {u.block for u in q}
    assert blocks == {0, 1, 2}
    kinds0 = sorted(u.kind for u in q if u.block == 0)
    kinds1 = sorted(u.kind for u in q if u.block == 1)
    if arch == "phi3":  # checkpoints are already fused
        assert kinds0 == ["down", "gate_up", "o", "qkv"]
    elif arch == "mixtral":
        assert kinds0 == ["expert", "k", "o", "q", "v"]
    elif arch == "qwen3_moe":  # layer 0 is dense (mlp_only_layers), the others MoE
        assert kinds0 == ["down", "gate", "k", "o", "q", "up", "v"]
        assert kinds1 == ["expert", "k", "o", "q", "v"]
    else:
        assert kinds0 == ["down", "gate", "k", "o", "q", "up", "v"]
    by_name = {u.name: u for u in units}
    for u in q:
        if u.kind in ("q", "k", "v", "qkv"):
            assert u.group == f"model.layers.{u.block}.self_attn.qkv_proj"
        elif u.kind in ("gate", "up", "gate_up"):
            assert u.group == f"model.layers.{u.block}.mlp.gate_up_proj"
        elif u.kind == "expert":
            assert u.group == u.name == f"model.layers.{u.block}.mlp.experts"
            assert (
                u.params
                == model.get_submodule(u.name).gate_up_proj.numel() + model.get_submodule(u.name).down_proj.numel()
            )
        else:
            assert u.group == u.name
        if u.kind != "expert":
            assert u.params == model.get_submodule(u.name).weight.numel()
    kept = {u.kind for u in units if not u.quantizable}
    assert {"embed", "lm_head"} <= kept
    if arch in ("mixtral", "qwen3_moe"):
        assert "router" in kept
    assert all(u.name in by_name for u in units)


@pytest.mark.parametrize("arch", ["llama", "phi3", "qwen3_moe"])
def test_load_tiny_dir(tiny_dirs, arch):
    s = load_student(str(tiny_dirs[arch]))
    assert s.model_type == arch
    assert s.tokenizer.pad_token is not None
    assert len(s.groups()) >= 9


@pytest.mark.slow  # the real embedded student
def test_embedded_student(embedded):
    q = embedded.quantizable
    assert len(q) == 30 * 7
    assert {u.block for u in q} == set(range(30))
    groups = embedded.groups()
    assert len(groups) == 30 * 4
    assert [u.kind for u in groups["model.layers.0.self_attn.qkv_proj"]] == ["q", "k", "v"]
    assert [u.kind for u in groups["model.layers.29.mlp.gate_up_proj"]] == ["gate", "up"]
    assert embedded.unit("model.layers.0.self_attn.q_proj").shape == (576, 576)
    assert embedded.unit("model.layers.0.self_attn.k_proj").shape == (192, 576)
    assert embedded.unit("model.layers.0.mlp.down_proj").params == 576 * 1536
    head = embedded.unit("lm_head")
    assert not head.quantizable and head.group == "model.embed_tokens"  # tied: counted once
    assert embedded.tokenizer.eos_token == "<|im_end|>" and embedded.tokenizer.eos_token_id == 2


def test_bad_inputs(tmp_path):
    with pytest.raises(FP8ProbeError, match="no such file"):
        load_student(str(tmp_path / "missing_dir/"))
    with pytest.raises(FP8ProbeError, match="no such GGUF"):
        load_student(str(tmp_path / "x.gguf"))
    (tmp_path / "notmodel").mkdir()
    with pytest.raises(FP8ProbeError, match="no config.json"):
        load_student(str(tmp_path / "notmodel"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(FP8ProbeError, match="not a GGUF"):
        load_student(str(bad))
    with pytest.raises(FP8ProbeError, match="not in the local Hugging Face cache"):
        load_student("nobody/no-such-model")


def test_truncated_gguf(tmp_path, tiny_gguf):
    cut = tmp_path / "cut.gguf"
    with open(tiny_gguf, "rb") as f:
        cut.write_bytes(f.read(1_000_000))  # the tensor's data cut short
    with pytest.raises(FP8ProbeError, match="truncated or corrupt"):
        load_student(str(cut))


def test_unsupported_architecture(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50).save_pretrained(tmp_path)
    with pytest.raises(FP8ProbeError, match=r"unsupported architecture 'gpt2'; fp8probe supports .*Llama"):
        load_student(str(tmp_path))
