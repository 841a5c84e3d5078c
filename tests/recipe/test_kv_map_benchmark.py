"""benchmarks/kv_map.py runs at HEAD at a toy size (a refactor cannot break it unseen): a tiny llama's exact sweep,
the mixed recipe against the baselines, each row's capacity and paired change."""

import pytest
from conftest import benchmark, tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    from fp8probe.cli import main

    d = tmp_path_factory.mktemp("kvmap")
    tiny_model("llama", num_hidden_layers=6).save_pretrained(d / "model")
    tiny_tokenizer().save_pretrained(d / "model")
    args = ["-q", "sweep", d / "model", "--out", d / "sweep", "--method", "exact", "--num-prompts", 8]
    assert main([str(a) for a in [*args, "--max-new-tokens", 10]]) == 0
    return d / "sweep"


def test_the_rows_hold_their_promises(swept):
    """The mixed row changes by 0 from itself; the equal-capacity rows skip as many layers and have its KV tokens;
    uniform FP8 KV has at least its tokens, all-BF16 KV exactly 1x; the joint row's recipe keeps no KV layer BF16."""
    import pandas as pd

    table = pd.read_csv(swept / "sensitivity.csv")
    # half of what the KV rows add up to, at a workload where KV bytes come first: some layers' KV cache fits
    budget = float(table[table.kind == "kv"].kl_q_p.sum()) * 0.5
    head, rows = benchmark("kv_map").compare(swept, budget, 10**12)
    by = {r["row"]: r for r in rows}
    mixed = by["mixed"]
    assert mixed["change"] == [0.0, 0.0, 0.0] and "mixed recipe" in head
    k = len(mixed["kv_bf16_layers"])
    assert 0 < k < 6, head  # a map: some layers BF16, some FP8
    for name in (f"first/last, k={k}", f"KV rows, k={k}"):
        assert len(by[name]["kv_bf16_layers"]) == k and by[name]["kv_tokens_vs_bf16"] == mixed["kv_tokens_vs_bf16"]
        lo, hi = by[name]["change"][1:]
        assert lo <= by[name]["change"][0] <= hi
    assert by["uniform FP8 KV"]["kv_tokens_vs_bf16"] >= mixed["kv_tokens_vs_bf16"] >= 1.0
    assert by["BF16 KV"]["kv_tokens_vs_bf16"] == 1.0
    # today's every-layer recipe cannot fit this budget at all: said in the head line, no row
    assert "joint, every layer" not in by and "joint, every layer: none (even with only the forced groups" in head


def test_baselines_skip_sliding_layers_only_beside_them():
    """Gemma 3's 18 layers (every sixth full attention): the baselines count first/last and the worst KV rows among
    the sliding layers, since vLLM cannot keep a full-attention layer's KV cache BF16 beside them (the row of layer
    17, the worst, is passed over)."""
    allowed = [i for i in range(18) if i % 6 != 5]
    rows = {i: float(i) for i in range(18)}  # later layers score worse
    maps = benchmark("kv_map").kv_maps(allowed, 3, rows)
    assert maps["first/last, k=3"] == [0, 1, 16] and maps["boundary 2"] == [0, 1, 15, 16]
    assert maps["KV rows, k=3"] == [14, 15, 16] and maps["uniform FP8 KV"] == []
    assert benchmark("kv_map").kv_maps(list(range(6)), 2, rows)["boundary 2"] == [0, 1, 4, 5]


def test_label_draws_runs_at_head(swept):
    """benchmarks/label_draws.py on the same tiny exact sweep: each draw count's rho and top-10 per seed against the
    exact table, the seed-by-seed change, and rho equal to Spearman's of the estimate made here with the same seed
    (scipy's, not fp8probe's)."""
    import pandas as pd
    from scipy.stats import spearmanr

    from fp8probe.core.schemes import Scheme
    from fp8probe.measurement.fisher import Draws, fisher_rows
    from fp8probe.model.rollouts import load_rollouts
    from fp8probe.model.student import load_student
    from fp8probe.sweeps.sweep import plan_rows

    res = benchmark("label_draws").compare(swept, seeds=2, draws=(1, 2))
    assert res["rows"] == 6 * 7 and len(res[1]["rho"]) == len(res[2]["top10"]) == 2
    assert res["change"][2]["rho"] == [a - b for a, b in zip(res[2]["rho"], res[1]["rho"])]
    st = load_student(str(swept.parent / "model"))
    rows = [r for r in plan_rows(st, Scheme.from_name("FP8_DYNAMIC"), "unit", include_kv=False) if r.kind != "model"]
    est = fisher_rows(st, load_rollouts(swept), rows, Draws(2, 1)).column()
    table = pd.read_csv(swept / "sensitivity.csv").set_index("unit")
    names = [r.unit for r in rows]
    rho = spearmanr([est[n] for n in names], [table.kl_q_p[n] for n in names]).statistic
    assert res[2]["rho"][1] == pytest.approx(rho, abs=1e-12)
