"""Every recipe shipped in recipes/ parses with llm-compressor's own parser, says what its recipe.json says, and
measures, on the shipped rollouts, what its recipe.json reports.

Re-measuring crosses machines: recipes/smollm2-135m was measured on the machine that wrote it (a 2-core AMX Xeon), and
FP8 codes of a whole recipe flip where another CPU's fp32 GEMMs round differently (issue 35: the arithmetic component).
Single-unit rows of sensitivity.csv stay within 0.07 % everywhere measured (which shows the rollouts are the ones the
table and recipes were measured on). Whole recipes on the 346 held-out tokens, largest change seen: another AMX Xeon,
kl_q_p 2.9 %, k3 13 %, |dlog p| 4.4 %, kl_max 21 %; a 2-core AVX2 AMD EPYC (2026-12-02, one thread), kl_q_p 12.3 %
(0.00837 -> 0.00941, inside its printed interval [0.00594, 0.0116]), k3 31 %, rms_dp 15 %, abs_dlogp_max 39 %,
top1_agree 0.9 % (3 tokens); k1 moved 0.0028 where its terms average |dlog p| 0.075 (3.7 % of it; 4.1 % on the CI
machine). Another 2-core AVX2 EPYC (2026-12-06, one and two threads alike) moved the 0.02 recipe's kl_q_p 12.8 % (0.0209
-> 0.0236, inside its recorded [0.0166, 0.0269]) and its largest single token's KL 2.08x (0.251 -> 0.523: token 301, in
held-out prompt 6), while the 0.008 recipe's abs_dlogp_max fell 44 % (1.50 -> 0.85). kl_max, abs_dlogp_max and kl_p999
(on 346 tokens, read between the largest two) are each one or two tokens' figures: where one token's codes flip they
move by that token alone. So the test checks the claim that matters, that the printed interval holds the arithmetic
component: kl_q_p lands inside its recorded 90 % interval (kl_p_q and the search half in the same relative band) and
within about twice the largest change seen (25 %); k1, a signed mean that cancels, within a tenth of |dlog p|; the
one-token figures within a factor of 3 either way (the largest ratio seen 2.08: a wrong reduction, a mean for the max,
is a factor of 9-20 on these recipes); the other metrics within about twice the largest change seen.
"""

import json
from pathlib import Path

import pandas as pd
import pytest

from fp8probe.recipe.recipe import read_recipe

SHIPPED = sorted((Path(__file__).resolve().parents[2] / "recipes").rglob("recipe.yaml"))
SMOLLM = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m"
FULL = {"kl_q_p", "kl_p_q"}
TAILS = {"kl_p50", "kl_p90", "kl_p99"}
ONE_TOKEN = {"kl_p999", "kl_max", "abs_dlogp_max"}  # the largest one or two of the held-out tokens
FACTOR_ONE_TOKEN = 3.0
RTOL = {"full": 0.25, "sampled": 0.6, "tails": 0.8}
ATOL_TOP1 = 0.025
K1_OF_ABS_DLOGP = 0.1  # k1's tolerance, as a share of the mean |dlog p| of the tokens it averages
RTOL_UNIT = 0.005  # single units: measured 0.07 %


def test_there_are_recipes():
    assert len(SHIPPED) >= 3


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.parent.name))
def test_parsed_by_llmcompressor(path):
    from llmcompressor.recipe import Recipe

    (mod,) = Recipe.create_instance(str(path)).modifiers
    ours = read_recipe(path)
    assert type(mod).__name__ == "QuantizationModifier"
    assert mod.scheme == ours.scheme and mod.ignore == ours.ignore and "lm_head" in mod.ignore
    meta = json.loads((path.parent / "recipe.json").read_text())
    kept = [u for g in meta["kept"] for u in meta["group_units"][g]]
    assert set(kept) <= set(mod.ignore)
    assert meta["measured_search"] <= meta["budget"]  # the held-out `measured` may land on either side


def _close(metric: str, got: float, want: float, band: tuple[float, float], recorded: dict) -> bool:
    """`band`: the recorded kl_q_p interval relative to its value, (lo / measured, hi / measured)."""
    if metric == "top1_agree":
        return abs(got - want) <= ATOL_TOP1
    if metric in FULL:
        return band[0] * want <= got <= band[1] * want and abs(got - want) <= RTOL["full"] * want
    if metric in ONE_TOKEN:
        return want / FACTOR_ONE_TOKEN <= got <= want * FACTOR_ONE_TOKEN
    if metric == "k1":
        return abs(got - want) <= K1_OF_ABS_DLOGP * recorded["abs_dlogp_mean"]
    return abs(got - want) <= RTOL["tails" if metric in TAILS else "sampled"] * abs(want)


@pytest.mark.slow
@pytest.mark.committed
def test_shipped_recipes_measure_what_their_json_says(embedded):
    """On the shipped rollouts, each shipped recipe's FP8 units measure what its recipe.json says (every metric, on
    its held-out prompts; kl_q_p on its search prompts too), and the five most sensitive units measure what
    sensitivity.csv says (the rollouts are the table's)."""
    from fp8probe import measure_scheme
    from fp8probe.core.schemes import Scheme
    from fp8probe.measurement.bench import Bench
    from fp8probe.measurement.measure import measure
    from fp8probe.measurement.perturbation import Perturbation
    from fp8probe.model.rollouts import load_rollouts

    rollouts = load_rollouts(SMOLLM)
    run = json.loads((SMOLLM / "run.json").read_text())
    assert rollouts.num_response_tokens == run["num_response_tokens"] == 730
    bench = Bench(embedded, rollouts)
    table = pd.read_csv(SMOLLM / "sensitivity.csv")
    top = table[~table.kind.isin(["model", "kv"])].sort_values("kl_q_p", ascending=False).head(5)
    for _, row in top.iterrows():
        got = measure(bench, Perturbation((row.unit,), Scheme.from_name(run["scheme"]))).metrics
        assert got["kl_q_p"] == pytest.approx(row.kl_q_p, rel=RTOL_UNIT), row.unit
    recipes = sorted(SMOLLM.glob("kl_q_p-*/recipe.yaml"))
    assert len(recipes) == 3
    for path in recipes:
        rec, meta = read_recipe(path), json.loads((path.parent / "recipe.json").read_text())
        units = [u.name for u in rec.fp8_units(embedded.units)]
        assert len(units) == sum(len(meta["group_units"][g]) for g in meta["quantized"])
        split = meta["split"]  # measured on the held-out prompts, measured_search on the others
        held, search = rollouts.subset(split["heldout_sequences"]), rollouts.subset(split["search_sequences"])
        got = measure_scheme(Bench(embedded, held), rec.scheme, units=units)
        lo, hi = meta["measured_interval"]
        assert lo <= got["kl_q_p"] <= hi, path.parent.name
        band = (lo / meta["measured"], hi / meta["measured"])
        recorded = meta["measured_metrics"]
        off = {k: (got[k], v) for k, v in recorded.items() if not _close(k, got[k], v, band, recorded)}
        assert not off, f"{path.parent.name}: {off}"
        on_search = measure_scheme(Bench(embedded, search), rec.scheme, units=units)["kl_q_p"]
        assert _close("kl_q_p", on_search, meta["measured_search"], band, recorded), path.parent.name
