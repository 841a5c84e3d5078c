"""Bad input to every command: one line naming the bad value and what to do, the documented exit code (2),
no traceback, and no output left behind.

Each case runs the real command line in this process (tests/conftest.py `cli`), on tiny models.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
from conftest import tiny_model, tiny_tokenizer

FEW = ["--num-prompts", 2, "--max-new-tokens", 4]


def check_bad(r, match, out=None, code=2):
    """One line `fp8probe: error: ...` holding `match`, exit `code`, no traceback, `out` not created."""
    assert r.code == code, (r.code, r.err, r.out[-500:])
    assert len(r.lines) == 1, r.err
    assert r.lines[0].startswith("fp8probe: error: "), r.err
    assert match in r.lines[0], r.lines[0]
    assert "Traceback" not in r.err + r.out
    if out is not None:
        assert not out.exists(), f"{out} was left behind: {sorted(p.name for p in out.iterdir())}"
    return r.lines[0]


# ---------------------------------------------------------------------------------------------------
# fixtures: broken models, a finished tiny sweep, a recipe


@pytest.fixture(scope="module")
def broken(tmp_path_factory, tiny_dirs):
    """Model directories that must be refused, and one with hidden size 96 (not whole blocks of 128)."""
    root = tmp_path_factory.mktemp("broken")
    src = tiny_dirs["llama"]
    d = {}
    d["no_config"] = root / "no_config"
    d["no_config"].mkdir()
    d["pickle_only"] = root / "pickle_only"
    shutil.copytree(src, d["pickle_only"])
    for f in d["pickle_only"].glob("*.safetensors"):
        f.unlink()
    torch.save({"x": torch.zeros(1)}, d["pickle_only"] / "pytorch_model.bin")
    d["gpt2"] = root / "gpt2"
    d["gpt2"].mkdir()
    (d["gpt2"] / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    d["wrong_type"] = root / "wrong_type"
    shutil.copytree(src, d["wrong_type"])
    cfg = json.loads((src / "config.json").read_text())
    (d["wrong_type"] / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": "three"}))
    d["bad_json"] = root / "bad_json"
    shutil.copytree(src, d["bad_json"])
    (d["bad_json"] / "config.json").write_text('{"model_type": "llama", ')
    d["nan"] = root / "nan"
    m = tiny_model("llama")
    with torch.no_grad():
        m.model.layers[1].mlp.down_proj.weight[3, 5] = float("nan")
    m.save_pretrained(d["nan"])
    tiny_tokenizer().save_pretrained(d["nan"])
    d["hidden96"] = root / "hidden96"
    tiny_model("llama", hidden_size=96).save_pretrained(d["hidden96"])
    tiny_tokenizer().save_pretrained(d["hidden96"])
    return d


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_dirs):
    """A finished tiny sweep and a recipe made from it."""
    from fp8probe.cli import main

    root = tmp_path_factory.mktemp("finished")
    assert main(["-q", "sweep", str(tiny_dirs["llama"]), "--out", str(root / "sweep"), "--no-kv", *map(str, FEW)]) == 0
    assert main(["-q", "recipe", str(root / "sweep"), "--budget", "1e9", "--out", str(root / "recipe")]) == 0
    return root


def copy_sweep(finished, tmp_path, name="s"):
    d = tmp_path / name
    shutil.copytree(finished / "sweep", d)
    return d


# ---------------------------------------------------------------------------------------------------
# models and paths (sweep, measure, rollouts, units)


@pytest.mark.parametrize("command", ["sweep", "measure", "rollouts"])
def test_bad_models(cli, tmp_path, broken, command):
    out = tmp_path / "out"
    cases = [
        (tmp_path / "nope" / "model", "no such file or directory"),
        (broken["no_config"], "not a Hugging Face model directory (no config.json)"),
        (broken["pickle_only"], "holds only pickled weights (pytorch_model.bin)"),
        (broken["gpt2"], "unsupported architecture 'gpt2'"),
        (broken["wrong_type"], "field 'num_hidden_layers'"),
        (broken["bad_json"], "could not read the model config"),
    ]
    for model, match in cases:
        check_bad(cli(command, model, "--out", out, *FEW), match, out)


def test_units_bad_model(cli, tmp_path, broken):
    check_bad(cli("units", tmp_path / "missing"), "no such file or directory")
    check_bad(cli("units", broken["gpt2"]), "unsupported architecture")


def test_pickle_file_and_other_files(cli, tmp_path):
    out = tmp_path / "out"
    (tmp_path / "w.pt").write_bytes(b"\0" * 64)
    check_bad(cli("sweep", tmp_path / "w.pt", "--out", out), "is a pickled checkpoint file", out)
    (tmp_path / "w.dat").write_bytes(b"\0" * 64)
    check_bad(cli("sweep", tmp_path / "w.dat", "--out", out), "is not a model", out)
    (tmp_path / "x.gguf").write_bytes(b"GGML" + b"\0" * 60)
    check_bad(cli("sweep", tmp_path / "x.gguf", "--out", out), "not a GGUF file", out)


def test_nan_weights_are_reported_not_swept(cli, tmp_path, broken):
    out = tmp_path / "out"
    msg = check_bad(cli("sweep", broken["nan"], "--out", out, *FEW), "NaN/inf values in", out)
    assert "model.layers.1.mlp.down_proj.weight" in msg


def test_allow_pickle_loads_with_weights_only(cli, tmp_path, tiny_dirs):
    """The explicit flag loads a .bin checkpoint (transformers' torch.load with weights_only=True)."""
    d = tmp_path / "bin"
    m = tiny_model("llama")
    m.save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    for f in d.glob("*.safetensors"):
        f.unlink()
    torch.save(m.state_dict(), d / "pytorch_model.bin")
    check_bad(cli("units", d), "only pickled weights")
    r = cli("-q", "units", d, "--allow-pickle")
    assert r.code == 0 and "qkv_proj" in r.out, r.err


# ---------------------------------------------------------------------------------------------------
# prompts and rollouts


def test_bad_prompts(cli, tmp_path, tiny_dirs):
    model, out = tiny_dirs["llama"], tmp_path / "out"
    (tmp_path / "empty.txt").write_text("\n \n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    (tmp_path / "nofield.jsonl").write_text('{"question": "a"}\n')
    (tmp_path / "typed.jsonl").write_text('{"prompt": 42}\n')
    (tmp_path / "adir").mkdir()
    long_prompt = " ".join(["what"] * 300)  # the tiny models' context is 256 tokens
    (tmp_path / "long.txt").write_text(f"hello\n{long_prompt}\n")
    cases = [
        (tmp_path / "missing.txt", "no such prompts file"),
        (tmp_path / "adir", "is a directory"),
        (tmp_path / "empty.txt", "is empty"),
        (tmp_path / "latin1.txt", "not a UTF-8"),
        (tmp_path / "bad.jsonl", "bad.jsonl:2 is not valid JSON"),
        (tmp_path / "nofield.jsonl", "has no 'prompt', 'text' or 'messages' field"),
        (tmp_path / "typed.jsonl", "a prompt must be a string"),
        (tmp_path / "long.txt", "prompt 2 is"),
    ]
    for prompts, match in cases:
        check_bad(cli("rollouts", model, "--out", out, "--prompts", prompts, *FEW), match, out)
    msg = check_bad(cli("rollouts", model, "--out", out, "--prompts", tmp_path / "long.txt", *FEW), "context", out)
    assert "exceeds the model's context of 256" in msg


def test_bad_rollouts(cli, tmp_path, tiny_dirs, finished):
    from safetensors.torch import load_file, save_file

    model, out = tiny_dirs["llama"], tmp_path / "out"
    src = finished / "sweep"

    def variant(name, tensors=None, meta=None, raw=None):
        d = tmp_path / name
        d.mkdir()
        if raw is not None:
            (d / "rollouts.safetensors").write_bytes(raw)
        else:
            save_file(tensors or load_file(str(src / "rollouts.safetensors")), str(d / "rollouts.safetensors"))
        (d / "rollouts.json").write_text(meta if meta is not None else (src / "rollouts.json").read_text())
        return d

    t = load_file(str(src / "rollouts.safetensors"))
    foreign = dict(t, input_ids=t["input_ids"].clone())
    foreign["input_ids"][0, 3] = 5000  # past the tiny vocabulary of 300
    meta = json.loads((src / "rollouts.json").read_text())
    cases = [
        (tmp_path / "none", "holds no rollouts"),
        (variant("cut", raw=(src / "rollouts.safetensors").read_bytes()[:100]), "unreadable"),
        (variant("notjson", meta="{"), "is not a readable rollouts.json"),
        (variant("schema", meta=json.dumps({**meta, "schema_version": 99})), "has schema_version 99"),
        (variant("typed", meta=json.dumps({**meta, "seed": "0"})), "'seed' must be a whole number or null, got '0'"),
        (variant("floats", tensors=dict(t, input_ids=t["input_ids"].float())), "input_ids must be a 2-D int64"),
        (variant("shape", tensors=dict(t, response_mask=t["response_mask"][:, :-1].contiguous())), "has shape"),
        (variant("mask", tensors=dict(t, attention_mask=t["attention_mask"] * 2)), "values other than 0 and 1"),
        (variant("foreign", tensors=foreign), "token id 5000, past this model's vocabulary of 300"),
    ]
    for rollouts, match in cases:
        check_bad(cli("measure", model, "--out", out, "--rollouts", rollouts), match, out)


# ---------------------------------------------------------------------------------------------------
# arguments


@pytest.mark.parametrize(
    "args,match",
    [
        (["--scheme", "INT4"], "unknown scheme 'INT4'; supported: FP8, FP8_DYNAMIC, FP8_BLOCK, FP8_TENSOR_DYNAMIC"),
        (["--kv-cache-dtype", "int8"], "unknown KV-cache dtype 'int8'; supported: fp8, fp8_e4m3, fp8_e5m2"),
        (["--num-prompts", 0], "argument --num-prompts: 0 must be >= 1"),
        (["--max-new-tokens", -3], "argument --max-new-tokens: -3 must be >= 1"),
        (["--batch-size", 0], "argument --batch-size: 0 must be >= 1"),
        (["--temperature", "nan"], "argument --temperature: 'nan' is not a finite number"),
        (["--temperature", "-1"], "argument --temperature: -1 must be >= 0.0"),
        (["--seed", "x"], "argument --seed: 'x' is not an integer"),
        (["--granularity", "layer"], "argument --granularity: invalid choice: 'layer'"),
        (["--device", "cuda:0"], "no CUDA device is available here"),
        (["--device", "tpu9"], "device 'tpu9'"),
        (["--dtype", "int8"], "unknown dtype 'int8'"),
    ],
)
def test_bad_sweep_arguments(cli, tmp_path, tiny_dirs, args, match):
    out = tmp_path / "out"
    check_bad(cli("sweep", tiny_dirs["llama"], "--out", out, *args), match, out)


def test_block_scheme_refused_before_any_output(cli, tmp_path, broken, caplog):
    """Hidden size 96 is not whole groups of 128: a whole-model measure is refused from the config, before any
    file exists (it used to fail inside the hooks, leaving resume state that could never be resumed); a sweep
    sweeps the groups the scheme can take (down_proj, input 256) and says which it leaves BF16."""
    out = tmp_path / "out"
    msg = check_bad(
        cli("measure", broken["hidden96"], "--out", out, "--scheme", "fp8_block", *FEW),
        "FP8_BLOCK needs input dims divisible by 128",
        out,
    )
    assert "model.layers.0.self_attn.q_proj (96)" in msg and "use FP8_DYNAMIC" in msg
    r = cli("sweep", broken["hidden96"], "--out", out, "--scheme", "FP8_BLOCK", "--no-kv", *FEW)
    assert r.code == 0
    assert "FP8_BLOCK cannot quantize 9 of this model's 12 fused groups" in caplog.text
    import pandas as pd

    table = pd.read_csv(out / "sensitivity.csv")
    assert set(table[table.kind != "model"].kind) == {"down"}


def test_output_paths(cli, tmp_path, tiny_dirs, finished):
    model = tiny_dirs["llama"]
    (tmp_path / "file").write_text("x")
    check_bad(cli("sweep", model, "--out", tmp_path / "file", *FEW), "exists and is not a directory")
    check_bad(cli("sweep", model, "--out", tmp_path / "file" / "sub", *FEW), "is a file, not a directory")
    done = copy_sweep(finished, tmp_path)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in done.iterdir())
    check_bad(cli("sweep", model, "--out", done, *FEW), "holds a finished sweep already")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in done.iterdir()) == before


