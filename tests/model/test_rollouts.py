"""Rollouts on a tiny model: masks, EOS handling, determinism, the file round trip, prompt files."""

import json

import pytest
import torch
from conftest import tiny_model, tiny_tokenizer

from fp8probe import FP8ProbeError
from fp8probe.model.rollouts import load_rollouts, make_rollouts, read_prompts, save_rollouts
from fp8probe.model.structure import list_units
from fp8probe.model.student import Student


@pytest.fixture(scope="module")
def student():
    m = tiny_model("llama")
    return Student(
        model=m, tokenizer=tiny_tokenizer(), units=list_units(m), name="tiny-llama", path="", model_type="llama"
    )


def test_masks_and_layout(student):
    r = make_rollouts(student, num_prompts=5, max_new_tokens=10, batch_size=2)
    n, t = r.input_ids.shape
    assert n == 5 and r.input_ids.dtype == torch.int64
    tok = student.tokenizer
    for i in range(n):
        am, resp, ids = r.attention_mask[i], r.response_mask[i], r.input_ids[i]
        length = int(am.sum())
        assert am[:length].all() and not am[length:].any()  # right-padded
        assert (ids[length:] == tok.pad_token_id).all()
        start = int(resp.nonzero()[0])
        assert resp[start:length].all() and not resp[:start].any() and not resp[length:].any()
        assert 1 <= length - start <= 10
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": r.meta.prompts[i]}], add_generation_prompt=True, tokenize=True
        )
        prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
        assert ids[:start].tolist() == list(prompt)
        assert (ids[start : length - 1] != 2).all()  # an EOS, if sampled, only at the end
    assert r.num_response_tokens == int(r.response_mask.sum())


def test_eos_ends_a_response():
    """With the EOS logit raised by 4.5 (about one step in six), most responses end on a sampled EOS: it is kept as
    the response's last token, nothing follows it, and the others run to --max-new-tokens."""
    import torch

    m = tiny_model("llama")
    bias = torch.zeros(m.config.vocab_size)
    bias[2] = 4.5
    m.lm_head.register_forward_hook(lambda mod, args, out: out + bias)
    st = Student(model=m, tokenizer=tiny_tokenizer(), units=list_units(m), name="eos", path="", model_type="llama")
    r = make_rollouts(st, num_prompts=8, max_new_tokens=12, seed=0)
    ended = 0
    for i in range(r.num_sequences):
        resp = r.input_ids[i][r.response_mask[i].bool()]
        eos = (resp == 2).nonzero().flatten().tolist()
        assert eos in ([], [len(resp) - 1])  # at most one, and last
        assert eos or len(resp) == 12
        assert int(r.attention_mask[i].sum()) == int(r.response_mask[i].nonzero()[-1]) + 1  # nothing after it
        ended += bool(eos)
    assert ended >= 4, f"only {ended} of 8 responses sampled an EOS"


def test_same_seed_same_tokens(student):
    a = make_rollouts(student, num_prompts=4, max_new_tokens=8, seed=3)
    b = make_rollouts(student, num_prompts=4, max_new_tokens=8, seed=3)
    c = make_rollouts(student, num_prompts=4, max_new_tokens=8, seed=4)
    assert torch.equal(a.input_ids, b.input_ids)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_round_trip(student, tmp_path):
    r = make_rollouts(student, num_prompts=3, max_new_tokens=6)
    save_rollouts(r, tmp_path)
    back = load_rollouts(tmp_path)
    for k in ("input_ids", "attention_mask", "response_mask"):
        assert torch.equal(getattr(back, k), getattr(r, k))
    meta = json.loads((tmp_path / "rollouts.json").read_text())
    assert meta["seed"] == 0 and meta["sampling"]["temperature"] == 1.0 and len(meta["prompts"]) == 3
    assert meta["num_response_tokens"] == r.num_response_tokens
    from safetensors import safe_open

    with safe_open(str(tmp_path / "rollouts.safetensors"), "pt") as f:  # plain safetensors, no pickle
        assert set(f.keys()) == {"input_ids", "attention_mask", "response_mask"}


def test_prompt_files(tmp_path):
    (tmp_path / "p.txt").write_text("first prompt\n\n  second prompt  \n")
    assert read_prompts(tmp_path / "p.txt") == ["first prompt", "second prompt"]
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"text": "b"}\n')
    assert read_prompts(tmp_path / "p.jsonl") == ["a", "b"]
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(FP8ProbeError, match="empty"):
        read_prompts(tmp_path / "empty.txt")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(FP8ProbeError, match="bad.jsonl:2 is not valid JSON"):
        read_prompts(tmp_path / "bad.jsonl")
    with pytest.raises(FP8ProbeError, match="no rollouts"):
        load_rollouts(tmp_path)


def test_split_holds_out_whole_prompts_reproducibly(student):
    """Every k-th distinct prompt, with all of its samples, is held out; the two sets partition the sequences, keep
    their tokens, and split the same way twice; too few prompts are refused in one line."""
    r = make_rollouts(student, num_prompts=6, max_new_tokens=5, samples_per_prompt=2)
    groups = r.prompt_groups().tolist()
    search, held, doc = r.split(3)
    assert doc["heldout_sequences"] == [i for i, g in enumerate(groups) if g in (2, 5)]  # prompts 2 and 5 of 0..5
    assert sorted(doc["search_sequences"] + doc["heldout_sequences"]) == list(range(r.num_sequences))
    assert (doc["search_prompts"], doc["heldout_prompts"]) == (4, 2)
    assert search.num_response_tokens + held.num_response_tokens == r.num_response_tokens
    assert doc["heldout_tokens"] == held.num_response_tokens
    for part, seqs in ((search, doc["search_sequences"]), (held, doc["heldout_sequences"])):
        for j, i in enumerate(seqs):
            n = int(r.attention_mask[i].sum())
            assert torch.equal(part.input_ids[j, :n], r.input_ids[i, :n])
            assert torch.equal(part.response_mask[j, :n], r.response_mask[i, :n])
    assert r.split(3)[2] == doc
    assert not r.can_split(4) and r.can_split(2)  # 6 // 4 = 1 held-out prompt is too few
    with pytest.raises(FP8ProbeError, match="too few to hold out"):
        r.split(4)
