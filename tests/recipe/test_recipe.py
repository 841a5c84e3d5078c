"""Recipe selection under a budget, llm-compressor's parser on our YAML, and vLLM's refusals caught early."""

import pytest
import yaml
from conftest import ask, tiny_student

from fp8probe import FP8ProbeError
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.reference import Reference
from fp8probe.model.rollouts import make_rollouts
from fp8probe.recipe.recipe import read_recipe
from fp8probe.recipe.selection import make_recipe
from fp8probe.recipe.settings import RecipeContext
from fp8probe.sweeps.settings import SweepSettings
from fp8probe.sweeps.sweep import sweep


def fp8_names(recipe, student) -> list[str]:
    return [u.name for u in recipe.fp8_units(student.units)]


@pytest.fixture(scope="module")
def setup():
    st = tiny_student("llama", num_hidden_layers=4)
    r = make_rollouts(st, num_prompts=6, max_new_tokens=10)
    bench = Bench(st, r)
    df = sweep(bench).table
    return st, r, bench, df


def test_budgets_hold_and_savings_grow(setup, tmp_path):
    st, r, bench, df = setup
    whole = float(df[df.unit == "model.fp8_all"].kl_q_p.iloc[0])
    saved = []
    for frac in (0.05, 0.3, 1.5):  # tight, medium, loose (loose: everything fits)
        budget = whole * frac
        rec = make_recipe(df, bench, ask(budget))
        assert rec.measured <= budget
        assert len(rec.search) <= 12  # a few measured passes, not one per group
        groups = st.groups()
        for g in rec.kept:  # whole fused groups only
            assert sorted(rec.group_units[g]) == sorted(u.name for u in groups[g])
        saved.append(rec.bytes_saved)
        # the measured value is what fp8probe.measurement.measure gives for exactly these units
        from fp8probe import measure_scheme

        again = measure_scheme(bench, "FP8_DYNAMIC", units=fp8_names(rec, st))
        assert again["kl_q_p"] == pytest.approx(rec.measured, rel=1e-9)
    assert saved[0] <= saved[1] <= saved[2]
    assert saved[2] == df[df.unit == "model.fp8_all"].bytes_saved.iloc[0]


def test_yaml_parsed_by_llmcompressor(setup, tmp_path):
    st, r, bench, df = setup
    whole = float(df[df.unit == "model.fp8_all"].kl_q_p.iloc[0])
    rec = make_recipe(df, bench, ask(whole * 0.3, kv_cache_dtype="fp8", keep_first=1))
    rec.write(tmp_path)
    from llmcompressor.recipe import Recipe

    parsed = Recipe.create_instance(str(tmp_path / "recipe.yaml"))
    (mod,) = parsed.modifiers
    assert type(mod).__name__ == "QuantizationModifier"
    assert mod.scheme == "FP8_DYNAMIC" and mod.targets == ["Linear"]
    assert mod.ignore == rec.ignore and "lm_head" in mod.ignore
    assert mod.kv_cache_scheme.num_bits == 8 and mod.kv_cache_scheme.type == "float"
    kept_units = [u for g in rec.kept for u in rec.group_units[g]]
    assert set(kept_units) <= set(mod.ignore)
    assert all(u.name in mod.ignore for u in st.quantizable if u.block == 0)  # --keep-first 1
    import json

    meta = json.loads((tmp_path / "recipe.json").read_text())
    for k in ("budget", "metric", "predicted", "measured", "bytes_saved", "kept", "quantized"):
        assert k in meta
    back = read_recipe(tmp_path / "recipe.yaml")
    assert fp8_names(back, st) == fp8_names(rec, st)
    assert back.ignore == rec.ignore and back.kv_cache_dtype == "fp8" and back.scheme == rec.scheme


