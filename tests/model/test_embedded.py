"""The real embedded student, end to end through the CLI, on a small token budget."""

import json

import pandas as pd
import pytest

from fp8probe.measurement.mismatch import METRICS
from fp8probe.sweeps.files import COLUMNS

pytestmark = pytest.mark.slow  # the real embedded student


def test_embedded_sweep_end_to_end(cli, tmp_path):
    out = tmp_path / "run"
    r = cli("-q", "sweep", "--out", out, "--num-prompts", 3, "--max-new-tokens", 8, "--granularity", "group")
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
    assert run["model_type"] == "llama" and run["num_sequences"] == 3 and run["rows"] == len(df)
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
