"""The TRL export through TRL's own start-up code (trl 1.16 from the test extra, the release the target names):
`trl vllm-serve`'s parser takes every written flag (it forwards the ones it does not know to `vllm serve` unseen, so a
left-over string is a defect) and composes the vLLM command with them; `GRPOConfig` runs its own validation on the
written fields, on top of what a user's own launch sets and no export writes (the output directory; `use_cpu` stands
in for the user's GPU on this machine, as GRPOConfig's BF16 default refuses a CPU otherwise). A planted defect per
file (a flag TRL would forward unread, a truncate mode without its bound) fails it."""

from __future__ import annotations

import shlex

import pytest
import yaml
from conftest import tiny_student

from fp8probe.deploy.frameworks import TARGETS, express, render
from fp8probe.recipe.recipe import Recipe

trl = pytest.importorskip("trl")


@pytest.fixture(scope="module")
def files():
    student = tiny_student("llama", num_key_value_heads=4, num_hidden_layers=4)
    recipe = Recipe.from_groups(student.units, "FP8_DYNAMIC", [], kv_cache_dtype="fp8")
    return render(express(TARGETS["trl"], recipe, student.units, 4), "/models/student", student.units)


def serve_args(text: str) -> list[str]:
    """The arguments after `trl vllm-serve` in the written shell fragment."""
    body = " ".join(ln.rstrip("\\ ").strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))
    words = shlex.split(body)
    assert words[:2] == ["trl", "vllm-serve"], words[:2]
    return words[2:]


def start_serve(args: list[str]) -> list[str]:
    """What `trl vllm-serve ARGS` hands to vLLM (trl/cli/commands/vllm_serve.py: parse, then build_command)."""
    from trl.scripts.vllm_serve import build_command, make_parser

    script_args, rest = make_parser(prog="trl vllm-serve").parse_args_and_config(
        args=args, return_remaining_strings=True
    )
    assert rest == [], f"TRL does not read {rest}: it would forward them to `vllm serve` unchecked"
    return build_command(script_args, rest)


def grpo_config(fields: dict, tmp_path):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, **fields)


def test_trl_vllm_serve_takes_every_written_flag(files):
    command = start_serve(serve_args(files["trl.sh"]))
    serve = command[command.index("serve") :]
    assert serve[1] == "/models/student"
    assert serve[serve.index("--kv-cache-dtype") + 1] == "fp8"


def test_a_flag_trl_does_not_know_fails(files):
    args = [a.replace("--kv_cache_dtype", "--kv_cache_type") for a in serve_args(files["trl.sh"])]
    with pytest.raises(AssertionError, match="does not read"):
        start_serve(args)


def test_grpo_config_accepts_the_written_fields(files, tmp_path):
    fields = yaml.safe_load(files["trl_grpo_config.yaml"])
    cfg = grpo_config(fields, tmp_path)
    assert {k: getattr(cfg, k) for k in fields} == fields
    assert cfg.vllm_importance_sampling_mode in trainer_modes()  # GRPOConfig leaves the name to the trainer


def trainer_modes() -> set[str]:
    """The IS modes GRPOTrainer computes, as its own error message lists them (trl/trainer/grpo_trainer.py)."""
    import inspect
    import re

    from trl.trainer import grpo_trainer

    src = inspect.getsource(grpo_trainer)
    listed = re.search(r"Unknown vLLM importance sampling level.*?Possible values are (.*?)\.\"", src).group(1)
    modes = set(re.findall(r"'(\w+)'", listed))
    assert len(modes) == 4, listed
    return modes


def test_a_truncate_mode_without_its_bound_fails(files, tmp_path):
    fields = yaml.safe_load(files["trl_grpo_config.yaml"]) | {"vllm_importance_sampling_clip_max": None}
    with pytest.raises(ValueError, match="truncate"):
        grpo_config(fields, tmp_path)
