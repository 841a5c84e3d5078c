"""In-context costs and path attributions (benchmarks/attribution.py, pricing.py, path_sweep.py: out of the package
with `sweep --method path`): a pair of groups that costs little alone and much together, the path attribution's
completeness against the measured mismatch, and the path sweep a recipe reads."""

import json
from dataclasses import dataclass, replace

import numpy as np
import pytest
from conftest import benchmark, tiny_student

from fp8probe.core.errors import FP8ProbeError
from fp8probe.core.schemes import Scheme
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.measure import measure_scheme
from fp8probe.measurement.reference import Reference
from fp8probe.model.rollouts import make_rollouts

_attribution = benchmark("attribution")
path_attribution, path_integral = _attribution.path_attribution, _attribution.path_integral
in_context_costs = benchmark("pricing").in_context_costs


def score_as(groups, costs):  # ranked by a price, a price below zero as free (what make_recipe does with a score)
    return [replace(g, score=max(float(costs[g.group]), 0.0)) for g in groups]


# a synthetic objective with a known interaction: L(t) = Σ a_i t_i² + b t_0 t_1 (groups 0 and 1 cheap alone, dear
# together), its exact gradient; a set in FP8 is t_i = 1 for its members
A = np.array([0.1, 0.1, 0.5, 0.3])
B = 2.0


def _loss(t):
    return float(A @ (t * t) + B * t[0] * t[1])


def _grad(t):
    g = 2 * A * t
    g[0] += B * t[1]
    g[1] += B * t[0]
    return g


@dataclass
class G:
    group: str
    score: float = 0.0


def _measure(groups):
    t = np.zeros(len(A))
    for g in groups:
        t[int(g.group)] = 1.0
    return _loss(t), {}


def test_in_context_costs_see_the_pair_single_costs_miss():
    gs = [G(str(i)) for i in range(4)]
    single = {g.group: _measure([g])[0] for g in gs}
    assert single["0"] == pytest.approx(0.1) and single["2"] == pytest.approx(0.5)  # alone, 0 and 1 look cheapest
    # operating point {0, 1, 2}: leaving 0 out saves its own 0.1 and the pair's 2.0; adding 3 costs its 0.3
    ctx = in_context_costs(gs[:3], gs, _measure)
    assert ctx == pytest.approx({"0": 2.1, "1": 2.1, "2": 0.5, "3": 0.3})
    # ranked by the in-context costs, 0 and 1 are now the dearest
    ranked = sorted(score_as(gs, ctx), key=lambda g: g.score)
    assert [g.group for g in ranked[:2]] == ["3", "2"]
    # the path attribution splits the pair's cost between its two members and adds up to the whole set's cost
    shares, path = path_integral(lambda t: (_grad(np.full(4, t)), _loss(np.full(4, t))), nodes=2)
    assert shares == pytest.approx([0.1 + B / 2, 0.1 + B / 2, 0.5, 0.3])
    assert shares.sum() == pytest.approx(_loss(np.ones(4)))
    assert [t for t, _ in path] == pytest.approx([0.5 - 0.5 / 3**0.5, 0.5 + 0.5 / 3**0.5])


@pytest.fixture(scope="module")
def tiny():
    s = tiny_student("llama", num_hidden_layers=4)
    r = make_rollouts(s, num_prompts=6, max_new_tokens=20, seed=0)
    return s, r


@pytest.mark.parametrize("scheme", ["FP8_DYNAMIC", "FP8"])
def test_path_shares_add_up_to_the_measured_mismatch(tiny, scheme):
    """Completeness against the simulation's own measurement (measure: quantize_units and a forward, not the path's
    hooks): Σ shares = KL of the whole set in FP8, and a one-group path is that group's measured row."""
    s, r = tiny
    sch = Scheme.from_name(scheme)
    ref = Reference(s, r)
    groups = {g: [u.name for u in us] for g, us in s.groups().items()}
    att = path_attribution(s, r, ref, groups, sch, nodes=4)
    whole = measure_scheme(Bench.around(ref, s, r), scheme, [u for us in groups.values() for u in us])["kl_q_p"]
    assert att.total == pytest.approx(whole, rel=0.03)
    assert all(v > -0.05 * whole for v in att.shares.values())
    one = sorted(groups)[3]
    alone = path_attribution(s, r, ref, {one: groups[one]}, sch, nodes=4)
    assert alone.total == pytest.approx(
        measure_scheme(Bench.around(ref, s, r), scheme, groups[one])["kl_q_p"], rel=0.03
    )
    # the loss along the path rises from 0 toward the whole set's mismatch
    losses = [v for _, v in att.path]
    assert losses == sorted(losses) and losses[-1] < whole


