"""A small golden run: sweep, recipe and capacity on a tiny model must write the same files as when the golden
copies in tests/golden/ were made. It guards refactors that promise "behaviour unchanged".

Only what depends on the machine is normalized: the temporary directory (written as <ROOT>), timings and
versions in run.json. Everything else is compared byte for byte. To regenerate after a deliberate change:
FP8PROBE_REGEN_GOLDEN=1 pytest tests/test_golden.py (and say why in the commit).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import tiny_model, tiny_tokenizer

GOLDEN = Path(__file__).with_name("golden") / "tiny-llama"
VOLATILE = {"seconds", "versions"}  # run.json keys that depend on the machine


def _normalize(path: Path, root: Path) -> bytes:
    text = path.read_bytes()
    if path.suffix in (".json", ".yaml", ".csv"):
        text = text.replace(str(root).encode(), b"<ROOT>")
    if path.name == "run.json":
        doc = {k: v for k, v in json.loads(text).items() if k not in VOLATILE}
        text = (json.dumps(doc, indent=2) + "\n").encode()
    return text


def test_golden_run(cli, tmp_path):
    model = tmp_path / "model"
    tiny_model("llama").save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    sweep, recipe, cap = tmp_path / "sweep", tmp_path / "recipe", tmp_path / "capacity"
    r = cli("-q", "sweep", model, "--out", sweep, "--num-prompts", 4, "--max-new-tokens", 8, "--seed", 3)
    assert r.code == 0, r.err
    r = cli("-q", "recipe", sweep, "--budget", 0.004, "--keep-last", 1, "--out", recipe)
    assert r.code == 0, r.err
    r = cli("-q", "capacity", model, "--recipe", recipe / "recipe.yaml", "--kv-cache-memory", 1 << 24,
            "--max-model-len", 256, "--out", cap)
    assert r.code == 0, r.err
    files = {f"sweep/{n}": sweep / n for n in ("sensitivity.csv", "run.json", "rollouts.json", "rollouts.safetensors")}
    files.update({f"recipe/{n}": recipe / n for n in ("recipe.yaml", "recipe.json")})
    files["capacity/capacity.json"] = cap / "capacity.json"
    got = {name: _normalize(p, tmp_path) for name, p in files.items()}
    if os.environ.get("FP8PROBE_REGEN_GOLDEN"):
        for name, data in got.items():
            (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / name).write_bytes(data)
        pytest.skip("golden files regenerated")
    for name, data in got.items():
        assert data == (GOLDEN / name).read_bytes(), f"{name} differs from the golden run"
