"""The command line: help and version, and bad input -> one line, exit 2, nothing left behind."""

import subprocess
import sys

import pytest


def run(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "fp8probe.cli", *map(str, args)], capture_output=True, text=True, timeout=600, **kw
    )


def test_help_and_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("fp8probe 0.")
    r = run("--help")
    assert r.returncode == 0 and "sweep" in r.stdout
    r = run("sweep", "--help")
    assert r.returncode == 0 and "--resume" in r.stdout and "examples:" in r.stdout


def test_every_verbs_help_shows_real_defaults():
    """Each verb's --help, formatted in process: a required option says no default (it showed dataclasses'
    MISSING sentinel, `check --budget`), every shown default is a value, and no switch shows one."""
    from fp8probe.cli.parser import build_parser

    verbs = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert {"check", "sweep", "recipe", "export"} <= set(verbs)
    for name, sub in verbs.items():
        text = sub.format_help()
        assert "MISSING" not in text and "object at 0x" not in text, name
        # a switch shows no default: `--no-kv ... (default: True)` read as "no KV rows by default"
        switches = [a for a in sub._actions if a.nargs == 0 and a.help and a.option_strings[0] != "-h"]
        assert all(sub.formatter_class(name)._get_help_string(a) == a.help for a in switches), name
    budget = next(a for a in verbs["check"]._actions if "--budget" in a.option_strings)
    assert budget.required and budget.default is None


def test_bad_input_in_a_real_process(tmp_path, tiny_dirs):
    """The whole path a user sees: a real process, its stderr, its exit code, nothing left behind (the other
    bad inputs run in-process: tests/robustness/)."""
    out = tmp_path / "out"
    r = run("sweep", tiny_dirs["llama"], "--scheme", "INT4", "--out", out)
    assert r.returncode == 2 and not out.exists()
    assert r.stderr.splitlines() == [
        "fp8probe: error: unknown scheme 'INT4'; supported: FP8, FP8_DYNAMIC, FP8_BLOCK, FP8_TENSOR_DYNAMIC"
    ]
    r = run("sweep", tmp_path / "nope" / "model", "--out", out)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "no such file or directory" in r.stderr


def test_truncated_gguf(cli, tmp_path, tiny_gguf):
    with open(tiny_gguf, "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(500_000))
    r = cli("sweep", tmp_path / "cut.gguf", "--out", tmp_path / "out")
    assert r.code == 2 and len(r.lines) == 1 and "truncated or corrupt" in r.lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arch", ["qwen3", "mixtral"])
def test_measure_and_units_on_tiny(cli, tmp_path, tiny_dirs, arch):
    r = cli(
        "-q",
        "measure",
        tiny_dirs[arch],
        "--out",
        tmp_path / "m",
        "--num-prompts",
        3,
        "--max-new-tokens",
        5,
        "--kv-cache-dtype",
        "fp8",
    )
    assert r.code == 0, r.err
    import json

    rep = json.loads((tmp_path / "m" / "mismatch.json").read_text())
    assert rep["metrics"]["kl_q_p"] > 0 and rep["schema_version"] == 1
    assert (tmp_path / "m" / "rollouts.safetensors").exists()
    # the candidate's own continuations, with verl's figures of them (measurement/verl.py; checked against verl's
    # own functions in tests/measurement/test_verl_metrics.py)
    from fp8probe.core.metrics import VERL_METRICS

    shift = rep["prefix_shift"]
    assert set(VERL_METRICS) <= set(shift) and 0 <= shift["diverged"] <= 1 and shift["rollout_corr/k3_kl"] >= 0
    r = cli("-q", "units", tiny_dirs[arch])
    assert r.code == 0 and "qkv_proj" in r.out


def test_help_imports_no_torch_and_the_api_resolves():
    """`fp8probe --help` stays instant (no torch); capacity on a config loads none of the measuring modules;
    every public name resolves to its one home."""
    code = (
        "import sys, json\n"
        "from fp8probe.cli.main import build_parser\n"
        "build_parser().format_help()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('fp8probe'))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    mods = __import__("json").loads(r.stdout)
    assert "torch" not in mods, mods
    code = (
        "import sys, json\n"
        "from fp8probe.cli import main\n"
        "main(['-q', 'capacity', sys.argv[1], '--kv-cache-memory', '1000000', '--max-model-len', '256'])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('fp8probe', 'pandas', 'matplotlib'))))\n"
    )
    import json
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "config.json"
        cfg.write_text(
            json.dumps(
                {
                    "model_type": "llama",
                    "hidden_size": 128,
                    "intermediate_size": 256,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 4,
                    "num_key_value_heads": 2,
                    "vocab_size": 300,
                    "max_position_embeddings": 256,
                }
            )
        )
        r = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True, timeout=300)
    mods = json.loads(r.stdout.strip().splitlines()[-1])
    for heavy in (
        "pandas",
        "matplotlib",
        "fp8probe.measurement.quantize",
        "fp8probe.measurement.reference",
        "fp8probe.sweeps.sweep",
        "fp8probe.deploy.export",
    ):
        assert heavy not in mods, (heavy, mods)
    import fp8probe

    for name in fp8probe.__all__:
        assert getattr(fp8probe, name) is not None, name
    # functions, not modules
    assert callable(fp8probe.sweep) and callable(fp8probe.measure) and callable(fp8probe.capacity)


def test_recipe_refine_default_is_the_goals_library_default():
    """Untold, the CLI refines a budget's recipe with the library's default passes and a memory target's not at all
    (recipe.refine.default_passes); a number given is kept under either goal."""
    from fp8probe.apps.recipe import RecipeSettings
    from fp8probe.cli.main import build_parser
    from fp8probe.cli.options import settings_from
    from fp8probe.recipe.refine import DEFAULT_REFINE_PASSES

    def passes(*argv):
        args = build_parser().parse_args(["recipe", "SWEEP", *argv, "--out", "X"])
        return settings_from(RecipeSettings, args).refine_passes

    assert DEFAULT_REFINE_PASSES > 0
    assert passes("--budget", "0.1") == DEFAULT_REFINE_PASSES
    for goal in (["--effective-bits", "12"], ["--fp8-share", "0.5"], ["--min-bytes-saved", "1000"]):
        assert passes(*goal) == 0
        assert passes(*goal, "--refine", "3") == 3
    assert passes("--budget", "0.1", "--refine", "0") == 0
