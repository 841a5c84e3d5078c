"""`fp8probe check --checkpoints`: a configuration across checkpoints of the student, on a tiny llama whose drift is
known: each checkpoint multiplies the final norm's weight (the logits' scale) by 1, 2, 4, so the same FP8 error
moves the next-token distribution more at every checkpoint (about the square of the scale)."""

import json

import pytest
import torch
from conftest import tiny_model, tiny_tokenizer

from fp8probe.recipe.recipe import Recipe


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from fp8probe import load_student

    root = tmp_path_factory.mktemp("series")
    out = []
    for k, scale in enumerate((1.0, 2.0, 4.0)):
        m = tiny_model("llama")
        with torch.no_grad():
            m.model.norm.weight.mul_(scale)
        d = root / f"step-{k}"
        m.save_pretrained(d)
        tiny_tokenizer().save_pretrained(d)
        out.append(d)
    st = load_student(str(out[0]))
    Recipe.whole_model(st.units, "FP8_DYNAMIC").write(root / "recipe")
    return out, root / "recipe" / "recipe.yaml"


def test_a_series_with_a_known_drift(cli, tmp_path, checkpoints):
    ckpts, recipe = checkpoints
    common = ["--recipe", recipe, "--num-prompts", 6, "--max-new-tokens", 8]
    # each checkpoint alone, by the plain check (its own rollouts, same prompts and seed)
    alone = []
    for i, c in enumerate(ckpts):
        r = cli("-q", "check", c, "--budget", 1.0, "--out", tmp_path / f"one-{i}", *common)
        assert r.code == 0, r.err
        alone.append(json.loads((tmp_path / f"one-{i}" / "check.json").read_text()))
    v = [a["measured"] for a in alone]
    assert v[0] < v[1] < v[2] and v[2] / v[0] > 4  # the drift is there (logits x 4: KL grows about x 16)
    budget = (alone[0]["measured_interval"][1] * alone[1]["measured_interval"][0]) ** 0.5
    assert alone[0]["measured_interval"][1] < budget < alone[1]["measured_interval"][0]
    r = cli("-q", "check", "--checkpoints", *ckpts, "--budget", budget, "--out", tmp_path / "s", *common)
    assert r.code == 1, (r.code, r.out, r.err)  # a checkpoint is rejected
    rep = json.loads((tmp_path / "s" / "series.json").read_text())
    rows = rep["checkpoints"]
    assert [x["verdict"] for x in rows] == ["ADMIT", "REJECT", "REJECT"]
    for x, a in zip(rows, alone):
        assert x["measured"] == pytest.approx(a["measured"], rel=1e-9)  # the same figure as the plain check
        assert x["measured_interval"] == pytest.approx(a["measured_interval"], rel=1e-9)
    assert rep["first_outside"] == str(ckpts[1])
    t = rep["trend"]
    assert t["ratio_last_first"] == pytest.approx(v[2] / v[0], rel=1e-9) and t["interval"][0] > 1
    assert t["reading"] == "grows"
    assert (tmp_path / "s" / "checkpoint-2" / "rollouts.json").exists()
    assert r.out.splitlines()[-1].startswith("trend: last / first")


def test_bad_series(cli, tmp_path, checkpoints):
    ckpts, recipe = checkpoints
    for args, match in [
        (("--checkpoints", ckpts[0]), "give at least two"),
        (("--checkpoints", ckpts[0], tmp_path / "nope"), "nope"),
        (("--checkpoints", *ckpts[:2], "--stale", ckpts[2]), "check stale weights one at a time"),
    ]:
        out = tmp_path / "o"
        r = cli("check", *args, "--recipe", recipe, "--budget", 1.0, "--out", out)
        assert r.code == 2 and len(r.lines) == 1 and match in r.lines[0], (args, r.err)
        assert not out.exists()