def test_resume_from_another_version(cli, tmp_path, tiny_dirs):
    out = tmp_path / "out"
    out.mkdir()
    (out / "sensitivity.partial.csv").write_text("unit\n")
    check_bad(cli("sweep", tiny_dirs["llama"], "--out", out, *FEW), "holds an unfinished sweep; pass --resume")
    (out / "sweep.partial.json").write_text(json.dumps({"fp8probe_version": "0.0.1", "model": "x"}))
    msg = check_bad(cli("-q", "sweep", tiny_dirs["llama"], "--out", out, "--resume", *FEW), "made by fp8probe 0.0.1")
    assert "start a new sweep in another --out" in msg and "rerun with --resume" not in msg


# ---------------------------------------------------------------------------------------------------
# recipe


def test_bad_sweep_dirs(cli, tmp_path, finished):
    out = tmp_path / "out"
    (tmp_path / "afile").write_text("x")
    cases = []

    def edited(name, run=None, table=None):
        d = copy_sweep(finished, tmp_path, name)
        if run is not None:
            (d / "run.json").write_text(run)
        if table is not None:
            (d / "sensitivity.csv").write_text(table)
        return d

    run = json.loads((finished / "sweep" / "run.json").read_text())
    table = (finished / "sweep" / "sensitivity.csv").read_text()
    header, first = table.splitlines()[:2]
    cases = [
        (tmp_path / "missing", "no such sweep directory"),
        (tmp_path / "afile", "is a file, not a sweep directory"),
        (tmp_path, "is not a finished sweep"),
        (edited("notjson", run="{"), "run.json is not a readable run.json"),
        (edited("list", run="[1, 2]"), "has schema_version None"),
        (edited("version", run=json.dumps({**run, "schema_version": 7})), "has schema_version 7"),
        (edited("typed", run=json.dumps({**run, "batch_size": "8"})), "'batch_size' must be a whole number, got '8'"),
        (edited("nocols", table="unit,kind\nx,q\n"), "lacks the columns"),
        (edited("cut", table=header + "\n" + first[: len(first) // 2] + "\n"), "run the sweep again"),
        (
            edited("text", table=table.replace(first, first.replace(first.split(",")[-1], "abc"), 1)),
            "holds values that are not numbers",
        ),
        (edited("empty", table=""), "not a readable CSV"),
    ]
    for d, match in cases:
        check_bad(cli("recipe", d, "--budget", 0.1, "--out", out), match, out), d


@pytest.mark.parametrize(
    "args,match",
    [
        (["--budget", "-1"], "argument --budget: -1 must be >= 0.0"),
        (["--budget", "nan"], "'nan' is not a finite number"),
        (["--budget", "inf"], "'inf' is not a finite number"),
        (["--budget", "0.1", "--metric", "kl"], "argument --metric: invalid choice: 'kl'"),
        (["--budget", "0.1", "--keep", "model.layers.99.mlp"], "--keep model.layers.99.mlp: no such unit or group"),
        (["--budget", "0.1", "--keep-first", "-1"], "argument --keep-first: -1 must be >= 0"),
        (["--budget", "1e-30"], "raise the budget"),
        (["--budget", "0.1", "--target", "trl"], "measures the FP8 KV cache alone: add --kv-cache-dtype fp8"),
        (
            ["--budget", "0.1", "--target", "openrlhf", "--kv-cache-scheme", "fp8"],  # llm-compressor's name, an alias
            "has no FP8 KV-cache setting; drop --kv-cache-dtype",
        ),
        (
            ["--budget", "0.1", "--kv-cache-dtype", "fp8_e5m2"],
            "argument --kv-cache-dtype/--kv-cache-scheme: invalid choice: 'fp8_e5m2' (choose from 'fp8')",
        ),
        (
            ["--budget", "0.1", "--target", "verl", "--form", "free"],
            "cannot apply --form free recipes (it takes all); use one of: all, none",
        ),
        (["--budget", "0.1", "--target", "nemo-rl"], "was swept with FP8_DYNAMIC: run `fp8probe sweep --rollouts "),
        (["--budget", "0.1", "--target", "slurm"], "argument --target: invalid choice: 'slurm'"),
        (["--budget", "0.1", "--form", "some"], "argument --form: invalid choice: 'some'"),
        (["--budget", "0.1", "--form", "all", "--keep-first", "1"], "--form all takes no --keep"),
        (["--effective-bits", "20"], "argument --effective-bits: 20 must be <= 16.0"),
        (["--fp8-share", "-0.5"], "argument --fp8-share: -0.5 must be >= 0.0"),
        (["--budget", "0.1", "--fp8-share", "0.5"], "argument --fp8-share: not allowed with argument --budget"),
        ([], "one of the arguments --budget --min-bytes-saved --effective-bits --fp8-share is required"),
        (["--min-bytes-saved", "999999999999"], "is more than FP8 can reach on this model: at most"),
        (["--budget", "0.1", "--refine", "-2"], "argument --refine: -2 must be >= 0"),
    ],
)
def test_bad_recipe_arguments(cli, tmp_path, finished, args, match):
    out = tmp_path / "out"
    check_bad(cli("recipe", finished / "sweep", "--out", out, *args), match, out)


def test_recipe_from_a_sweep_of_another_model(cli, tmp_path, finished, tiny_dirs):
    d = copy_sweep(finished, tmp_path)
    run = json.loads((d / "run.json").read_text())
    (d / "run.json").write_text(
        json.dumps({**run, "model": str(tiny_dirs["phi3"]), "model_path": str(tiny_dirs["phi3"])})
    )
    out = tmp_path / "out"
    check_bad(cli("recipe", d, "--budget", 0.1, "--out", out), "was it run on another model", out)


# ---------------------------------------------------------------------------------------------------
# export


def _recipe(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text) if isinstance(text, str) else p.write_bytes(text)
    return p


def test_bad_recipes_for_export(cli, tmp_path, tiny_dirs, finished):
    model, out = tiny_dirs["llama"], tmp_path / "ckpt"
    good = (finished / "recipe" / "recipe.yaml").read_text()
    mod = "default_stage:\n  default_modifiers:\n    QuantizationModifier:\n"
    cases = [
        (tmp_path / "none.yaml", "no such recipe file"),
        (finished / "recipe", "is a directory; pass its recipe.yaml"),
        (_recipe(tmp_path, "cut.yaml", good[: good.index("ignore") + 12] + "[a, b"), "is not valid YAML"),
        (_recipe(tmp_path, "latin1.yaml", "scheme: caf\xe9\n".encode("latin-1")), "not a UTF-8 YAML file"),
        (_recipe(tmp_path, "empty.yaml", "{}\n"), "exactly one QuantizationModifier"),
        (
            _recipe(tmp_path, "unknown.yaml", mod + "      scheme: FP8_DYNAMIC\n      bits: 4\n"),
            "unsupported QuantizationModifier key 'bits'",
        ),
        (
            _recipe(tmp_path, "ignore.yaml", mod + "      scheme: FP8_DYNAMIC\n      ignore: lm_head\n"),
            "`ignore` must be a list of module names",
        ),
        (_recipe(tmp_path, "scheme.yaml", mod + "      scheme: INT4\n"), "unknown scheme 'INT4'"),
        (
            _recipe(tmp_path, "regex.yaml", mod + "      scheme: FP8_DYNAMIC\n      ignore: ['re:(']\n"),
            "not a valid regular expression",
        ),
        (
            _recipe(
                tmp_path,
                "other.yaml",
                mod + "      scheme: FP8_DYNAMIC\n      ignore: [lm_head, model.layers.17.mlp.down_proj]\n",
            ),
            "it was made for another model",
        ),
    ]
    for recipe, match in cases:
        check_bad(cli("export", model, "--recipe", recipe, "--out", out), match, out)
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    check_bad(
        cli("export", model, "--recipe", finished / "recipe" / "recipe.yaml", "--out", out), "exists and is not empty"
    )
    assert (out / "keep.txt").read_text() == "mine"


def test_export_targets_that_cannot_apply_the_recipe(cli, tmp_path, tiny_dirs, finished):
    """A target that cannot apply any given recipe: one line saying what it would do; nothing written."""
    model, out, recipe = tiny_dirs["llama"], tmp_path / "out", finished / "recipe" / "recipe.yaml"
    check_bad(
        cli("export", model, "--recipe", recipe, "--out", out, "--target", "openrlhf"),
        "BF16 only: no quantization or kv_cache_dtype reaches its vLLM engines; it would run the recipe's",
        out,
    )
    check_bad(
        cli("export", model, "--recipe", recipe, "--out", out, "--target", "verl", "trl"),
        "no target can apply these recipes: verl (vLLM rollout) puts every Linear in FP8_BLOCK, which cannot "
        "take 3 of this model's 12 fused groups",
        out,
    )
    check_bad(
        cli("export", model, "--recipe", recipe, "--out", out, "--target", "kubeflow"),
        "argument --target: invalid choice: 'kubeflow'",
        out,
    )


def test_missing_export_extra(cli, tmp_path, tiny_dirs, finished, monkeypatch):
    """Without llm-compressor: one line naming the pip command, not an ImportError traceback."""
    monkeypatch.setitem(sys.modules, "llmcompressor", None)  # import fails as if not installed
    out = tmp_path / "ckpt"
    check_bad(
        cli("export", tiny_dirs["llama"], "--recipe", finished / "recipe" / "recipe.yaml", "--out", out),
        "pip install 'fp8probe[export]'",
        out,
    )


# ---------------------------------------------------------------------------------------------------
# capacity


def test_bad_capacity_configs(cli, tmp_path, tiny_dirs):
    cfg = json.loads((tiny_dirs["llama"] / "config.json").read_text())
    files = {
        "cut.json": '{"model_type": "llama", "hidden_size": 12',
        "latin1.json": None,
        "list.json": "[1, 2]",
        "nomodel.json": json.dumps({"hidden_size": 128}),
        "typed.json": json.dumps({**cfg, "num_attention_heads": -4}),
        "floaty.json": json.dumps({**cfg, "hidden_size": 127.5}),
    }
    for name, text in files.items():
        if text is None:
            (tmp_path / name).write_bytes('{"model_type": "caf\xe9"}'.encode("latin-1"))
        else:
            (tmp_path / name).write_text(text)
    out = tmp_path / "out"
    for name, match in [
        ("cut.json", "is not valid JSON"),
        ("latin1.json", "is not valid JSON"),
        ("list.json", "has no model_type"),
        ("nomodel.json", "has no model_type"),
        ("typed.json", "num_attention_heads is -4"),
        ("floaty.json", "field 'hidden_size'"),
    ]:
        check_bad(cli("capacity", tmp_path / name, "--out", out), match, out)


@pytest.mark.parametrize(
    "args,match",
    [
        (["--gpu", "X100"], "unknown GPU 'X100'; presets:"),
        (["--gpu-memory", "0"], "argument --gpu-memory: 0 must be > 0.0"),
        (["--gpu-memory", "-8"], "argument --gpu-memory: -8 must be > 0.0"),
        (["--gpu-memory", "inf"], "'inf' is not a finite number"),
        (["--kv-cache-memory", "-5"], "argument --kv-cache-memory: -5 must be >= 1"),
        (["--max-model-len", "0"], "argument --max-model-len: 0 must be >= 1"),
        (["--tensor-parallel-size", "0"], "argument --tensor-parallel-size: 0 must be >= 1"),
        (["--tensor-parallel-size", "3"], "do not split over 3 ranks"),
        (["--gpu-memory-utilization", "1.5"], "1.5 must be <= 1.0"),
        (["--kv-cache-dtype", "int4"], "argument --kv-cache-dtype: invalid choice: 'int4'"),
        (["--scheme", "W4A16"], "unknown scheme 'W4A16'"),
        (["--gpu-memory", "0.01"], "leave no room for a KV cache"),
        (["--plot"], "--plot needs --out DIR"),
    ],
)
def test_bad_capacity_arguments(cli, tmp_path, tiny_dirs, args, match):
    out = tmp_path / "out"
    extra = [] if "--plot" in args else ["--out", out]
    check_bad(cli("capacity", tiny_dirs["llama"], *extra, *args), match, out)


def test_capacity_recipe_of_another_model(cli, tmp_path, tiny_dirs, finished):
    out = tmp_path / "out"
    check_bad(
        cli("capacity", tiny_dirs["llama"], "--recipe", tmp_path / "none.yaml", "--out", out),
        "no such recipe file",
        out,
    )
    recipe = _recipe(
        tmp_path,
        "r.yaml",
        "default_stage:\n  default_modifiers:\n    QuantizationModifier:\n"
        "      scheme: FP8_DYNAMIC\n      ignore: [lm_head, model.layers.5.self_attn.q_proj]\n",
    )
    check_bad(cli("capacity", tiny_dirs["llama"], "--recipe", recipe, "--out", out), "made for another model", out)


# ---------------------------------------------------------------------------------------------------
# the CLI itself


def test_usage_errors_are_one_line(cli):
    check_bad(cli("units", "--bogus"), "unrecognized arguments: --bogus")
    check_bad(cli("frobnicate"), "argument COMMAND: invalid choice: 'frobnicate'")
    check_bad(cli("recipe"), "the following arguments are required")


def test_internal_error_asks_for_a_report(cli, tmp_path, tiny_dirs, monkeypatch):
    """A bug (here: an exception injected into the sweep) exits 1 with one line; --verbose shows the traceback."""
    import importlib

    def boom(*a, **k):
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(importlib.import_module("fp8probe.sweeps.sweep"), "plan_rows", boom)
    out = tmp_path / "out"
    msg = check_bad(
        cli("-q", "sweep", tiny_dirs["llama"], "--out", out, *FEW),
        "internal error (ZeroDivisionError: injected)",
        out,
        code=1,
    )
    assert "please report it" in msg and "--verbose" in msg
    r = cli("-v", "sweep", tiny_dirs["llama"], "--out", out, *FEW)
    assert r.code == 1 and "Traceback" in r.err and r.lines[-1].startswith("fp8probe: error: internal error")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------
# ladder, check, budget


def test_bad_ladder_and_check_inputs(cli, tmp_path, tiny_dirs, broken):
    model, out = tiny_dirs["llama"], tmp_path / "out"
    cases = [
        (["ladder", "--noise", "-1"], "argument --noise: -1 must be > 0.0"),
        (["ladder", "--noise", "nan"], "'nan' is not a finite number"),
        (["ladder", "--stale", tmp_path / "missing"], "no such file or directory"),
        (["ladder", "--stale", broken["gpt2"]], "unsupported architecture 'gpt2'"),
        (["ladder", "--recipe", tmp_path / "none.yaml"], "no such recipe file"),
        (["ladder", "--kv-cache-dtype", "int8"], "unknown KV-cache dtype 'int8'"),
        (["ladder", "--teacher", tmp_path / "missing"], "no such file or directory"),
        (["check", "--budget", "1e-3", "--stale", model, model], "check takes one configuration"),
        (["check", "--budget", "1e-3", "--kv-cache-dtype", "fp8", "--metric", "kl"], "invalid choice: 'kl'"),
        (["check", "--budget", "inf", "--kv-cache-dtype", "fp8"], "finite, non-negative"),
    ]
    for args, match in cases:
        check_bad(cli(args[0], model, "--out", out, *args[1:], *FEW), match, out)


def test_calibrate_refit_of_a_calibration_without_its_runs_table(cli, tmp_path):
    """A calibration directory with calibrate.json but no runs.csv (the shipped rl-collapse experiment keeps its
    table under another name) is refused in one line before anything is written (it was an internal error: pandas'
    'No objects to concatenate' after the partial file was written)."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m" / "rl-collapse"
    d = tmp_path / "cal"
    shutil.copytree(src, d)
    before = sorted(p.name for p in d.iterdir())
    r = cli("calibrate", "--out", d, "--refit")
    check_bad(r, "no runs.csv in")
    assert sorted(p.name for p in d.iterdir()) == before
