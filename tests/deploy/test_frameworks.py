"""Rollout-framework targets: every key we write exists in the framework itself, and each framework applies
exactly the recipe (its own matching rules, not ours, decide which modules stay BF16).

verl, OpenRLHF, TRL and SkyRL: their released wheels (`pip download --no-deps`, cached, never installed);
we read their shipped default config, argument parser or config dataclasses. NeMo-RL and slime have no real
PyPI release: their keys were read from their repositories at the commits in tests/data/framework_keys.json.
The tests that read a released wheel are marked `network` (the first run downloads it from PyPI): the fast suite
runs without a package registry, CI runs them with the slow tests.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from conftest import find_in, lift, tiny_student

from fp8probe.core.errors import FP8ProbeError
from fp8probe.deploy.frameworks import TARGETS, Inexpressible, express, render
from fp8probe.recipe.recipe import Recipe

PINNED = json.loads((Path(__file__).resolve().parents[1] / "data" / "framework_keys.json").read_text())


# ----------------------------------------------------------------------------------------------------
# recipes and what we render for them


@pytest.fixture(scope="module")
def student():
    return tiny_student("llama", num_key_value_heads=4, num_hidden_layers=4)


def _recipe(student, scheme, kept_blocks=(), kept_groups=(), kv=None, **info):
    groups = student.groups()
    fp8 = [g for g, us in groups.items() if us[0].block not in kept_blocks and g not in kept_groups]
    return Recipe.from_groups(student.units, scheme, fp8, kv_cache_dtype=kv, **info)


def _files(student, target, recipe):
    e = express(TARGETS[target], recipe, student.units, 4)
    return e, render(e, "/models/student", student.units)


@pytest.fixture(scope="module")
def rendered(student):
    """target -> its files, each for a recipe that target can apply (with an FP8 KV cache where it takes one)."""
    mid = "model.layers.1.mlp.gate_up_proj"
    block = _recipe(student, "FP8_BLOCK", kept_blocks=(0, 3), kept_groups=(mid,), kv="fp8")
    out = {
        "verl-sglang": _files(student, "verl-sglang", block)[1],
        "nemo-rl": _files(student, "nemo-rl", block)[1],
        "verl": _files(student, "verl", _recipe(student, "FP8_BLOCK", kv="fp8"))[1],
        "slime": _files(student, "slime", _recipe(student, "FP8_BLOCK", kv="fp8"))[1],
        "skyrl": _files(student, "skyrl", _recipe(student, "FP8_TENSOR_DYNAMIC", kv="fp8"))[1],
        "trl": _files(student, "trl", _recipe(student, "FP8_DYNAMIC", kept_blocks=range(4), kv="fp8"))[1],
        "openrlhf": _files(student, "openrlhf", _recipe(student, "FP8_DYNAMIC", kept_blocks=range(4)))[1],
    }
    return out


def hydra_overrides(text: str) -> dict[str, str]:
    """key -> value of the Hydra/OmegaConf overrides in a rendered shell fragment."""
    body = [ln.rstrip("\\ ").strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    out = {}
    for tok in shlex.split(" ".join(body[1:])):  # body[0] is the command
        key, value = tok.split("=", 1)
        out[key] = value
    return out


def cli_flags(text: str) -> dict[str, str | None]:
    """flag -> value (None for a switch) of the last command in a rendered shell fragment."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    start = max(i for i, ln in enumerate(lines) if not ln.startswith(" "))  # the last command
    body = " ".join(ln.rstrip("\\ ").strip() for ln in lines[start:])
    toks = shlex.split(body)
    out, i = {}, 0
    while i < len(toks):
        if toks[i].startswith("--"):
            nxt = toks[i + 1] if i + 1 < len(toks) and not toks[i + 1].startswith("--") else None
            out[toks[i]] = nxt
            i += 2 if nxt is not None else 1
        else:
            i += 1
    return out


