"""The KV cache per layer as recipe units (#75): each layer's FP8 KV cache a candidate beside the weight groups, its
bytes counted at the user's KV tokens in flight; the layers left out written as vLLM's kv_cache_dtype_skip_layers,
read back by the audit, named in the configuration's text."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ask, tiny_student

from fp8probe import FP8ProbeError
from fp8probe.core.schemes import KVCacheScheme, Scheme
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.measure import measure
from fp8probe.measurement.perturbation import Perturbation
from fp8probe.model.rollouts import make_rollouts
from fp8probe.recipe.recipe import Recipe, read_recipe
from fp8probe.recipe.selection import group_scores, make_recipe
from fp8probe.sources.config import RolloutConfig
from fp8probe.sweeps.sweep import sweep


@pytest.fixture(scope="module")
def setup():
    st = tiny_student("llama", num_hidden_layers=4)
    r = make_rollouts(st, num_prompts=6, max_new_tokens=10)
    bench = Bench(st, r)
    return st, r, bench, sweep(bench).table


def test_a_kv_layer_is_priced_at_the_workload():
    """A kv row saves its per-token bytes times the tokens in flight; its score is its row's metric."""
    kv_row = "model.layers.0.self_attn.kv_cache"
    cols = ["unit", "kind", "block", "group", "params", "bytes_saved", "kv_bytes_saved_per_token", "kl_q_p"]
    df = pd.DataFrame(
        [["m.layers.0.mlp.down_proj", "down", 0, "g0", 100, 100, 0, 0.01], [kv_row, "kv", 0, kv_row, 0, 0, 64, 0.002]],
        columns=cols,
    )
    assert [g.group for g in group_scores(df)] == ["g0"]  # without a workload, no KV candidates
    weights, kv = group_scores(df, kv_tokens=1000)
    assert (kv.kv_layer, kv.bytes_saved, kv.score, kv.units, kv.params) == (0, 64_000, 0.002, [], 0)
    assert weights.kv_layer is None and weights.bytes_saved == 100


def test_the_workload_decides_which_kv_layers_are_fp8(setup):
    """At a budget half the whole FP8 KV cache's mismatch, a large workload (KV bytes outweigh weights) puts more
    layers' KV cache in FP8 than a small one; the recipe's measured figure is its perturbation's, measured here
    directly with the layers it names (those not skipped)."""
    st, r, bench, df = setup
    budget = float(df[df.unit == "model.fp8_all_kv"].kl_q_p.iloc[0]) * 0.5
    small = make_recipe(df, bench, ask(budget, kv_cache_dtype="fp8", kv_tokens=1))
    large = make_recipe(df, bench, ask(budget, kv_cache_dtype="fp8", kv_tokens=10**9))
    assert len(large.kv_layers(st.layers)) > len(small.kv_layers(st.layers))
    assert large.kv_cache_dtype == "fp8" and set(large.kv_skip_layers) <= set(st.layers)
    layers = large.kv_layers(st.layers)
    units = tuple(u.name for u in large.fp8_units(st.units))
    kv = KVCacheScheme.from_name("fp8")
    m = measure(bench, Perturbation(units, Scheme.from_name("FP8_DYNAMIC"), layers, kv))
    assert m.metrics["kl_q_p"] == pytest.approx(large.measured, rel=1e-9) and large.measured <= budget
    # the skipped layers are in kept_scores, with their score and bytes at the workload
    kept = {k["group"] for k in large.kept_scores if k["group"].endswith("kv_cache")}
    assert kept == {f"model.layers.{i}.self_attn.kv_cache" for i in large.kv_skip_layers}