def test_a_path_from_a_fixed_recipe_prices_what_the_rest_adds(tiny):
    """Groups fixed in FP8 all along the path: the shares of the others add up to m(fixed ∪ path) − m(fixed), both
    measured by the simulation."""
    s, r = tiny
    ref = Reference(s, r)
    groups = {g: [u.name for u in us] for g, us in s.groups().items()}
    names = sorted(groups)
    fixed = {g: groups[g] for g in names[::2]}
    rest = {g: groups[g] for g in names[1::2]}
    att = path_attribution(s, r, ref, rest, Scheme.from_name("FP8_DYNAMIC"), nodes=4, fixed=fixed)
    assert set(att.shares) == set(rest)

    def m(gs):
        return measure_scheme(Bench.around(ref, s, r), "FP8_DYNAMIC", [u for g in gs for u in groups[g]])["kl_q_p"]

    assert att.total == pytest.approx(m(names) - m(fixed), rel=0.05)
    with pytest.raises(ValueError, match="both fixed"):
        path_attribution(s, r, ref, rest, Scheme.from_name("FP8_DYNAMIC"), fixed=rest)


def test_the_path_sweep_prices_rows_that_add_up_to_the_whole_model(cli, tiny_dirs, tmp_path):
    """benchmarks/path_sweep.py (`sweep --method path` until it left the package): every weight row is its path share,
    and the shares add up to the whole model's FP8 mismatch measured by an exact sweep of the same rollouts
    (measure_scheme(): quantized weights and a forward, not the path's hooks); the whole-model rows are the source
    sweep's; the ranking follows the exact sweep's; `fp8probe recipe` reads it; and the CLI no longer offers it."""
    from fp8probe import load_student
    from fp8probe.core.stats import spearman
    from fp8probe.sweeps.files import read_sweep

    exact = tmp_path / "exact"
    common = ["--granularity", "group", "--scheme", "FP8", "--num-prompts", "4", "--max-new-tokens", "10"]
    assert cli("sweep", tiny_dirs["llama"], "--out", exact, "--method", "exact", *common).code == 0
    path = tmp_path / "path"
    run = benchmark("path_sweep").path_sweep(load_student(str(tiny_dirs["llama"])), exact, path, nodes=4)
    df = run.table.set_index("unit")
    weights = df[~df["kind"].isin(["model", "kv"])]
    assert set(weights["method"]) == {"path"} and (weights["kl_fisher"] == weights["kl_q_p"]).all()
    assert set(df[df["kind"].isin(["model", "kv"])]["method"]) == {"exact"}
    whole = df.loc["model.fp8_all", "kl_q_p"]
    assert weights["kl_q_p"].sum() == pytest.approx(whole, rel=0.03)
    ex = read_sweep(exact).table.set_index("unit").loc[weights.index, "kl_q_p"]
    assert spearman(list(weights["kl_q_p"]), list(ex)) > 0.8
    rec = json.loads((path / "run.json").read_text())
    assert rec["method"] == {"method": "path", "nodes": 4} and rec["seconds"]["path"] > 0
    assert cli("recipe", path, "--budget", str(whole / 2), "--out", tmp_path / "r").code == 0
    gone = cli("sweep", tiny_dirs["llama"], "--out", tmp_path / "p2", "--method", "path", *common)
    assert gone.code != 0 and "path" in gone.err and not (tmp_path / "p2").exists()


def test_the_path_sweep_refuses_a_unit_table_and_a_moe_student_before_any_output(cli, tiny_dirs, tmp_path):
    """Experts are not on the path, and a row per Linear is not a fused group: both refused in one line, before any
    pass, leaving no output directory."""
    from fp8probe import load_student

    path_sweep = benchmark("path_sweep").path_sweep
    for arch, granularity in (("qwen3_moe", "group"), ("llama", "unit")):
        src = tmp_path / f"{arch}-{granularity}"
        args = ["--num-prompts", "2", "--max-new-tokens", "4", "--method", "fisher", "--granularity", granularity]
        assert cli("sweep", tiny_dirs[arch], "--out", src, *args).code == 0
        out = tmp_path / f"{arch}-path"
        with pytest.raises(FP8ProbeError, match="MoE experts" if arch == "qwen3_moe" else "per unit|fused groups"):
            path_sweep(load_student(str(tiny_dirs[arch])), src, out)
        assert not out.exists()
