"""Recipes chosen on groups priced at the operating point (benchmarks/pricing.py, the peer table's `--costs` rows:
they left the package), the prices checked against the simulation's own measurements; and groups ranked by a damage
model's terms (`--costs damage`, what `recipe --damage-model` did before it left the package)."""

import numpy as np
import pytest
from conftest import ask, benchmark, tiny_student

from fp8probe import measure_scheme
from fp8probe.core.schemes import Scheme
from fp8probe.measurement.bench import Bench
from fp8probe.model.rollouts import make_rollouts
from fp8probe.recipe.selection import group_scores, make_recipe
from fp8probe.sweeps.settings import SweepSettings
from fp8probe.sweeps.sweep import sweep

pricing = benchmark("pricing")


@pytest.fixture(scope="module")
def setup():
    st = tiny_student("llama", num_hidden_layers=4)
    r = make_rollouts(st, num_prompts=6, max_new_tokens=10)
    bench = Bench(st, r)
    return st, r, bench, sweep(bench, SweepSettings(method="exact", granularity="group")).table


def _cheapest_half(st, members, prices) -> list:
    """The groups a 50 % FP8 share takes when ranked by price per weight, cheapest first (ties: later blocks, then
    name), sorted: selection.rank_groups's order, written out, up to the group that crosses the target (which
    make_recipe replaces by the set of the next ranked groups that lands closest: _takes below)."""
    size = {g: sum(st.unit(u).params for u in us) for g, us in members.items()}
    block = {g: st.unit(us[0]).block for g, us in members.items()}
    total = sum(size.values()) + st.model.lm_head.weight.numel()
    want, have = [], 0
    for g in sorted(members, key=lambda g: (prices[g] / size[g], -block[g], g)):
        if have >= 0.5 * total:
            break
        want.append(g)
        have += size[g]
    return sorted(want)


def _takes(rec, st, members, prices) -> bool:
    """The recipe holds the cheapest ranked groups before the one that crosses the target, the rest from the next
    ranked groups (selection.FILL_WINDOW), and reaches the target."""
    from fp8probe.recipe.selection import FILL_WINDOW

    size = {g: sum(st.unit(u).params for u in us) for g, us in members.items()}
    block = {g: st.unit(us[0]).block for g, us in members.items()}
    ranked = sorted(members, key=lambda g: (prices[g] / size[g], -block[g], g))
    head = [g for g in ranked if g in _cheapest_half(st, members, prices)][:-1]
    rest = set(rec.quantized) - set(head)
    return set(head) <= set(rec.quantized) and rest <= set(ranked[len(head) : len(head) + FILL_WINDOW])


def _m(bench, groups, members):
    return measure_scheme(bench, "FP8_DYNAMIC", units=[u for g in groups for u in members[g]])["kl_q_p"]


@pytest.mark.parametrize("costs", ["context", "path"])
def test_groups_priced_at_the_operating_point(setup, costs):
    st, _, bench, df = setup
    members = {g: [u.name for u in us] for g, us in st.groups().items()}
    single = make_recipe(df, bench, ask(fp8_share=0.5))
    by_name = {g.group: g for g in group_scores(df, "kl_q_p", members)}
    point = [by_name[g] for g in single.quantized]  # the single rows' choice is where groups are priced
    table, info = pricing.priced_table(df, costs, point, list(by_name.values()), bench, Scheme.from_name("FP8_DYNAMIC"))
    assert info["method"] == costs and info["seconds"] > 0 and info["operating_point"] == single.quantized
    prices = info["scores"]
    assert set(prices) == set(members)
    m_point = _m(bench, single.quantized, members)
    if costs == "context":
        # leave-one-out and add-one, each one measured pass: checked against measure_scheme() for one of each
        inside, outside = single.quantized[0], next(g for g in members if g not in single.quantized)
        assert prices[inside] == pytest.approx(
            m_point - _m(bench, [g for g in single.quantized if g != inside], members), rel=1e-6
        )
        assert prices[outside] == pytest.approx(_m(bench, single.quantized + [outside], members) - m_point, rel=1e-6)
    else:
        # the members' shares add up to the operating point's mismatch, the others' to what they add to it
        assert sum(prices[g] for g in single.quantized) == pytest.approx(m_point, rel=0.05)
        m_all = _m(bench, list(members), members)
        assert sum(v for g, v in prices.items() if g not in single.quantized) == pytest.approx(
            m_all - m_point, rel=0.05
        )
    # make_recipe on the priced table takes the cheapest prefix by the new prices per byte (negative prices count as
    # free), meets its target and is measured as reported
    rec = make_recipe(table, bench, ask(fp8_share=0.5))
    assert _takes(rec, st, members, {g: max(v, 0.0) for g, v in prices.items()})
    assert rec.fp8_share >= 0.5
    assert _m(bench, rec.quantized, members) == pytest.approx(rec.measured, rel=1e-9)


def test_groups_ranked_by_a_damage_model(setup, monkeypatch):
    """`damage` prices: random recipes measured around the operating point, a damage model fitted on them, its terms
    the prices; the model predicts the recipe make_recipe then chooses (not fitted on it) close to what it measures,
    and the recipe follows the terms, not the sweep's rows."""
    damage = benchmark("damage")
    st, _, bench, df = setup
    members = {g: [u.name for u in us] for g, us in st.groups().items()}
    by_name = {g.group: g for g in group_scores(df, "kl_q_p", members)}
    point = [by_name[g] for g in make_recipe(df, bench, ask(fp8_share=0.5)).quantized]
    fitted = {}

    def fit_around(*a, **kw):  # the real fit, kept; its terms re-ordered when asked, so the ranking must follow them
        m = real(*a, **kw)
        if fitted.get("shuffle"):  # the cheapest term becomes the dearest, and so on
            m.u = np.sort(m.u)[::-1][np.argsort(np.argsort(m.u))]
        fitted["model"] = m
        return m

    real = damage.fit_around
    monkeypatch.setattr(damage, "fit_around", fit_around)
    monkeypatch.setattr(pricing, "DAMAGE_RECIPES", 12)
    fp8 = Scheme.from_name("FP8_DYNAMIC")
    table, info = pricing.priced_table(df, "damage", point, list(by_name.values()), bench, fp8)
    model = fitted["model"]
    assert info["method"] == "damage" and 4 <= model.fitted_on <= 12 and set(info["scores"]) == set(members)
    rec = make_recipe(table, bench, ask(fp8_share=0.5))
    assert _takes(rec, st, members, {g: max(v, 0.0) for g, v in info["scores"].items()})
    assert model.predict(rec.quantized) == pytest.approx(_m(bench, rec.quantized, members), rel=0.3)
    fitted["shuffle"] = True
    table, info = pricing.priced_table(df, "damage", point, list(by_name.values()), bench, fp8)
    other = make_recipe(table, bench, ask(fp8_share=0.5))
    assert _takes(other, st, members, {g: max(v, 0.0) for g, v in info["scores"].items()})
    assert sorted(other.quantized) != sorted(rec.quantized)