def test_the_map_round_trips_and_reaches_vllms_arguments(setup, tmp_path):
    """recipe.json keeps the map (the YAML cannot: llm-compressor's kv_cache_scheme is one for every layer);
    vllm_args passes it as vLLM's flag takes it (layer indices as strings); the recipe's configuration names it."""
    from fp8probe.deploy.export import vllm_args
    from fp8probe.sources.sources import recipe as recipe_source

    st, r, bench, df = setup
    budget = float(df[df.unit == "model.fp8_all_kv"].kl_q_p.iloc[0]) * 1.5  # everything fits
    keep = ("model.layers.2.self_attn.kv_cache",)  # `keep` names a layer's KV cache by its row
    rec = make_recipe(df, bench, ask(budget, kv_cache_dtype="fp8", kv_tokens=10**6, keep=keep))
    assert rec.kv_skip_layers == [2]
    # its measured figure is the one with layer 2's KV cache BF16, measured here directly (not every layer's)
    units, kv, fp8 = (
        tuple(u.name for u in rec.fp8_units(st.units)),
        KVCacheScheme.from_name("fp8"),
        Scheme.from_name("FP8_DYNAMIC"),
    )
    assert measure(bench, Perturbation(units, fp8, (0, 1, 3), kv)).metrics["kl_q_p"] == pytest.approx(
        rec.measured, rel=1e-9
    )
    assert measure(bench, Perturbation(units, fp8, (0, 1, 2, 3), kv)).metrics["kl_q_p"] != pytest.approx(
        rec.measured, rel=1e-6
    )
    assert [k["reason"] for k in rec.kept_scores if k["group"] == keep[0]] == ["keep"]
    rec.write(tmp_path)
    back = read_recipe(tmp_path / "recipe.yaml")
    assert back.kv_skip_layers == rec.kv_skip_layers and back.kv_tokens == 10**6
    assert "KV cache BF16 in layers" in (tmp_path / "recipe.yaml").read_text()
    args = vllm_args(tmp_path, back, None)
    assert args["kv_cache_dtype"] == "fp8"
    assert args["kv_cache_dtype_skip_layers"] == [str(i) for i in rec.kv_skip_layers]
    src = recipe_source(st, back)
    assert set(src.perturbation.kv_layers) == set(st.layers) - set(rec.kv_skip_layers)
    assert src.config.kv_skip == tuple(rec.kv_skip_layers)
    assert RolloutConfig.parse(src.config.name) == src.config


def test_configuration_text_of_a_kv_map():
    c = RolloutConfig.parse("fp8+kv:fp8[skip:29,0]")
    assert c.kv_skip == (0, 29) and c.name == "fp8:FP8_DYNAMIC+kv:fp8[skip:0,29]"
    assert c != RolloutConfig.parse("fp8+kv:fp8")  # a map is another configuration than every layer in FP8
    for bad in ("kv:fp8[0,1]", "kv:fp8[skip:a]", "kv:fp8[skip:1"):
        with pytest.raises(FP8ProbeError, match="a KV map is kv:DTYPE"):
            RolloutConfig.parse(bad)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(budget=0.1, kv_tokens=100), "give `kv_cache_dtype` too"),
        (dict(fp8_share=0.5, kv_cache_dtype="fp8", kv_tokens=100), "give `budget` or `min_bytes_saved`"),
        (dict(budget=0.1, kv_cache_dtype="fp8", kv_tokens=100, form="all"), "form all chooses none"),
        (dict(budget=0.1, kv_cache_dtype="fp8", kv_context=100), "give `kv_tokens` too"),
        (dict(budget=0.1, kv_cache_dtype="fp8", kv_tokens=100, kv_context=101), "at least as many"),
    ],
)
def test_refusals(kw, match):
    with pytest.raises(FP8ProbeError, match=match):
        ask(**kw)


