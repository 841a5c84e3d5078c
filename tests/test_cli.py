"""The command line: help and version, and bad input -> one line, exit 2, nothing left behind."""

import subprocess
import sys

import pytest


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "fp8probe.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, **kw)


def test_help_and_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("fp8probe 0.")
    r = run("--help")
    assert r.returncode == 0 and "sweep" in r.stdout
    r = run("sweep", "--help")
    assert r.returncode == 0 and "--resume" in r.stdout and "examples:" in r.stdout


def _bad(tmp_path, *args, match):
    out = tmp_path / "out"
    r = run(*args, "--out", out) if "--out" not in args else run(*args)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fp8probe: error:"), r.stderr
    assert match in lines[0]
    assert not out.exists()
    return lines[0]


def test_missing_path(tmp_path):
    _bad(tmp_path, "sweep", tmp_path / "nope" / "model", match="no such file or directory")


def test_not_a_model(tmp_path):
    (tmp_path / "dir").mkdir()
    _bad(tmp_path, "sweep", tmp_path / "dir", match="not a Hugging Face model directory")
    (tmp_path / "weights.dat").write_bytes(b"\0" * 100)
    _bad(tmp_path, "rollouts", tmp_path / "weights.dat", match="not a model")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 100)
    _bad(tmp_path, "rollouts", tmp_path / "weights.bin", match="is a pickled checkpoint file")


def test_truncated_gguf(tmp_path):
    from fp8probe.embedded import embedded_gguf

    with open(embedded_gguf(), "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(500_000))
    _bad(tmp_path, "sweep", tmp_path / "cut.gguf", match="truncated or corrupt")


def test_empty_prompts(tmp_path, tiny_dirs):
    (tmp_path / "p.txt").write_text("\n\n")
    _bad(tmp_path, "sweep", tiny_dirs["llama"], "--prompts", tmp_path / "p.txt", match="is empty")


def test_unknown_scheme(tmp_path, tiny_dirs):
    msg = _bad(tmp_path, "sweep", tiny_dirs["llama"], "--scheme", "INT4", match="unknown scheme")
    assert "FP8, FP8_DYNAMIC, FP8_BLOCK" in msg


def test_unwritable_output(tmp_path, tiny_dirs):
    (tmp_path / "file").write_text("x")
    r = run("sweep", tiny_dirs["llama"], "--out", tmp_path / "file" / "out")
    assert r.returncode == 2 and r.stderr.strip().startswith("fp8probe: error: cannot create")
    assert len(r.stderr.strip().splitlines()) == 1


def test_unfinished_sweep_needs_resume(tmp_path, tiny_dirs):
    out = tmp_path / "out"
    out.mkdir()
    (out / "sensitivity.partial.csv").write_text("unit\n")
    r = run("sweep", tiny_dirs["llama"], "--out", out)
    assert r.returncode == 2 and "pass --resume" in r.stderr


@pytest.mark.parametrize("arch", ["qwen3", "mixtral"])
def test_measure_and_units_on_tiny(tmp_path, tiny_dirs, arch):
    r = run("-q", "measure", tiny_dirs[arch], "--out", tmp_path / "m", "--num-prompts", 3, "--max-new-tokens", 5,
            "--kv-cache-dtype", "fp8")
    assert r.returncode == 0, r.stderr
    import json

    rep = json.loads((tmp_path / "m" / "mismatch.json").read_text())
    assert rep["metrics"]["kl_q_p"] > 0 and rep["schema_version"] == 1
    assert (tmp_path / "m" / "rollouts.safetensors").exists()
    r = run("-q", "units", tiny_dirs[arch])
    assert r.returncode == 0 and "qkv_proj" in r.stdout