def yaml_keys(doc, prefix="") -> dict[str, object]:
    out = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(yaml_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# ----------------------------------------------------------------------------------------------------
# the keys exist in the frameworks


def _verl_has(cfg: dict, key: str) -> bool:
    """Hydra: `a.b=v` needs a.b in the config; `+a.b.c=v` needs a.b.c absent under an existing mapping."""
    add = key.startswith("+")
    parts = key.lstrip("+").split(".")
    node = cfg
    for i, p in enumerate(parts):
        if not isinstance(node, dict):
            return False
        if p not in node:
            return add and i > 0  # `+` creates what is missing below an existing mapping
        node = node[p]
    return not add  # `+` on an existing key is an error in Hydra


@pytest.mark.network
@pytest.mark.parametrize("target", ["verl", "verl-sglang"])
def test_verl_keys_exist(released, rendered, target):
    root = released["verl"]
    cfg = yaml.safe_load(find_in(root, "verl/trainer/config/_generated_ppo_trainer.yaml").read_text())
    (text,) = rendered[target].values()
    overrides = hydra_overrides(text)
    assert len(overrides) >= 5
    for key in overrides:
        assert _verl_has(cfg, key), key
    assert overrides["actor_rollout_ref.rollout.quantization"] == "fp8"
    assert re.search(
        r'_SUPPORTED_QUANTIZATION = \[[^\]]*"fp8"',
        find_in(root, "verl/workers/rollout/vllm_rollout/vllm_async_server.py").read_text(),
    )
    assert 'rollout_is="token"' in find_in(root, "verl/trainer/config/algorithm.py").read_text()
    main_ppo = find_in(root, "verl/trainer/main_ppo.py").read_text()
    assert 'ray_init_kwargs.get("runtime_env"' in main_ppo  # our env var reaches every Ray actor
    if target == "verl-sglang":
        assert "SGLANG_FP8_IGNORED_LAYERS" in find_in(root, "verl/utils/sglang/sglang_fp8_utils.py").read_text()


def _argparse_flags(path: Path) -> dict[str, list | None]:
    """flag -> its choices, from every add_argument call in a file."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            choices = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "choices"), None)
            for a in node.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"):
                    out[a.value] = choices
    return out


@pytest.mark.network
def test_openrlhf_flags_exist(released, rendered):
    known = _argparse_flags(find_in(released["openrlhf"], "openrlhf/cli/train_ppo_ray.py"))
    flags = cli_flags(rendered["openrlhf"]["openrlhf.sh"])
    assert len(flags) == 4
    for flag, value in flags.items():
        assert flag in known, flag
        if known[flag] is not None:
            assert value in known[flag], (flag, value)
    engine = find_in(released["openrlhf"], "openrlhf/trainer/ray/vllm_engine.py").read_text()
    assert '"dtype": "bfloat16"' in engine and "kv_cache_dtype" not in engine  # why it takes no FP8


# what a user's own OpenRLHF GRPO launch sets and no export writes: the advantage (no critic), the group, the reward
OPENRLHF_USER = [
    "--algo.advantage.estimator",
    "group_norm",
    "--rollout.n_samples_per_prompt",
    "8",
    "--reward.remote_url",
    "http://rm:5000/get_reward",
]


def openrlhf_start(wheel: Path, jobs: list[list[str]]) -> list[dict]:
    """Each command line through train_ppo_ray.py's own start-up block (tests/deploy/openrlhf_startup.py)."""
    import subprocess
    import sys

    here = Path(__file__).resolve().parent
    r = subprocess.run(
        [sys.executable, str(here / "openrlhf_startup.py"), str(wheel)],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.stdout.startswith("["), (r.stdout[-2000:], r.stderr[-2000:])
    return json.loads(r.stdout)


@pytest.mark.network
def test_the_openrlhf_export_passes_openrlhfs_own_start_up(released, rendered):
    """The written command line, after a user's own, through the released train_ppo_ray.py's main block (its parser,
    hierarchize, every check up to `train(args)`): it starts, with token-level truncation at IS_CLIP (a single
    threshold is OpenRLHF's upper bound only). Planted: a correction level OpenRLHF lacks, and three thresholds,
    fail."""
    text = rendered["openrlhf"]["openrlhf.sh"]
    body = " ".join(ln.rstrip("\\ ").strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))
    words = shlex.split(body)
    assert words[:3] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"], words[:3]
    argv = OPENRLHF_USER + words[3:]
    level = argv.index("--algo.advantage.is_correction_level") + 1
    bounds = argv.index("--algo.advantage.is_correction_threshold") + 1
    bad_level = argv[:level] + ["tokens"] + argv[level + 1 :]
    bad_bounds = argv[: bounds + 1] + ["3.0", "4.0"] + argv[bounds + 1 :]
    ok, level_bad, bounds_bad = openrlhf_start(released["openrlhf"], [argv, bad_level, bad_bounds])
    assert ok["ok"], ok
    assert ok["correction"] == {
        "is_correction_level": "token",
        "is_correction_mode": "clip",
        "is_correction_threshold": [0.0, 2.0],
    }
    assert not level_bad["ok"] and "invalid choice" in level_bad["error"], level_bad
    assert not bounds_bad["ok"] and "HIGH or LOW HIGH" in bounds_bad["error"], bounds_bad


def _dataclass_fields(path: Path) -> dict[str, dict[str, str]]:
    """class -> field -> annotation source, for every class in a file."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                s.target.id: ast.unparse(s.annotation)
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    return out


@pytest.mark.network
def test_trl_fields_exist(released, rendered):
    root = released["trl"]
    serve = _dataclass_fields(find_in(root, "trl/scripts/vllm_serve.py"))["ScriptArguments"]
    flags = cli_flags(rendered["trl"]["trl.sh"])
    assert set(flags) == {"--model", "--kv_cache_dtype"}
    for flag in flags:
        assert flag[2:] in serve, flag
    grpo_src = find_in(root, "trl/trainer/grpo_config.py")
    grpo = _dataclass_fields(grpo_src)["GRPOConfig"]
    cfg = yaml.safe_load(rendered["trl"]["trl_grpo_config.yaml"])
    for k in cfg:
        assert k in grpo, k
    assert f"'{cfg['vllm_importance_sampling_mode']}'" in grpo_src.read_text()


@pytest.mark.network
def test_skyrl_keys_exist(released, rendered):
    classes = _dataclass_fields(find_in(released["skyrl"], "skyrl/train/config/config.py"))
    overrides = hydra_overrides(rendered["skyrl"]["skyrl.sh"])
    assert len(overrides) == 4 and not any(k.startswith("+") for k in overrides)  # SkyRL refuses "+"
    for key in overrides:
        cls, parts = "SkyRLTrainConfig", key.split(".")
        for i, p in enumerate(parts):
            assert p in classes[cls], key
            ann = classes[cls][p]
            if ann.startswith("Dict["):  # engine_init_kwargs: any vLLM engine argument below
                assert i == len(parts) - 2, key
                break
            cls = re.sub(r"^Optional\[(.*)\]$", r"\1", ann)
            if i < len(parts) - 1:
                assert cls in classes, (key, cls)


def test_nemo_rl_keys_pinned(rendered):
    pinned = PINNED["nemo-rl"]["read"]
    known = {k for r in pinned for k in r["keys"]}
    values = {k: v for r in pinned for k, v in r.get("values", {}).items()}
    keys = yaml_keys(yaml.safe_load(rendered["nemo-rl"]["nemo-rl.yaml"]))
    assert len(keys) == 8
    for k, v in keys.items():
        assert k in known, k
        if k in values:
            assert v in values[k], (k, v)


def test_slime_flags_pinned(rendered):
    pinned = PINNED["slime"]["read"]
    known = {k for r in pinned for k in r["keys"]}
    values = {k: v for r in pinned for k, v in r.get("values", {}).items()}
    text = rendered["slime"]["slime.sh"]
    convert = shlex.split(next(ln for ln in text.splitlines() if ln.startswith("python tools/convert_hf_to_fp8.py")))
    flags = {**cli_flags(text), **{t: None for t in convert if t.startswith("--")}}
    assert {"--hf-checkpoint", "--sglang-kv-cache-dtype", "--use-tis", "--tis-clip", "--strategy"} <= set(flags)
    for flag, value in cli_flags(text).items():
        assert flag in known, flag
        if flag in values:
            assert value in values[flag], (flag, value)
    for flag in flags:
        assert flag in known, flag


# ----------------------------------------------------------------------------------------------------
# the framework applies exactly the recipe


def _verl_matcher(released):
    """verl's own `_matches_ignored_layer` (SGLang path), lifted from its source without importing verl."""
    path = "verl/utils/sglang/sglang_fp8_utils.py"
    return lift(released["verl"], path, ("_matches_ignored_layer",), {"re": re})["_matches_ignored_layer"]


@pytest.mark.network
def test_verl_sglang_ignores_exactly_the_kept_modules(released, student, rendered):
    matches = _verl_matcher(released)
    env = next(k for k in hydra_overrides(rendered["verl-sglang"]["verl-sglang.sh"]) if "IGNORED_LAYERS" in k)
    ignored = hydra_overrides(rendered["verl-sglang"]["verl-sglang.sh"])[env].strip('"').split(",")
    recipe = _recipe(student, "FP8_BLOCK", kept_blocks=(0, 3), kept_groups=("model.layers.1.mlp.gate_up_proj",))
    fp8 = {u.name for u in recipe.fp8_units(student.units)}
    for u in student.quantizable:
        kept_by_verl = any(matches(u.name + ".weight", layer) for layer in ignored)
        assert kept_by_verl == (u.name not in fp8), u.name
    # `fp8probe audit` reads the fragment with its own copy of that rule: the same answer for every module and entry,
    # and for entries of other shapes ("re:", a bare suffix, a block prefix, case, stray dots)
    from fp8probe.deploy.frameworks.verl import _matches_ignored

    entries = ignored + ["re:.*layers\\.2\\..*", "mlp", "down_proj", "model.layers.1", ".Self_Attn.", "layers.3.mlp.up"]
    for u in student.quantizable:
        for entry in entries:
            assert _matches_ignored(u.name, entry) == matches(u.name + ".weight", entry), (u.name, entry)


@pytest.mark.parametrize(
    "kept_groups,keywords",
    [
        (["model.layers.1.mlp.gate_up_proj"], ["model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"]),
        # every o_proj kept: one suffix keyword stands for all of them (layers 1 and 2 outside the edge blocks)
        (
            [f"model.layers.{b}.self_attn.o_proj" for b in range(4)] + ["model.layers.2.mlp.down_proj"],
            ["self_attn.o_proj", "model.layers.2.mlp.down_proj"],
        ),
    ],
)
def test_nemo_rl_keywords_select_exactly_the_kept_modules(student, kept_groups, keywords):
    """NeMo-RL keeps a module BF16 when it is in the first/last blocks or a keyword is a substring of its name."""
    recipe = _recipe(student, "FP8_BLOCK", kept_blocks=(0, 3), kept_groups=kept_groups)
    e, files = _files(student, "nemo-rl", recipe)
    cfg = yaml.safe_load(files["nemo-rl.yaml"])["policy"]["generation"]["vllm_cfg"]
    assert (cfg["num_first_layers_in_bf16"], cfg["num_last_layers_in_bf16"]) == (1, 1)
    assert cfg["quantization_ignored_layer_kws"] == keywords
    fp8 = {u.name for u in recipe.fp8_units(student.units)}
    for u in student.quantizable:
        edge = u.block < cfg["num_first_layers_in_bf16"] or u.block >= 4 - cfg["num_last_layers_in_bf16"]
        kept = edge or any(k in u.name for k in cfg.get("quantization_ignored_layer_kws", []))
        assert kept == (u.name not in fp8), u.name


def test_recipe_ignore_list_as_compressed_tensors_matches_it():
    """The ignore list (exact names, anchored escaped `re:` patterns for experts) as compressed-tensors matches it."""
    from compressed_tensors.utils.match import is_match

    moe = tiny_student("qwen3_moe")
    kept = [g for g, us in moe.groups().items() if us[0].kind == "expert"][:1] + ["model.layers.1.mlp.gate_up_proj"]
    recipe = Recipe.from_groups(moe.units, "FP8_DYNAMIC", [g for g in moe.groups() if g not in kept])
    assert any(p.startswith("re:^") for p in recipe.ignore)
    fp8 = {u.name for u in recipe.fp8_units(moe.units)}
    for name, mod in moe.model.named_modules():
        if type(mod).__name__ != "Linear":
            continue
        quantized = is_match(name, mod, ["Linear"], ignore=recipe.ignore)
        expert = re.sub(r"\.\d+\.(gate|up|down)_proj$", "", name)
        ours = name in fp8 or (expert in fp8 and expert != name)
        assert quantized == ours, name


# ----------------------------------------------------------------------------------------------------
# what cannot be applied is refused, saying what the framework would do


def test_refusals_say_what_the_framework_would_do(student):
    free = _recipe(student, "FP8_BLOCK", kept_blocks=(0,), kept_groups=("model.layers.1.mlp.gate_up_proj",))
    with pytest.raises(Inexpressible, match=r"would quantize the recipe's 5 kept groups too"):
        express(TARGETS["verl"], free, student.units, 4)
    with pytest.raises(Inexpressible, match=r"would run the recipe's \d+ FP8 units in BF16"):
        express(TARGETS["openrlhf"], free, student.units, 4)
    with pytest.raises(Inexpressible, match=r"quantizes with FP8_BLOCK, this recipe is FP8_DYNAMIC.*--target nemo-rl"):
        express(TARGETS["nemo-rl"], _recipe(student, "FP8_DYNAMIC"), student.units, 4)
    with pytest.raises(Inexpressible, match="keeps only whole leading/trailing blocks"):
        express(
            TARGETS["nemo-rl"].__class__(**{**TARGETS["nemo-rl"].__dict__, "form": "first-last"}),
            free,
            student.units,
            4,
        )
    with pytest.raises(Inexpressible, match="no FP8 KV-cache setting"):
        express(TARGETS["openrlhf"], _recipe(student, "FP8_DYNAMIC", kept_blocks=range(4), kv="fp8"), student.units, 4)
    e = express(TARGETS["verl"], _recipe(student, "FP8_BLOCK", kv="fp8"), student.units, 4)
    assert e.warnings and "k/v scales 1.0" in e.warnings[0]
    e = express(TARGETS["verl"], _recipe(student, "FP8_BLOCK", kv="fp8", kv_scale="unit"), student.units, 4)
    assert not e.warnings


def test_export_all_targets_on_a_tiny_model(tmp_path):
    """One export, every target: the vLLM checkpoint (config groups named group_N, calibrated k/v scales for the
    FP8 KV cache) and one fragment per framework that can apply one of the recipes, the others explained."""
    from conftest import tiny_model, tiny_tokenizer
    from safetensors import safe_open

    from fp8probe.deploy.export import export
    from fp8probe.model.rollouts import make_rollouts
    from fp8probe.model.settings import ModelSource

    model_dir = tmp_path / "model"
    tiny_model("llama", num_key_value_heads=4, num_hidden_layers=4).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    st = tiny_student("llama", num_key_value_heads=4, num_hidden_layers=4)
    recipes = {
        "block": _recipe(st, "FP8_BLOCK", kept_blocks=(0,), kv="fp8"),
        "online": _recipe(st, "FP8_TENSOR_DYNAMIC", kv="fp8", kv_scale="unit", target="skyrl"),
    }
    paths = []
    for name, r in recipes.items():
        r.write(tmp_path / name)
        paths.append(tmp_path / name / "recipe.yaml")
    done = export(
        ModelSource(str(model_dir)),
        paths,
        tmp_path / "out",
        targets=["all"],
        rollouts=make_rollouts(st, num_prompts=4, max_new_tokens=6),
    )
    ckpt = done.out
    qc = json.loads((ckpt / "config.json").read_text())["quantization_config"]
    assert list(qc["config_groups"]) == ["group_0"] and qc["kv_cache_scheme"]["strategy"] == "tensor"
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        scales = {k for k in f.keys() if k.endswith(("k_scale", "v_scale"))}
    assert scales == {f"model.layers.{i}.self_attn.{kv}_scale" for i in range(4) for kv in "kv"}
    summary = {p.target.name: p for p in done.plans}
    assert summary["skyrl"].recipe_path == paths[1]  # the recipe made for it
    assert summary["vllm"].recipe_path == paths[0] and summary["nemo-rl"].recipe_path == paths[0]
    assert summary["verl"].expression is None and "kept groups too" in summary["verl"].reason
    files = sorted(p.name for p in (ckpt / "frameworks").iterdir())
    assert files == ["README.md", "nemo-rl.yaml", "skyrl.sh", "verl-sglang.sh"]  # verl, slime: all or nothing
    readme = (ckpt / "frameworks" / "README.md").read_text()
    assert all(f"{t}: cannot apply" in readme for t in ("verl", "slime", "openrlhf", "trl"))


# ----------------------------------------------------------------------------------------------------
# verl's on-policy distillation and fully-async targets


def _opd(student, target, **options):
    from dataclasses import replace

    from fp8probe.deploy.frameworks.verl import VerlSettings

    e = express(TARGETS[target], _recipe(student, "FP8_BLOCK", kv="fp8"), student.units, 4)
    (text,) = render(replace(e, options=VerlSettings(**options)), "/models/student", student.units).values()
    return text, hydra_overrides(text)


def test_verl_separate_async_states_its_lags(student):
    """parameter_sync_step 4, 1.5 warm-up batches, by the one lag model (verl_lags.py): verl 0.9.1 queues 1.5 train
    batches of prompts, 6 mini-batches, so local update j trains on weights 6 + j updates old: 6 .. 9; a trainer that
    waits: 0 .. 3; the decoupled loss recomputes the old log-probs at the step's start: the step's first two
    mini-batches are the older batch's second half (8 updates back), its last two the next batch's first half (4).
    The comment names the keys that judge them, which parse back to the same model; verl 0.9.0, whose loop takes
    whole warm-up batches, is refused the fraction in one line."""
    from fp8probe.core.verl_lags import parse_verl_async

    text, o = _opd(student, "verl-separate-async", parameter_sync_step=4, warmup_batches=1.5, max_off_policy=8)
    assert o["trainer.v1.separate_async.parameter_sync_step"] == "4"
    assert "samples lag 6 .. 9 optimizer updates when the rollout keeps up (0 .. 3 when the trainer waits)" in text
    assert "the decoupled loss's old log-probs lag 4 or 8:" in text
    key = "v1:sync=4,warmup=1.5,max_off_policy=8,decoupled"
    assert f"`fp8probe check --verl-async {key}` judges them" in text
    assert parse_verl_async(key).key() == key and parse_verl_async(key).lags() == {4: 0.5, 8: 0.5}
    with pytest.raises(FP8ProbeError, match="verl 0.9.0 queues whole warmup batches"):
        _opd(student, "verl-separate-async", warmup_batches=1.5, verl_version="0.9.0")


def test_verl_colocate_async_writes_its_mode_and_states_its_lags(student):
    """colocate_async with 1 warm-up batch: the mode and its keys as verl's ppo_trainer.yaml spells them; with every
    response alike two batches finish together each other step, one taken at once and one a step later: lags 0 and 1,
    half each (by hand: tests/sources/test_verl_async.py); the comment names the keys that schedule the student's
    own rollouts, which parse back to the same model. verl 0.9.0 queues whole warm-up batches only (range()), so a
    fraction is refused for it in one line."""
    from fp8probe.core.verl_lags import parse_verl_async

    text, o = _opd(student, "verl-colocate-async", warmup_batches=1, max_off_policy=4)
    assert o["trainer.v1.trainer_mode"] == "colocate_async"
    assert o["trainer.v1.colocate_async.num_warmup_batches"] == "1"
    assert o["trainer.v1.sampler.max_off_policy_threshold"] == "4"
    assert "with every response alike the tokens lag (0: 50%, 1: 50%) trainer steps" in text
    key = "v1-colocate:warmup=1,max_off_policy=4,batch=64"
    assert f"`fp8probe check --verl-async {key}`" in text and parse_verl_async(key).key() == key
    assert (
        _opd(student, "verl-colocate-async", warmup_batches=1.5, verl_version="0.9.1")[1][
            "trainer.v1.colocate_async.num_warmup_batches"
        ]
        == "1.5"
    )
    with pytest.raises(FP8ProbeError, match="verl 0.9.0 queues whole warmup batches"):
        _opd(student, "verl-colocate-async", warmup_batches=1.5, verl_version="0.9.0")
    with pytest.raises(FP8ProbeError, match="verl 0.8.0 has no the v1 trainer's async modes"):
        _opd(student, "verl-colocate-async", verl_version="0.8.0")


def test_verl_opd_writes_the_screen_each_loss_takes(student):
    """Supervised distillation: verl weights no term of the loss by the rollout IS weights, so the fragment sets
    verl's K3 rejection screen and says TIS does not act; policy-gradient distillation as calibrate's opd-pg trains
    it: bypass mode (the PPO ratio's denominator the rollout's log-probs), where the screens act inside the task loss
    and the distillation loss is neither masked nor weighted. Both write the loss the calibration trains
    (DistillationLossConfig's clamps ±10, top-k 128 for forward_kl_topk) where a Hydra launch would take
    distillation.yaml's (no clamps, top-k 32). k1 without the policy gradient, and a verl older than the keys, are
    refused in one line. Seen failing with the decoupled PG loss and without the clamps."""
    text, o = _opd(student, "verl-opd", teacher="/models/teacher", opd_no_task_rewards=True)
    assert o["distillation.enabled"] == "True" and o["distillation.distillation_loss.loss_mode"] == "k3"
    assert o["distillation.distillation_loss.use_policy_gradient"] == "False"
    assert o["distillation.distillation_loss.use_task_rewards"] == "False"
    assert o["distillation.teacher_models.teacher_model.model_path"] == "/models/teacher"
    assert (
        o["algorithm.rollout_correction.rollout_rs"] == "seq_mean_k3"
        and "algorithm.rollout_correction.rollout_is" not in o
    )
    assert "passes no IS weight to a supervised distillation loss" in text and "act on no loss" in text
    assert "removes the masked tokens from the batch before every loss, the distillation loss included" in text
    assert o["actor_rollout_ref.rollout.quantization"] == "fp8"
    loss = "distillation.distillation_loss"
    assert o[f"{loss}.loss_max_clamp"] == "10.0" and o[f"{loss}.log_prob_min_clamp"] == "-10.0"
    assert f"{loss}.topk" not in o
    _, topk = _opd(student, "verl-opd", opd_loss="forward_kl_topk")
    assert topk[f"{loss}.topk"] == "128"
    text, o = _opd(student, "verl-opd", opd_loss="k1", opd_policy_gradient=True)
    assert (
        o["algorithm.rollout_correction.bypass_mode"] == "True" and "algorithm.rollout_correction.rollout_is" not in o
    )
    assert "in bypass mode" in text and "neither masked nor weighted" in text
    assert o["distillation.teacher_models.teacher_model.model_path"].startswith("${TEACHER:?")
    with pytest.raises(FP8ProbeError, match="k1 needs `opd_policy_gradient`"):
        _opd(student, "verl-opd", opd_loss="k1")
    with pytest.raises(FP8ProbeError, match="verl 0.7.0 has no distillation"):
        _opd(student, "verl-opd", verl_version="0.7.0")
    for ok in (
        "0.8.0",
        "0.9.0",
        "0.10.0",
        "1.0",
    ):  # every key written is in 0.8.0's wheel; later releases compare as numbers
        _opd(student, "verl-opd", verl_version=ok)


def test_verl_fully_async_states_its_lags(student):
    """T = 2, S = 0.5, by the one lag model (verl_lags.py): a full allowance queues S x T = 1 step of samples at every
    sync, so a version's samples train from 1 step after its sync for T = 2 steps: lags 1 .. 2; a trainer that waits
    trains at 0 .. T - 1 = 0 .. 1 (trainer steps, each require_batches x ppo_epochs optimizer updates), and the
    comment names the `--verl-async` keys that judge them; the screens act inside the task PPO loss (bypass mode),
    and with a teacher the distillation loss is neither masked nor weighted; without task rewards the screen acts on
    no loss. Seen failing with the old words ("optimizer steps", the screen on every loss)."""
    text, o = _opd(student, "verl-fully-async", staleness_threshold=0.5, trigger_parameter_sync_step=2)
    assert text.splitlines()[text.count("\n#") + 1].startswith(
        "python3 -m verl.experimental.fully_async_policy.fully_async_main"
    )
    assert o["async_training.staleness_threshold"] == "0.5" and o["async_training.partial_rollout"] == "True"
    assert "samples lag 1 .. 2 trainer steps when the rollouter keeps its allowance full (0 .. 1 when" in text
    assert "`fp8probe check --verl-async trigger=2,staleness=0.5,partial` judges them" in text
    assert "distillation.enabled" not in o and "inside the task PPO loss" in text
    assert o["actor_rollout_ref.hybrid_engine"] == "False" and o["data.train_batch_size"] == "0"
    assert "trainer.nnodes" not in o and "rollout.nnodes" not in o  # the user's own node counts stand
    assert _opd(student, "verl-fully-async", trainer_nodes=2)[1]["trainer.nnodes"] == "2"
    text, with_teacher = _opd(student, "verl-fully-async", teacher="/t")
    assert with_teacher["distillation.enabled"] == "True" and "neither masked nor weighted" in text
    assert with_teacher["distillation.n_gpus_per_node"] == "2" and with_teacher["distillation.nnodes"] == "1"
    text, _ = _opd(student, "verl-fully-async", teacher="/t", opd_no_task_rewards=True)
    assert "the screen written acts on no loss" in text
    with pytest.raises(FP8ProbeError, match="not a multiple of `teacher_tp`"):
        _opd(student, "verl-opd", teacher_tp=2, teacher_gpus=3)


@pytest.mark.network
@pytest.mark.parametrize("target", ["verl-opd", "verl-fully-async"])
def test_verl_opd_keys_exist(released, student, target):
    """Every key the OPD and fully-async fragments write is in verl 0.9.1's own config (the trainer's generated
    YAML; the fully-async policy's YAML over it), the loss a mode verl registers, the rejection mode one verl's
    helper implements, and the entry point a Hydra main of that config."""
    root = released["verl"]
    cfg = yaml.safe_load(find_in(root, "verl/trainer/config/_generated_ppo_trainer.yaml").read_text())
    if target == "verl-fully-async":
        over = yaml.safe_load(
            find_in(root, "verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml").read_text()
        )

        def merge(base: dict, top: dict) -> dict:  # Hydra's defaults list: the fully-async YAML over ppo_trainer
            out = dict(base)
            for k, v in top.items():
                out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
            return out

        cfg = merge(cfg, over)
        main = find_in(root, "verl/experimental/fully_async_policy/fully_async_main.py").read_text()
        assert 'config_name="fully_async_ppo_trainer"' in main
    text, o = _opd(student, target, teacher="/t", opd_loss="forward_kl_topk", opd_topk=16)
    for key in o:
        assert _verl_has(cfg, key), key
    losses = find_in(root, "verl/trainer/distillation/losses.py").read_text()
    registered = {n for m in re.findall(r"names=\[([^\]]*)\]", losses) for n in re.findall(r'"(\w+)"', m)}
    assert o["distillation.distillation_loss.loss_mode"] in registered
    from fp8probe.deploy.frameworks.verl import OPD_LOSSES

    assert set(OPD_LOSSES) == registered  # every mode fp8probe offers, and no other, is verl's
    helper = find_in(root, "verl/trainer/ppo/rollout_corr_helper.py").read_text()
    assert f'"{o["algorithm.rollout_correction.rollout_rs"]}"' in helper


def test_the_export_says_what_its_screen_masks_and_keeps_a_share_asked_for(student, cli, tiny_dirs, tmp_path):
    """A check of a whole-model FP8 configuration on a tiny model records each own sample's seq_mean_k3; the verl-opd
    export given that check.json says what share verl's preset 0.01 masks (the share of those statistics above 0.01,
    by hand), warns where it is above half, and with `screen_keep 0.5` writes their median as the threshold. Seen
    failing with the share read from the token fraction (set here to another number than the sequences' share)."""
    import numpy as np

    model = tiny_dirs["llama"]
    rec = tmp_path / "all"
    from fp8probe.model.student import load_student

    st = load_student(str(model))
    Recipe.whole_model(st.units, "FP8_DYNAMIC", kv_cache_dtype="fp8").write(rec)
    r = cli(
        "-q",
        "check",
        model,
        "--budget",
        1.0,
        "--recipe",
        rec / "recipe.yaml",
        "--num-prompts",
        6,
        "--max-new-tokens",
        8,
        "--out",
        tmp_path / "c",
    )
    assert r.code in (0, 1, 3), r.err
    check = tmp_path / "c" / "check.json"
    rep = json.loads(check.read_text())
    stat = np.array(rep["verl_screens"][0]["per_sequence"])
    rep["verl_screens"][0]["rollout_rs_masked_fraction"] = 0.987  # the token share: not what the export may read
    check.write_text(json.dumps(rep))
    text, o = _opd(student, "verl-opd", teacher="/t", check=str(check))
    share = float(np.mean(stat > 0.01))
    assert (
        f"seq_mean_k3 <= 0.01 masks {share:.0%}" in text
        and o["algorithm.rollout_correction.rollout_rs_threshold"] == "0.01"
    )
    assert ("WARNING: verl's preset would discard" in text) == (share > 0.5)
    text, o = _opd(student, "verl-opd", teacher="/t", check=str(check), screen_keep=0.5)
    assert float(o["algorithm.rollout_correction.rollout_rs_threshold"]) == pytest.approx(
        np.quantile(stat, 0.5), rel=1e-5
    )
    assert "threshold chosen to keep 50%" in text
    with pytest.raises(FP8ProbeError, match="`screen_keep` reads"):
        _opd(student, "verl-opd", screen_keep=0.9)


def test_verl_settings_refuse_a_warmup_verl_would_drop():
    """A prompt spans floor(warmup_batches) + 1 steps in the queue; past max_off_policy verl drops every warmup batch:
    7 warmup batches under a limit of 8 (8 steps) stand, 8 (9 steps) are refused in one line, as `--verl-async v1:`
    refuses the same keys (the one rule, core/verl_lags.py)."""
    from fp8probe.deploy.frameworks.verl import VerlSettings

    assert VerlSettings(warmup_batches=7, max_off_policy=8).warmup_batches == 7
    with pytest.raises(FP8ProbeError, match="would queue prompts for 9 steps, over `max_off_policy` 8"):
        VerlSettings(warmup_batches=8, max_off_policy=8)