def test_audit_reads_the_map_back(tmp_path):
    """vllm.yaml's kv-cache-dtype-skip-layers against the recipe, layer by layer (planted: a dropped layer and an
    extra one are both findings; a name vLLM matches by attention type is flagged, not read as a layer)."""
    from fp8probe.deploy.audit import Audit, _check_kv_map

    rec = Recipe(scheme="FP8_DYNAMIC", ignore=["lm_head"], kv_cache_dtype="fp8", kv_skip_layers=[0, 3])

    def findings(listed):
        (tmp_path / "vllm.yaml").write_text(
            yaml.safe_dump({"kv-cache-dtype": "fp8", "kv-cache-dtype-skip-layers": listed})
        )
        a = Audit()
        _check_kv_map(a, tmp_path, rec)
        return [f.line() for f in a.findings]

    assert findings(["0", "3"]) == []
    dropped = (
        "kv-map: layer 3: the recipe keeps its KV cache BF16, vLLM would put it in FP8 (vllm.yaml does not skip it)"
    )
    assert findings(["0"]) == [dropped]
    extra = "kv-map: layer 5: vLLM keeps its KV cache BF16 (vllm.yaml), the recipe puts it in FP8"
    assert findings(["0", "3", "5"]) == [extra]
    assert len(findings(["0", "3", "sliding_window"])) == 1


def test_a_framework_without_a_kv_map_refuses_it(setup):
    """vLLM's checkpoint and the vLLM rollouts of verl and SkyRL write the map; every other target with an FP8 KV
    cache says, in one line of its own, why it would put every layer's KV cache in FP8."""
    from fp8probe.deploy.frameworks import Inexpressible, express
    from fp8probe.deploy.frameworks.base import TARGETS

    st = setup[0]
    rec = Recipe.from_groups(st.units, "FP8_DYNAMIC", set(), kv_cache_dtype="fp8", form="none")  # the KV cache alone
    n = st.model.config.num_hidden_layers
    assert express(TARGETS["trl"], rec, st.units, n).kv == "fp8"  # every layer: TRL applies it
    rec.kv_skip_layers = [0]
    assert express(TARGETS["vllm"], rec, st.units, n).kv_skip == [0]
    with pytest.raises(Inexpressible, match="trl.* cannot keep some layers' KV cache in BF16"):
        express(TARGETS["trl"], rec, st.units, n)
    whole = rec  # the KV cache alone: every target with an FP8 KV cache can take that much
    vllm_rollouts = {"verl", "verl-opd", "verl-fully-async", "skyrl"}
    assert {t for t in vllm_rollouts if express(TARGETS[t], whole, st.units, n).kv_skip == [0]} == vllm_rollouts
    why = set()
    for t in ("verl-sglang", "slime", "nemo-rl", "trl"):
        with pytest.raises(Inexpressible, match="cannot keep some layers' KV cache in BF16") as e:
            express(TARGETS[t], whole, st.units, n)
        why.add(str(e.value).split("BF16 (")[1].split(")")[0])
    assert len(why) == 3  # SGLang's one dtype, NeMo-RL's keys, TRL's forwarding: said, not one stock line


@pytest.mark.parametrize(
    "target, written, dropped",
    [  # the map as each framework reads it, and the same with layer 3 dropped
        (
            "verl",
            "engine_kwargs.vllm.kv_cache_dtype_skip_layers=[0,3]'",
            "engine_kwargs.vllm.kv_cache_dtype_skip_layers=[0]'",
        ),
        (
            "skyrl",
            'engine_init_kwargs.kv_cache_dtype_skip_layers=["0","3"]',
            'engine_init_kwargs.kv_cache_dtype_skip_layers=["0"]',
        ),
    ],
)
def test_audit_reads_a_frameworks_map_back(setup, target, written, dropped):
    """verl's vLLM rollout takes the map through engine_kwargs.vllm (a Hydra list), SkyRL through engine_init_kwargs
    (strings, vLLM's type); audit reads each fragment as its framework hands it to vLLM and compares it with the
    recipe, layer by layer (planted: a layer dropped from the list, and the line removed, are findings)."""
    from fp8probe.deploy.audit import Audit, _audit_frameworks
    from fp8probe.deploy.frameworks import express, render
    from fp8probe.deploy.frameworks.base import TARGETS

    st = setup[0]
    n = st.model.config.num_hidden_layers
    rec = Recipe.from_groups(st.units, "FP8_DYNAMIC", set(), kv_cache_dtype="fp8", form="none")  # the KV cache alone
    rec.kv_skip_layers = [0, 3]
    ((name, text),) = render(express(TARGETS[target], rec, st.units, n), "/m", st.units).items()
    assert written in text

    def findings(script):
        a = Audit()
        _audit_frameworks(a, Path("/nonexistent"), {target: {name: script}}, rec, st.units, n)
        return [f.line() for f in a.findings]

    assert findings(text) == []
    layer3 = f"kv-map: {target}: layer 3: the recipe keeps its KV cache BF16, {target} would put it in FP8"
    assert findings(text.replace(written, dropped)) == [layer3]
    cut = "\n".join(ln for ln in text.splitlines() if "skip_layers" not in ln)
    assert len(findings(cut)) == 2


