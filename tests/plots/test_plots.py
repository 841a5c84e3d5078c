"""The figures render from the files fp8probe writes; `fp8probe plot` draws every one a run directory allows."""

import json

import pandas as pd
import pytest

from fp8probe.plots.figures import capacity_bars, frontier, sensitivity_heatmap


def _table():
    rows = []
    for b in range(3):
        for k in ("q", "k", "v", "o", "gate", "up", "down"):
            grp = (
                f"model.layers.{b}."
                + {
                    "q": "self_attn.qkv_proj",
                    "k": "self_attn.qkv_proj",
                    "v": "self_attn.qkv_proj",
                    "o": "self_attn.o_proj",
                    "gate": "mlp.gate_up_proj",
                    "up": "mlp.gate_up_proj",
                    "down": "mlp.down_proj",
                }[k]
            )
            rows.append(
                {
                    "unit": f"model.layers.{b}.{k}",
                    "kind": k,
                    "block": b,
                    "group": grp,
                    "bytes_saved": 1000 * (b + 1),
                    "kl_q_p": 1e-4 * (b + 1),
                }
            )
        rows.append({"unit": f"kv{b}", "kind": "kv", "block": b, "group": f"kv{b}", "bytes_saved": 0, "kl_q_p": 1e-5})
    rows.append(
        {"unit": "model.fp8_all", "kind": "model", "block": -1, "group": "model", "bytes_saved": 1, "kl_q_p": 1e-2}
    )
    return pd.DataFrame(rows)