def test_split_group_refused(setup, tmp_path):
    st = setup[0]
    doc = {
        "default_stage": {
            "default_modifiers": {
                "QuantizationModifier": {
                    "targets": ["Linear"],
                    "scheme": "FP8_DYNAMIC",
                    "ignore": ["lm_head", "model.layers.1.self_attn.k_proj"],
                }
            }
        }
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(
        FP8ProbeError,
        match=r"splits vLLM's fused qkv_proj of block 1: FP8 "
        r"model.layers.1.self_attn.q_proj, .*v_proj but BF16 .*k_proj",
    ):
        read_recipe(tmp_path / "r.yaml").check_vllm_loadable(st.units)
    doc["default_stage"]["default_modifiers"]["QuantizationModifier"]["ignore"] = [
        "lm_head",
        "model.layers.2.mlp.up_proj",
    ]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(FP8ProbeError, match="gate_up_proj of block 2"):
        read_recipe(tmp_path / "r.yaml").check_vllm_loadable(st.units)


@pytest.mark.slow  # the real embedded student
def test_block_scheme_shapes_refused(embedded, tmp_path):
    """SmolLM2's q_proj (576 outputs) cannot be a whole-block member of a fused FP8_BLOCK qkv_proj."""
    doc = {
        "default_stage": {
            "default_modifiers": {
                "QuantizationModifier": {"targets": ["Linear"], "scheme": "FP8_BLOCK", "ignore": ["lm_head"]}
            }
        }
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(
        FP8ProbeError,
        match=r"FP8_BLOCK needs input dims divisible by 128; not: "
        r"model.layers.0.self_attn.q_proj \(576\)",
    ):
        read_recipe(tmp_path / "r.yaml").check_vllm_loadable(embedded.units)


def test_bad_recipe_files(tmp_path):
    with pytest.raises(FP8ProbeError, match="no such recipe"):
        read_recipe(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
    with pytest.raises(FP8ProbeError, match="not valid YAML"):
        read_recipe(tmp_path / "bad.yaml")
    (tmp_path / "x.yaml").write_text("default_stage: {}\n")
    with pytest.raises(FP8ProbeError, match="exactly one QuantizationModifier"):
        read_recipe(tmp_path / "x.yaml")


def test_group_granularity_sweep(setup):
    st, r, bench, _ = setup
    df = sweep(bench, SweepSettings(method="exact", granularity="group", include_kv=False)).table
    whole = float(df[df.unit == "model.fp8_all"].kl_q_p.iloc[0])
    rec = make_recipe(df, bench, ask(whole * 0.3))
    assert rec.measured <= whole * 0.3 and rec.quantized
    names = {u.name for u in st.quantizable}
    assert set(fp8_names(rec, st)) <= names


def test_cli_recipe_then_capacity(cli, tiny_dirs, tmp_path):
    import json

    import pandas as pd

    r = cli("-q", "sweep", tiny_dirs["qwen3"], "--out", tmp_path / "s", "--num-prompts", 4, "--max-new-tokens", 8)
    assert r.code == 0, r.err
    table = pd.read_csv(tmp_path / "s" / "sensitivity.csv")
    budget = float(table.set_index("unit").loc["model.fp8_all", "kl_q_p"]) * 0.3
    r = cli("-q", "recipe", tmp_path / "s", "--budget", budget, "--out", tmp_path / "r", "--keep-last", 1)
    assert r.code == 0, r.err
    meta = json.loads((tmp_path / "r" / "recipe.json").read_text())
    assert meta["measured_search"] <= budget and meta["kept"]  # the held-out value may land on either side
    assert meta["split"]["holdout_every"] == 2 and meta["split"]["heldout_prompts"] == 2  # the default split
    kept_for_keep = {k["group"] for k in meta["kept_scores"] if k["reason"] == "keep"}
    last_block = {g for g in meta["group_units"] if g.startswith("model.layers.2.")}  # --keep-last 1 of 3 blocks
    assert kept_for_keep == last_block and len(last_block) == 4
    r = cli(
        "-q",
        "capacity",
        tiny_dirs["qwen3"],
        "--recipe",
        tmp_path / "r" / "recipe.yaml",
        "--kv-cache-memory",
        1 << 24,
        "--max-model-len",
        256,
    )
    assert r.code == 0, r.err
    assert f"({len([u for g in meta['quantized'] for u in meta['group_units'][g]])} units)" in r.out
    r = cli("-q", "recipe", tmp_path / "nowhere", "--budget", 1, "--out", tmp_path / "r2")
    assert r.code == 2 and "no such sweep directory" in r.err


def test_budget_on_a_metric_whose_zero_point_is_one(setup):
    """token_mult_prob_error is 1.0 without mismatch: a budget bounds its excess over 1 (0.3 of the whole
    model's excess here), not the raw value, which no recipe could ever get under."""
    st, r, bench, df = setup
    whole = float(df[df.unit == "model.fp8_all"].token_mult_prob_error.iloc[0])
    budget = 0.3 * (whole - 1)
    rec = make_recipe(df, bench, ask(budget, metric="token_mult_prob_error"))
    assert rec.measured == pytest.approx(rec.measured_metrics["token_mult_prob_error"] - 1, abs=1e-15)
    assert 0 < rec.measured <= budget
    assert 0 < len(rec.quantized) < len(st.groups())
    scores = {k["group"]: k["score"] for k in rec.kept_scores}
    units = df.set_index("unit")
    for g, s in scores.items():  # group score = sum over its units of (tme - 1)
        want = sum(max(units.loc[u, "token_mult_prob_error"] - 1, 0) for u in rec.group_units[g])
        assert s == pytest.approx(want, rel=1e-12)


def test_first_last_form_keeps_whole_edge_blocks_and_is_the_best_split(setup):
    """--form first-last: the kept set is exactly the first N and last M blocks; no other split with as many
    FP8 blocks scores less (the sweep's prediction), and the measured value is what measure_scheme() gives."""
    st, r, bench, df = setup
    whole = float(df[df.unit == "model.fp8_all"].kl_q_p.iloc[0])
    rec = make_recipe(df, bench, ask(whole * 0.5, form="first-last"))
    assert rec.measured <= whole * 0.5 and rec.form == "first-last"
    blocks = {st.unit(u).block for u in fp8_names(rec, st)}
    lo, hi = min(blocks), max(blocks)
    assert blocks == set(range(lo, hi + 1))  # a contiguous middle: whole leading and trailing blocks BF16
    from fp8probe import measure_scheme

    assert measure_scheme(bench, "FP8_DYNAMIC", units=fp8_names(rec, st))["kl_q_p"] == pytest.approx(
        rec.measured, rel=1e-9
    )
    units = df[~df.kind.isin(["kv", "model"])]
    score = {b: float(units[units.block == b].kl_q_p.clip(lower=0).sum()) for b in range(4)}
    width = hi - lo + 1
    best = min(sum(score[b] for b in range(s, s + width)) for s in range(0, 4 - width + 1))
    assert sum(score[b] for b in blocks) == pytest.approx(best)
    free = make_recipe(df, bench, ask(whole * 0.5))
    assert free.bytes_saved >= rec.bytes_saved  # the framework's limitation costs bytes, never saves them


def test_all_and_none_forms(setup):
    st, r, bench, df = setup
    whole = float(df[df.unit == "model.fp8_all"].kl_q_p.iloc[0])
    rec = make_recipe(df, bench, ask(whole * 1.01, form="all"))
    assert rec.kept == [] and rec.measured == pytest.approx(whole, rel=1e-9)
    with pytest.raises(FP8ProbeError, match=r"every Linear in FP8_DYNAMIC .* measures kl_q_p .* > budget"):
        make_recipe(df, bench, ask(whole * 0.5, form="all"))
    kv_only = make_recipe(
        df, bench, ask(1.0, form="none", kv_cache_dtype="fp8"), context=RecipeContext(kv_scale="unit")
    )
    assert kv_only.quantized == [] and kv_only.kv_scale == "unit" and kv_only.measured > 0
    from fp8probe import measure_scheme
    from fp8probe.core.schemes import KVCacheScheme

    unit = measure_scheme(bench, units=[], kv=KVCacheScheme(scale="unit"))["kl_q_p"]
    calibrated = measure_scheme(bench, units=[], kv="fp8")["kl_q_p"]
    assert kv_only.measured == pytest.approx(unit, rel=1e-9) and unit != calibrated
    with pytest.raises(FP8ProbeError, match="`form` none .* add `kv_cache_dtype` fp8"):
        make_recipe(df, bench, ask(1.0, form="none"))
    # the KV cache is named as the engines name it; a dtype llm-compressor's kv_cache_scheme cannot hold is refused
    # with the command that measures it instead
    with pytest.raises(
        FP8ProbeError,
        match=r"'fp8_e5m2' is an engine setting .* `fp8probe check --kv-cache-dtype "
        r"fp8_e5m2`; a recipe takes: fp8",
    ):
        make_recipe(df, bench, ask(1.0, form="none", kv_cache_dtype="fp8_e5m2"))
    from fp8probe.recipe.recipe import Recipe

    with pytest.raises(FP8ProbeError, match="'int8' is not a KV-cache dtype"):
        Recipe(scheme="FP8_DYNAMIC", ignore=[], kv_cache_dtype="int8")


@pytest.mark.slow  # the real embedded student
def test_block_sweep_skips_groups_the_scheme_cannot_take(embedded, tmp_path):
    """SmolLM2 (hidden 576): FP8_BLOCK can take only down_proj (input 1536); the others stay BF16 with reason."""
    from fp8probe.core.schemes import Scheme
    from fp8probe.model.structure import scheme_blockers

    blocked = scheme_blockers(embedded.quantizable, Scheme.from_name("FP8_BLOCK"))
    assert len(blocked) == 90 and not any(g.endswith("down_proj") for g in blocked)
    assert blocked["model.layers.0.self_attn.qkv_proj"] == "q_proj input dim 576 not a multiple of 128"
    assert scheme_blockers(embedded.quantizable, Scheme.from_name("FP8_DYNAMIC")) == {}


def test_memory_targets(setup):
    """--min-bytes-saved / --effective-bits / --fp8-share: the cheapest prefix that reaches the target, measured;
    effective bits over every Linear's weights, lm_head included as ModelOpt counts it (16 - 8 x FP8 share)."""
    from fp8probe.recipe.settings import MemoryTarget

    st, r, bench, df = setup
    total = sum(u.params for u in st.quantizable) + st.model.lm_head.weight.numel()
    half = make_recipe(df, bench, ask(fp8_share=0.5))
    fp8 = sum(st.unit(n).params for n in fp8_names(half, st))
    assert fp8 / total >= 0.5 and half.fp8_share == pytest.approx(fp8 / total)
    assert half.effective_bits == pytest.approx(16 - 8 * fp8 / total) and half.budget is None
    bits = make_recipe(df, bench, ask(effective_bits=12.0))
    assert bits.quantized == half.quantized  # 12 effective bits is a 50 % FP8 share
    need = half.bytes_saved + 1
    more = make_recipe(df, bench, ask(min_bytes_saved=need))
    assert more.bytes_saved >= need and more.memory_target == {"kind": "bytes_saved", "value": need}
    from fp8probe import measure_scheme

    assert measure_scheme(bench, "FP8_DYNAMIC", units=fp8_names(more, st))["kl_q_p"] == pytest.approx(
        more.measured, rel=1e-9
    )
    everything = int(df[df.unit == "model.fp8_all"].bytes_saved.iloc[0])
    with pytest.raises(FP8ProbeError, match=r"is more than FP8 can reach on this model: at most .* lower the target"):
        make_recipe(df, bench, ask(min_bytes_saved=everything + 1))
    with pytest.raises(FP8ProbeError, match="give exactly one of `budget`, `min_bytes_saved`"):
        ask(0.1, fp8_share=0.5)  # checked once, where the settings are made
    with pytest.raises(FP8ProbeError, match=r"`effective_bits` 7.0 is outside \[8, 16\]"):
        MemoryTarget("effective_bits", 7.0)


@pytest.mark.parametrize("mode", ["memory", "budget"])
def test_refinement_never_worse_than_its_start(setup, mode):
    """The refined recipe is measured at least as good as the prefix recipe it starts from, every pass it
    measured is in the search log, and its reported value is what measure_scheme() gives for its units."""
    from fp8probe import measure_scheme

    st, r, bench, df = setup
    whole = float(df[df.unit == "model.fp8_all"].kl_q_p.iloc[0])
    kw = dict(fp8_share=0.6) if mode == "memory" else {}
    budget = None if mode == "memory" else whole * 0.4
    plain = make_recipe(df, bench, ask(budget, **kw))
    refined = make_recipe(df, bench, ask(budget, refine=10, **kw))
    moves = [e for e in refined.search if e["move"] != "prefix"]
    assert 0 < len(moves) <= 10 and all("predicted" in e and "measured" in e for e in moves)
    if mode == "memory":
        assert refined.measured <= plain.measured and refined.fp8_share >= 0.6
    else:
        assert refined.bytes_saved >= plain.bytes_saved and refined.measured <= budget
    again = measure_scheme(bench, "FP8_DYNAMIC", units=fp8_names(refined, st))["kl_q_p"]
    assert again == pytest.approx(refined.measured, rel=1e-9)


def test_block_scheme_fused_outputs_refused():
    """A fused q/k/v whose k_proj has 64 outputs cannot be one FP8_BLOCK GEMM: named, with what to do."""
    st = tiny_student("llama")  # hidden 128 (inputs fit), 2 KV heads of 32: k/v outputs 64
    from fp8probe.recipe.recipe import Recipe

    with pytest.raises(
        FP8ProbeError,
        match=r"FP8_BLOCK cannot take these shapes: model.layers.0.self_attn.qkv_proj "
        r"\(k_proj output dim 64 \(fused\) not a multiple of 128\)",
    ):
        Recipe.whole_model(st.units, "FP8_BLOCK").check_vllm_loadable(st.units)


def test_a_group_both_kept_and_forced_is_refused(setup):
    """`keep` and `force` naming one group, or `force` naming a group `keep_first` keeps by position: one line, no
    recipe (the KV pinning beside sliding-window layers once subtracted every forced group from the kept ones, which
    silenced this: seen failing against that code)."""
    st, r, bench, df = setup
    g = "model.layers.1.mlp.down_proj"
    for kw in (dict(keep=(g,), force=(g,)), dict(keep_first=1, force=("model.layers.0.mlp.down_proj",))):
        with pytest.raises(FP8ProbeError, match="is both kept and forced; choose one"):
            make_recipe(df, bench, ask(1.0, **kw))


@pytest.fixture(scope="module")
def twelve():
    """The tiny student of `setup` with a sweep of its own 12-prompt rollouts."""
    from fp8probe.model.rollouts import make_rollouts as sample

    st = tiny_student("llama", num_hidden_layers=4)
    r = sample(st, num_prompts=12, max_new_tokens=10)
    return st, r, sweep(Bench(st, r)).table


def test_held_out_report_is_measured_on_prompts_the_search_never_saw(twelve):
    """With a split, every measured pass of the search runs on the search prompts and the recipe's `measured` is
    its value on the held-out ones: each equals fp8probe.measure on that subset alone (an independent reference
    pass), the two differ, the interval holds the held-out value, the search stays within the budget where it was
    measured, and the same call gives the same recipe. (On this tiny model the held-out figure is 6-14 % lower than
    the search figure over eight budgets: a difference of prompts, not selection bias, which
    tests/recipe/test_refine.py shows refinement resisting.)"""
    from fp8probe import measure_scheme

    st, r, df = twelve
    budget = float(df[df.unit == "model.fp8_all"].kl_q_p.iloc[0]) * 0.3
    rec = make_recipe(df, Bench(st, r), ask(budget, holdout=2, refine=4))
    split = rec.split
    assert split["holdout_every"] == 2 and (split["search_prompts"], split["heldout_prompts"]) == (6, 6)
    search, held = r.subset(split["search_sequences"]), r.subset(split["heldout_sequences"])
    units = fp8_names(rec, st)
    on_search = measure_scheme(Bench(st, search), "FP8_DYNAMIC", units=units)["kl_q_p"]
    on_held = measure_scheme(Bench(st, held), "FP8_DYNAMIC", units=units)["kl_q_p"]
    assert rec.measured_search == pytest.approx(on_search, rel=1e-9) and rec.measured_search <= budget
    assert rec.measured == pytest.approx(on_held, rel=1e-9) and rec.measured_metrics["kl_q_p"] == rec.measured
    assert abs(rec.measured - rec.measured_search) > 1e-3 * rec.measured
    lo, hi = rec.measured_interval
    assert lo < rec.measured < hi
    assert make_recipe(df, Bench(st, r), ask(budget, holdout=2, refine=4)).to_json() == rec.to_json()


def test_held_out_figure_uses_the_search_prompts_scales(twelve):
    """Static FP8 (per-tensor activation scales) and a calibrated FP8 KV cache: the scales are calibrated on the
    search prompts, as an export calibrates them before any held-out prompt is seen, and the held-out figure uses
    those. It equals fp8probe.measure on the held-out prompts with a reference that carries the search prompts'
    calibration, and differs from the same measurement with scales calibrated on the held-out prompts themselves
    (which would flatter the recipe: those scales fit the very activations they are judged on)."""
    from fp8probe import measure_scheme

    st, r, df = twelve
    budget = float(df[df.unit == "model.fp8_all"].kl_q_p.iloc[0]) * 0.5
    rec = make_recipe(
        df, Bench(st, r), ask(budget, holdout=2, kv_cache_dtype="fp8"), context=RecipeContext(scheme="FP8")
    )
    search, held = r.subset(rec.split["search_sequences"]), r.subset(rec.split["heldout_sequences"])
    units = fp8_names(rec, st)
    assert units, "the recipe keeps some groups in FP8"
    on_search = Reference(st, search)  # calibrated on the search prompts
    with_search_scales = Reference(st, held, calibrate=False)
    with_search_scales.calibration = on_search.calibration
    want = measure_scheme(Bench.around(with_search_scales, st, held), "FP8", units=units, kv="fp8")["kl_q_p"]
    own = measure_scheme(Bench(st, held), "FP8", units=units, kv="fp8")["kl_q_p"]
    assert rec.measured == pytest.approx(want, rel=1e-9)
    assert abs(own - want) > 1e-3 * want  # the two calibrations give measurably different figures here


def test_memory_target_measures_only_the_held_out_prompts(twelve, monkeypatch):
    """Under a memory target, unrefined, the prefix is chosen by rank and bytes: no measured pass decides it, so
    with a split the search prompts get no reference pass and no measured pass (the time it saves), only their
    calibration (static FP8's input scales); `measured_search` is None; the recipe is the one the same settings choose
    without a split, and its held-out figure equals fp8probe.measure there with the search prompts' scales."""
    from fp8probe import measure_scheme
    from fp8probe.measurement import reference as reference_module

    st, r, df = twelve
    made = []
    real = reference_module.Reference.__init__

    def counted(self, student, rollouts, *a, **kw):
        made.append(rollouts.num_sequences)
        real(self, student, rollouts, *a, **kw)

    monkeypatch.setattr(reference_module.Reference, "__init__", counted)
    ctx = RecipeContext(scheme="FP8")
    rec = make_recipe(df, Bench(st, r), ask(effective_bits=12.0, holdout=2), context=ctx)
    held = r.subset(rec.split["heldout_sequences"])
    assert made == [held.num_sequences] and rec.measured_search is None and rec.search == []
    assert rec.quantized == make_recipe(df, Bench(st, r), ask(effective_bits=12.0), context=ctx).quantized
    monkeypatch.setattr(reference_module.Reference, "__init__", real)
    with_search_scales = Reference(st, held, calibrate=False)
    with_search_scales.calibration = Reference(st, r.subset(rec.split["search_sequences"])).calibration
    want = measure_scheme(Bench.around(with_search_scales, st, held), "FP8", units=fp8_names(rec, st))["kl_q_p"]
    assert rec.measured == pytest.approx(want, rel=1e-9)
    lo, hi = rec.measured_interval
    assert lo < rec.measured < hi


def test_the_sweeps_kept_amax_replace_the_search_sets_calibration_pass(twelve, monkeypatch):
    """Given the sweep's per-sequence amax (RecipeContext.scales), the default recipe (a memory target, its own split,
    unrefined) runs no calibration pass: its search set's static scales are the amax over the search set's sequences,
    so it chooses the same groups and reports the same held-out figure and interval as with the pass. (Had it read
    the amax of every sequence, held-out prompts included, the figure would differ: 0.00223 against 0.00251.)"""
    from fp8probe.measurement import calibration as calibration_module

    st, r, df = twelve
    kept = calibration_module.calibrate(st, r, list(st.unit_names), per_sequence=True).per_sequence
    passes = []
    real = calibration_module.calibrate
    monkeypatch.setattr(calibration_module, "calibrate", lambda *a, **kw: passes.append(1) or real(*a, **kw))
    settings = ask(effective_bits=12.0, holdout=2)
    with_kept = make_recipe(df, Bench(st, r), settings, context=RecipeContext(scheme="FP8", scales=kept))
    assert passes == []
    with_pass = make_recipe(df, Bench(st, r), settings, context=RecipeContext(scheme="FP8"))
    assert passes == [1]
    assert with_kept.quantized == with_pass.quantized
    assert with_kept.measured == pytest.approx(with_pass.measured, rel=1e-6)
    assert with_kept.measured_interval == pytest.approx(with_pass.measured_interval, rel=1e-6)


def test_cli_recipe_reads_the_scales_its_sweep_kept(cli, tiny_dirs, tmp_path, monkeypatch):
    """`fp8probe sweep` with static input scales keeps each sequence's amax (scales.safetensors); `fp8probe recipe`
    reads them instead of a calibration pass and writes the recipe it writes without them (the file deleted: one
    pass); kept for other rollouts (another sweep's file), they are not used."""
    import json
    import shutil

    from fp8probe.measurement import calibration as calibration_module

    common = ["--scheme", "FP8", "--granularity", "group", "--num-prompts", 6, "--max-new-tokens", 8]
    for name, seed in (("s", 0), ("other", 1)):
        r = cli("-q", "sweep", tiny_dirs["llama"], "--out", tmp_path / name, "--seed", seed, *common)
        assert r.code == 0, r.err
    assert (tmp_path / "s" / "scales.safetensors").is_file()
    passes = []
    real = calibration_module.calibrate
    monkeypatch.setattr(calibration_module, "calibrate", lambda *a, **kw: passes.append(1) or real(*a, **kw))

    def recipe(out):
        r = cli("-q", "recipe", tmp_path / "s", "--effective-bits", 13, "--engine", "none", "--out", tmp_path / out)
        assert r.code == 0, r.err
        return json.loads((tmp_path / out / "recipe.json").read_text())

    kept = recipe("r-kept")
    assert passes == [] and kept["quantized"]
    shutil.copy(tmp_path / "other" / "scales.safetensors", tmp_path / "s" / "scales.safetensors")
    other = recipe("r-other")
    assert passes == [1]
    (tmp_path / "s" / "scales.safetensors").unlink()
    own = recipe("r-own")
    assert passes == [1, 1]
    for got in (kept, other):
        assert got["quantized"] == own["quantized"]
        assert got["measured"] == pytest.approx(own["measured"], rel=1e-6)


def test_the_engine_figure_is_the_profile_on_the_held_out_prompts(twelve):
    """measured_engine: the recipe on the held-out prompts as the vllm-cuda profile computes it, equal to
    fp8probe.measure(engine="vllm-cuda") there, and different from the simulation's figure (bf16 arithmetic); an
    engine that does not cover the scheme says why instead of a number."""
    from fp8probe import measure_scheme

    st, r, df = twelve
    budget = float(df[df.unit == "model.fp8_all"].kl_q_p.iloc[0]) * 0.3
    rec = make_recipe(df, Bench(st, r), ask(budget, holdout=2, engine="vllm-cuda"))
    held = r.subset(rec.split["heldout_sequences"])
    want = measure_scheme(Bench(st, held), "FP8_DYNAMIC", units=fp8_names(rec, st), engine="vllm-cuda")["kl_q_p"]
    e = rec.measured_engine
    assert e["engine"] == "vllm-cuda" and e["measured"] == pytest.approx(want, rel=1e-6)
    assert e["interval"][0] < e["measured"] < e["interval"][1] and e["measured"] != pytest.approx(rec.measured)
    off = make_recipe(df, Bench(st, r), ask(budget, holdout=2, engine="vllm-cpu"), context=RecipeContext(scheme="FP8"))
    assert off.measured_engine["measured"] is None and "vLLM-CPU" in off.measured_engine["not_covered"]
