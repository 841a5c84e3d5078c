"""The figures render from a sensitivity table alone."""

import pandas as pd

from fp8probe.plots import budget_curve, capacity_bars, sensitivity_heatmap


def _table():
    rows = []
    for b in range(3):
        for k in ("q", "k", "v", "o", "gate", "up", "down"):
            grp = f"model.layers.{b}." + {"q": "self_attn.qkv_proj", "k": "self_attn.qkv_proj",
                                          "v": "self_attn.qkv_proj", "o": "self_attn.o_proj",
                                          "gate": "mlp.gate_up_proj", "up": "mlp.gate_up_proj",
                                          "down": "mlp.down_proj"}[k]
            rows.append({"unit": f"model.layers.{b}.{k}", "kind": k, "block": b, "group": grp,
                         "bytes_saved": 1000 * (b + 1), "kl_q_p": 1e-4 * (b + 1)})
        rows.append({"unit": f"kv{b}", "kind": "kv", "block": b, "group": f"kv{b}", "bytes_saved": 0, "kl_q_p": 1e-5})
    rows.append({"unit": "model.fp8_all", "kind": "model", "block": -1, "group": "model", "bytes_saved": 1,
                 "kl_q_p": 1e-2})
    return pd.DataFrame(rows)


def test_figures(tmp_path):
    sensitivity_heatmap(_table(), tmp_path / "h.png")
    budget_curve(_table(), tmp_path / "b.png")
    side = {"kv_tokens": 100, "max_concurrency": 1.5, "scheme": "FP8_DYNAMIC", "kv_cache_dtype": "fp8"}
    capacity_bars({"baseline": dict(side, scheme=None, kv_cache_dtype="auto"), "candidate": side,
                   "max_model_len": 8192, "model_type": "llama", "ratio_kv_tokens": 1.0}, tmp_path / "c.png")
    for f in ("h.png", "b.png", "c.png"):
        assert (tmp_path / f).read_bytes()[:4] == b"\x89PNG"
