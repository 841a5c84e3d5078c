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


def _verl_parquet(path, prompts, key="prompt"):
    """A parquet as verl's data preprocessing writes one (written by `datasets`, as verl's scripts do): the
    `key` column holds each prompt's chat messages (verl/utils/dataset/rl_dataset.py reads example[prompt_key] as the
    messages), beside data_source, ability, reward_model and extra_info."""
    from datasets import Dataset

    rows = [
        {
            "data_source": "openai/gsm8k",
            key: [{"role": "user", "content": p}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i, p in enumerate(prompts)
    ]
    Dataset.from_list(rows).to_parquet(str(path))


def test_prompts_from_verls_parquet_sample_what_the_same_messages_sample(student, tmp_path):
    """verl's parquet (its prompt column of chat messages, or another one named by `prompt_key`) gives the very
    rollouts the same messages give from JSONL; a missing column is one line naming the columns there are."""
    prompts = ["What is 2 + 3?", "Name a prime above 10.", "Spell cat backwards."]
    _verl_parquet(tmp_path / "train.parquet", prompts)
    _verl_parquet(tmp_path / "q.parquet", prompts, key="question")
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n" for p in prompts)
    )
    want = read_prompts(tmp_path / "p.jsonl")
    assert read_prompts(tmp_path / "train.parquet") == want == read_prompts(tmp_path / "q.parquet", "question")
    a = make_rollouts(student, read_prompts(tmp_path / "train.parquet"), max_new_tokens=6, seed=3)
    b = make_rollouts(student, tmp_path / "p.jsonl", max_new_tokens=6, seed=3)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.response_mask, b.response_mask)
    with pytest.raises(FP8ProbeError, match="has no column 'prompt' \\(it has data_source, question"):
        read_prompts(tmp_path / "q.parquet")


def test_chat_template_kwargs_reach_the_template(student, tmp_path):
    """verl's apply_chat_template_kwargs: keywords the chat template reads (here a template that writes a marker when
    `think` is set) change the prompt's tokens, and rollouts.json records them; bad JSON fails on construction."""
    from dataclasses import replace

    from fp8probe.model.settings import RolloutSettings

    tok = tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if think %} think{% endif %}"
    st = replace(student, tokenizer=tok)
    settings = RolloutSettings(num_prompts=2, max_new_tokens=4, chat_template_kwargs='{"think": true}')
    plain = make_rollouts(st, None, RolloutSettings(num_prompts=2, max_new_tokens=4).sampling())
    thought = make_rollouts(st, None, settings.sampling())
    first = lambda r: r.input_ids[0][(r.attention_mask[0] == 1) & (r.response_mask[0] == 0)].tolist()  # noqa: E731
    assert first(thought)[: len(first(plain))] == first(plain) and len(first(thought)) > len(first(plain))
    assert thought.meta.sampling["chat_template_kwargs"] == {"think": True}
    assert "chat_template_kwargs" not in plain.meta.sampling
    for bad in ("{think", "[1]"):
        with pytest.raises(FP8ProbeError, match="chat_template_kwargs"):
            RolloutSettings(chat_template_kwargs=bad)