def test_full_attention_kv_layers_stay_fp8_beside_sliding_layers():
    """On a model with sliding-window layers (tiny Gemma 3: layers 0, 1 sliding, 2 full), vLLM 0.32 cannot keep a
    full-attention layer's KV cache BF16 (deploy/capacity.py: an assertion in its page unification, shown by
    tests/deploy/test_capacity.py against vLLM's code): at a budget that buys no KV layer by rank, layer 2's is FP8
    all the same and its mismatch counted in the measured figure; only sliding layers are skipped; `keep` naming
    layer 2's KV cache is refused in one line. The map capacity() sizes is then one vLLM lays out."""
    from fp8probe.deploy.capacity import kv_layout

    st = tiny_student("gemma3_text")
    r = make_rollouts(st, num_prompts=6, max_new_tokens=10)
    bench = Bench(st, r)
    df = sweep(bench).table
    kv, fp8 = KVCacheScheme.from_name("fp8"), Scheme.from_name("FP8_DYNAMIC")
    pinned = measure(bench, Perturbation((), fp8, (2,), kv)).metrics["kl_q_p"]  # layer 2's KV cache alone
    rec = make_recipe(df, bench, ask(pinned * 1.001, kv_cache_dtype="fp8", kv_tokens=10**6))
    assert rec.kv_skip_layers == [0, 1] and rec.kv_cache_dtype == "fp8"
    units = tuple(u.name for u in rec.fp8_units(st.units))
    m = measure(bench, Perturbation(units, fp8, (2,), kv))
    assert m.metrics["kl_q_p"] == pytest.approx(rec.measured, rel=1e-9) and rec.measured > 0
    with pytest.raises(FP8ProbeError, match="drop `kv_cache_dtype`"):  # under layer 2's own figure: nothing fits
        make_recipe(df, bench, ask(pinned * 0.5, kv_cache_dtype="fp8", kv_tokens=10**6))
    kv_layout(st.model.config, "fp8", skip=tuple(rec.kv_skip_layers))  # laid out, not refused
    # contexts of 80 tokens: a sliding layer (window 8) holds 8 of each sequence's 80, so its KV bytes count a tenth
    per_token = {int(x.block): int(x.kv_bytes_saved_per_token) for x in df[df.kind == "kv"].itertuples()}
    ctx = make_recipe(df, bench, ask(pinned * 1.001, kv_cache_dtype="fp8", kv_tokens=10**6, kv_context=80))
    kept = {k["group"]: k["bytes_saved"] for k in ctx.kept_scores if k["group"].endswith("kv_cache")}
    assert kept == {f"model.layers.{i}.self_attn.kv_cache": per_token[i] * 10**6 * 8 // 80 for i in (0, 1)}
    assert ctx.kv_context == 80 and ctx.to_json()["kv_context"] == 80
    with pytest.raises(FP8ProbeError, match="cannot keep a full-attention layer's KV cache"):
        make_recipe(
            df, bench, ask(1.0, kv_cache_dtype="fp8", kv_tokens=10**6, keep=("model.layers.2.self_attn.kv_cache",))
        )
