"""The notebooks run, top to bottom, on a small sweep of the embedded student, and are committed without outputs."""

import json
import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_committed_without_outputs():
    assert {p.name for p in NOTEBOOKS} == {"sensitivity.ipynb", "recipe_explorer.ipynb"}
    for p in NOTEBOOKS:
        nb = json.loads(p.read_text())
        assert nb["cells"][0]["cell_type"] == "markdown", f"{p.name} opens with what it shows"
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                assert c["outputs"] == [] and c["execution_count"] is None, f"{p.name} holds outputs"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """The README's first command's sweep (auto, 2 prompts x 8 tokens): CI made it in its step 1 and says where
    (FP8PROBE_QUICKSTART_RUN), so it is copied; elsewhere it is run here."""
    import shutil

    from fp8probe.cli import main

    d = tmp_path_factory.mktemp("nb") / "run"
    given = Path(os.environ.get("FP8PROBE_QUICKSTART_RUN", "/nonexistent"))
    if (given / "run.json").exists():
        run = json.loads((given / "run.json").read_text())
        if run["method"]["method"] == "auto" and run["num_sequences"] == 2 and run["model"] == "smollm2-135m":
            shutil.copytree(given, d)
            return d
    assert (
        main(["-q", "sweep", "--out", str(d), "--method", "auto", "--num-prompts", "2", "--max-new-tokens", "8"]) == 0
    )
    return d


@pytest.mark.slow  # a sweep of the real embedded student
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, small_run, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("FP8PROBE_RUN", str(small_run))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {}))
    assert images >= {"sensitivity.ipynb": 4, "recipe_explorer.ipynb": 2}[path.name]
    if path.name == "sensitivity.ipynb":  # what it computed is what the run's table holds
        import numpy as np
        import pandas as pd

        df = pd.read_csv(small_run / "sensitivity.csv")
        top = df[df.kind != "model"].sort_values("kl_q_p", ascending=False).unit.iloc[0]
        shown = next(
            o["data"]["text/plain"]
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.outputs
            if "text/plain" in o.get("data", {}) and "sqnr_db" in o["data"]["text/plain"]
        )
        assert shown.splitlines()[1].split()[1] == top  # the first row of the most-sensitive display
        units = df[~df.kind.isin(["model", "kv"])]
        text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        rho = float(text.split("Spearman rank correlation, -SQNR vs kl_q_p:")[1].split()[0])
        assert rho == pytest.approx(np.corrcoef(_ranks(units["kl_q_p"]), _ranks(-units["sqnr_db"]))[0, 1], abs=5e-4)
    if path.name == "recipe_explorer.ipynb":  # it measured a recipe with the CLI and read its capacity
        (recipe,) = small_run.glob("recipe-*/recipe.json")
        assert json.loads(recipe.read_text())["measured"] is not None
        assert (recipe.parent / "capacity.json").exists()
    os.environ.pop("FP8PROBE_RUN", None)


def _ranks(values) -> list[float]:
    """Average ranks (1-based; ties share the mean of their positions), for Spearman's rho by hand."""
    vals = list(values)
    order = sorted(range(len(vals)), key=lambda i: vals[i])
    ranks = [0.0] * len(vals)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and vals[order[j + 1]] == vals[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
