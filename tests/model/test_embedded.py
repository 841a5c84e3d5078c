"""The real embedded student, end to end through the CLI, on a small token budget."""

import json

import pandas as pd
import pytest

from fp8probe.measurement.mismatch import METRICS
from fp8probe.sweeps.files import COLUMNS

pytestmark = pytest.mark.slow  # the real embedded student


def test_embedded_sweep_end_to_end(cli, tmp_path):
    out = tmp_path / "run"
    r = cli(
        "-q",
        "sweep",
        "--out",
        out,
        "--method",
        "exact",
        "--num-prompts",
        2,
        "--max-new-tokens",
        6,
        "--granularity",
        "group",
    )
    assert r.code == 0, r.err
    assert "ten most sensitive rows" in r.out and "model.fp8_all:" in r.out
    df = pd.read_csv(out / "sensitivity.csv")
    assert list(df.columns) == COLUMNS
    assert len(df) == 30 * 4 + 30 + 3  # fused groups, KV layers, whole-model rows
    assert (df[["kl_q_p", "kl_p_q", "k3", "kl_max"]] >= 0).all().all()
    ref = df[df.unit == "model.reference"].iloc[0]
    assert all(ref[k] == 0 for k in ("kl_q_p", "kl_p_q", "k1", "k3", "kl_max", "rms_dp", "abs_dlogp_max"))
    whole = df[df.unit == "model.fp8_all"].iloc[0]
    groups = df[df.kind.isin(["qkv", "o", "gate_up", "down"])]
    assert whole.kl_q_p > groups.kl_q_p.max() > 0  # everything in FP8 hurts more than any one group
    assert set(df.kind) == {"qkv", "o", "gate_up", "down", "kv", "model"}
    run = json.loads((out / "run.json").read_text())
    assert run["model_type"] == "llama" and run["num_sequences"] == 2 and run["rows"] == len(df)
    assert set(run["seconds"]) == {"load", "rollouts", "reference", "exact", "sweep", "total"}
    assert not (out / "sensitivity.partial.csv").exists()
    meta = json.loads((out / "rollouts.json").read_text())
    assert meta["sampling"]["eos_token_ids"] == [2]
    assert set(METRICS) <= set(df.columns)


def test_a_gguf_is_converted_once_and_units_read_its_config_alone(cli, tmp_path, monkeypatch, embedded):
    """A user's GGUF (here the embedded student's own file, under another name): `units` lists what the converted
    student has without converting anything; the first load converts it into the cache under the file's sha256,
    a second load and a renamed copy of the file reuse that copy (the converter is not called again)."""
    import hashlib
    import shutil

    from fp8probe import load_student
    from fp8probe.model import embedded as emb

    gguf = tmp_path / "mine.gguf"
    shutil.copy(emb.embedded_gguf(), gguf)  # from the real cache, before it is moved aside
    monkeypatch.setenv("FP8PROBE_CACHE", str(tmp_path / "cache"))
    calls = []
    real = emb.convert_gguf
    monkeypatch.setattr(emb, "convert_gguf", lambda *a, **k: (calls.append(a[0]), real(*a, **k))[1])
    r = cli("-q", "units", gguf)
    assert r.code == 0, r.err
    names = [ln.split()[0] for ln in r.out.splitlines()[:-1]]
    key = hashlib.sha256(gguf.read_bytes()).hexdigest()[:16]
    # nothing converted: only the config, read from the file's metadata once, is cached beside the copies
    assert names == [u.name for u in embedded.units] and not calls
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir()] == [f"{key}.config.json"]
    st = load_student(str(gguf))
    assert st.path == str(tmp_path / "cache" / "gguf" / key) and calls == [gguf]
    assert [u.name for u in st.units] == names
    load_student(str(gguf))
    other = tmp_path / "renamed.gguf"
    shutil.copy(gguf, other)
    assert load_student(str(other)).path == st.path and calls == [gguf]


def test_the_batch_composition_moves_a_figure_within_its_interval(embedded):
    """A measurement's arithmetic (its batch composition) is part of it: the same whole-model FP8 weights + FP8 KV
    cache on the same 4 x 24 rollouts, batched 1, 2 and 4 at a time, moves kl_q_p by up to ~15 % on the real
    student (other padding widths move the GEMMs' last bits, FP8 codes on a rounding boundary flip, and a
    heavy-tailed per-token KL carries the flips into the mean; benchmarks/batch_arithmetic.py measures it at three
    sizes). Each flip stays inside its sequence, so every prompt's value carries its own draw of the arithmetic and
    the bootstrap over prompts sees it: every composition's figure lies inside the default composition's 90 %
    interval. The batch size and the thread count are recorded beside each figure (core/artifacts.arithmetic). Run
    with two torch threads, as the machine's default: with one (CI's parallel workers) this CPU's GEMMs gave every
    composition the same bits."""
    import torch

    from fp8probe.core.artifacts import arithmetic
    from fp8probe.core.schemes import KVCacheScheme, Scheme
    from fp8probe.measurement.bench import Bench
    from fp8probe.measurement.measure import measure
    from fp8probe.measurement.perturbation import Perturbation
    from fp8probe.model.rollouts import make_rollouts

    st = embedded
    r = make_rollouts(st, num_prompts=4, max_new_tokens=24, seed=0)
    p = Perturbation(tuple(st.unit_names), Scheme.from_name("FP8_DYNAMIC"), st.layers, KVCacheScheme())
    got, threads = {}, torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for b in (8, 4, 2, 1):
            got[b] = measure(Bench(st, r, b), p)
    finally:
        torch.set_num_threads(threads)
    value = {b: m.metrics["kl_q_p"] for b, m in got.items()}
    lo, hi = got[8].interval("kl_q_p")
    assert len({round(v, 12) for v in value.values()}) > 1, "no composition moved the figure: nothing was tested"
    assert all(lo <= v <= hi for v in value.values()), (value, (lo, hi))
    assert arithmetic(4)["batch_size"] == 4 and arithmetic(4)["torch_threads"] >= 1
