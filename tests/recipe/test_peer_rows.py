"""The peer table scores every ModelOpt mode on the judge's rows (#55): benchmarks/modelopt_worker.py hands ModelOpt's
`forward_step` the logits of exactly the positions fp8probe's judge scores (those that predict a response token: no
prompt, no padding), and the gradient mode's loss is the cross-entropy of those tokens. Checked against fp8probe's own
reference rows (measurement/reference.response_rows), without ModelOpt: the worker imports it only to run."""

from __future__ import annotations

import torch
from conftest import benchmark, tiny_student

from fp8probe.measurement.reference import response_rows
from fp8probe.model.rollouts import make_rollouts


def _worker():
    return benchmark("modelopt_worker")


def test_every_mode_scores_the_judges_rows_only():
    """Prompts of different lengths padded to one batch (as the worker batches the search rollouts): the rows every
    mode's KL or loss sums over are the judge's, row for row; a prompt or pad row would add rows. Seen failing with
    forward_step returning every position's logits (the earlier worker's)."""
    worker = _worker()
    st = tiny_student("llama")
    r = make_rollouts(st, num_prompts=6, max_new_tokens=7, seed=0)
    assert (r.attention_mask == 0).any() and ((r.attention_mask == 1) & (r.response_mask == 0)).any()
    batch = {"input_ids": r.input_ids, "attention_mask": r.attention_mask, "response_mask": r.response_mask}
    with torch.no_grad():
        rows = worker.forward_step(st.model, batch)
        want, tokens = response_rows(st.model, r, batch_size=r.num_sequences)
    assert rows.shape == (r.num_response_tokens, want.shape[1])
    assert torch.allclose(rows.float(), want, atol=1e-5)
    loss = worker.loss_func(rows, batch)
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(want, tokens), atol=1e-6)


def test_the_search_set_sized_like_a_users_leaves_the_held_out_prompts_unseen():
    """benchmarks/search_prompts.py: 128 distinct search prompts, the quick start's 16 first, none of them among the
    24 built-in prompts the peer table judges on; the same file on every call (a fixed seed). Seen failing with the
    generator allowed to return built-in prompts (the held-out ones among them)."""
    from fp8probe.model.prompts import BUILTIN_PROMPTS

    mod = benchmark("search_prompts")
    got = mod.search_prompts(128)
    assert len(got) == len(set(got)) == 128
    assert got[:16] == BUILTIN_PROMPTS[:16]
    assert not set(got) & set(BUILTIN_PROMPTS[16:]) and len(BUILTIN_PROMPTS[16:]) == 24
    assert mod.search_prompts(128) == got and mod.search_prompts(16) == BUILTIN_PROMPTS[:16]


def test_a_size_solved_from_modelopts_checkpoint_is_timed_as_the_scoring_it_reused(tmp_path):
    """--reuse-scores: ModelOpt's checkpoint after calibration alone (empty candidate_stats, as ModelOpt saves it
    before scoring) is not a finished scoring; one with stats is. The first size keeps its seconds beside the
    checkpoint; a size that restored it is timed as that scoring (what one recipe costs a user), its own solve kept
    apart; scores made on other rollouts live in another file. Seen failing with any existing checkpoint taken as
    restored, with the solve's seconds kept as the size's time, and with the checkpoint keyed by the mode alone."""
    import json

    worker, vs = _worker(), benchmark("vs_modelopt")
    ckpt = tmp_path / "search.pth"
    assert not worker._has_scores(None) and not worker._has_scores(str(ckpt))
    torch.save({"candidate_stats": {}, "quantizer_states": {"x": 1}}, ckpt)
    assert not worker._has_scores(str(ckpt))
    torch.save({"candidate_stats": {"layers.0.mlp": {"scores": [0.5, 0.0]}}}, ckpt)
    assert worker._has_scores(str(ckpt))

    first, later, scoring = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "search.json"
    first.write_text(json.dumps({"seconds": 812.5, "effective_bits": 15.25, "restored": False}))
    vs._share_search_time(first, scoring)
    later.write_text(json.dumps({"seconds": 3.25, "effective_bits": 14.5, "restored": True, "fp8_modules": ["m"]}))
    vs._share_search_time(later, scoring)
    got = json.loads(later.read_text())
    assert got["seconds"] == 812.5 and got["solve_seconds"] == 3.25 and got["scored_at_bits"] == 15.25
    assert got["fp8_modules"] == ["m"] and json.loads(first.read_text())["seconds"] == 812.5

    st = tiny_student("llama")
    a, b = (make_rollouts(st, num_prompts=3, max_new_tokens=4, seed=s) for s in (0, 1))
    assert vs.search_stem(tmp_path, "aumann_shapley:8", a) == vs.search_stem(tmp_path, "aumann_shapley:8", a)
    assert vs.search_stem(tmp_path, "gradient", a) != vs.search_stem(tmp_path, "gradient", b)