def test_figures(tmp_path):
    from fp8probe.core.records import CapacityRecord

    sensitivity_heatmap(_table(), tmp_path / "h.png")
    frontier(_table(), [], tmp_path / "b.png")  # the prediction alone
    side = {"kv_tokens": 100, "max_concurrency": 1.5, "scheme": "FP8_DYNAMIC", "kv_cache_dtype": "fp8"}
    capacity_bars(
        CapacityRecord(
            vllm_version="0.32.0",
            model_type="llama",
            max_model_len=8192,
            block_size=16,
            tensor_parallel_size=1,
            gpu="H100",
            gpu_memory_utilization=0.9,
            baseline=dict(side, scheme=None, kv_cache_dtype="auto"),
            candidate=side,
            ratio_kv_tokens=1.0,
            ratio_concurrency=1.0,
        ),
        tmp_path / "c.png",
    )
    for f in ("h.png", "b.png", "c.png"):
        assert (tmp_path / f).read_bytes()[:4] == b"\x89PNG"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_dirs):
    """A tiny model's run directory with everything fp8probe plots: an auto sweep, two recipes of it, a capacity
    report and a ladder with the budget it was checked against."""
    from fp8probe.cli import main

    d = tmp_path_factory.mktemp("plotrun") / "run"
    model = str(tiny_dirs["llama"])
    assert (
        main(
            [
                "-q",
                "sweep",
                model,
                "--out",
                str(d),
                "--method",
                "auto",
                "--top-k",
                "6",
                "--controls",
                "3",
                "--num-prompts",
                "4",
                "--max-new-tokens",
                "10",
            ]
        )
        == 0
    )
    whole = float(pd.read_csv(d / "sensitivity.csv").set_index("unit").loc["model.fp8_all", "kl_q_p"])
    for frac in (0.2, 0.5):
        assert (
            main(
                [
                    "-q",
                    "recipe",
                    str(d),
                    "--budget",
                    str(whole * frac),
                    "--refine",
                    "2",
                    "--out",
                    str(d / f"recipe-{frac}"),
                ]
            )
            == 0
        )
    assert (
        main(
            [
                "-q",
                "capacity",
                model,
                "--recipe",
                str(d / "recipe-0.5" / "recipe.yaml"),
                "--kv-cache-dtype",
                "fp8",
                "--out",
                str(d / "recipe-0.5"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "-q",
                "ladder",
                model,
                "--rollouts",
                str(d),
                "--out",
                str(d / "ladder"),
                "--noise",
                "0.01",
                "0.03",
                "--recipe",
                str(d / "recipe-0.5" / "recipe.yaml"),
                "--kv-cache-dtype",
                "fp8",
                "--no-prefix-shift",
            ]
        )
        == 0
    )
    (d / "ladder" / "budget.json").write_text(json.dumps({"value": whole * 0.5, "metric": "kl_q_p"}))
    return d


def test_plot_command_draws_every_figure(cli, run_dir, tmp_path):
    out = tmp_path / "figs"
    res = cli("plot", run_dir, "--out", out)
    assert res.code == 0, res.err
    names = {p.stem for p in out.iterdir()}
    assert names == {
        "sensitivity_by_block",
        "sensitivity_heatmap",
        "token_kl",
        "frontier",
        "fast_vs_exact",
        "capacity-recipe-0.5",
        "ladder-ladder",
    }
    for p in out.iterdir():
        assert p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 10_000
    svg = tmp_path / "svg"
    assert cli("plot", run_dir, "--out", svg, "--format", "svg").code == 0
    assert sorted(p.stem for p in svg.iterdir()) == sorted(names)  # every figure again, as SVG
    assert all(p.suffix == ".svg" and b"<svg" in p.read_bytes()[:400] for p in svg.iterdir())


def test_heatmap_shows_the_tables_numbers():
    """The heatmap's cells are log10 of the table's kl_q_p, summed per (kind, block), kinds in plotting order."""
    import numpy as np

    df = _table()
    fig = sensitivity_heatmap(df)
    cells = np.asarray(fig.axes[0].images[0].get_array())
    kinds = ["q", "k", "v", "o", "gate", "up", "down", "kv"]
    want = [[np.log10(df[(df.kind == k) & (df.block == b)].kl_q_p.sum()) for b in range(3)] for k in kinds]
    assert cells.shape == (8, 3) and np.allclose(cells, want, rtol=0, atol=1e-12)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == kinds


def test_frontier_shows_every_recipe_search(run_dir):
    """The measured points drawn are the recipes' own search entries, one star per chosen recipe where it was
    searched, and its held-out value with its interval (an error bar)."""
    from matplotlib.collections import PathCollection

    from fp8probe.plots.figures import frontier, recipes_of
    from fp8probe.sweeps.files import read_sweep

    recipes = recipes_of(run_dir)
    assert sorted(name for name, _ in recipes) == ["recipe-0.2", "recipe-0.5"]
    assert all(r.split and r.measured_interval for _, r in recipes)  # the default split
    fig = frontier(read_sweep(run_dir).table, recipes)
    ax = fig.axes[0]
    drawn = sorted(
        tuple(map(float, xy)) for c in ax.collections if isinstance(c, PathCollection) for xy in c.get_offsets()
    )
    want = [
        (e["bytes_saved"] / 2**20, e["measured"])
        for _, r in recipes
        for e in r.search
        if e.get("bytes_saved") and e["measured"] > 0
    ]
    want += [(r.bytes_saved / 2**20, r.measured_search) for _, r in recipes]  # the chosen ones, as stars
    assert len(drawn) == len(want)
    assert [v for xy in drawn for v in xy] == pytest.approx([v for xy in sorted(want) for v in xy], rel=1e-12)
    held = sorted(float(v) for c in ax.containers for xy in c.lines[0].get_xydata() for v in xy)
    assert held == pytest.approx(sorted(v for _, r in recipes for v in (r.bytes_saved / 2**20, r.measured)))
    bars = sorted(float(v) for c in ax.containers for seg in c.lines[2][0].get_segments() for v in seg[:, 1])
    assert bars == pytest.approx(sorted(v for _, r in recipes for v in r.measured_interval))
    budgets = sorted(line.get_ydata()[0] for line in ax.lines[1:] if list(line.get_xdata()) == [0, 1])
    assert budgets == pytest.approx(sorted(r.budget for _, r in recipes))


def test_plot_refuses_what_it_cannot_draw(cli, tmp_path):
    res = cli("plot", tmp_path)
    assert res.code == 2 and "holds none of the files" in res.err and len(res.lines) == 1
    res = cli("plot", tmp_path / "missing")
    assert res.code == 2 and "no such run directory" in res.err
