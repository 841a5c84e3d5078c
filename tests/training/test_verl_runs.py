"""A user's verl runs become a budget (`budget --from-verl`, training/verl_runs.py), from JSONL written by verl's own
FileLogger (lifted from the released wheel, with its serializer, orjson)."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from conftest import lift

# a synthetic study: the mismatch-free twin and three rollout configurations, three seeds each; each logs
# rollout_corr/kl every step and val-core accuracy (higher is better) before training and every 2 steps
LEVELS = {"0": 0.0, "fp8-kv": 0.002, "fp8": 0.006, "noisy": 0.03}
LOSS = {"0": 0.0, "fp8-kv": 0.002, "fp8": 0.01, "noisy": 0.08}  # accuracy lost at the end


def _file_logger(root):
    import orjson

    return lift(root, "verl/utils/tracking.py", ("FileLogger",), {"os": os, "orjson": orjson})["FileLogger"]


def _write_runs(file_logger, tmp_path, monkeypatch) -> list[str]:
    specs = []
    for level, kl in LEVELS.items():
        for seed in range(3):
            path = tmp_path / f"{level}-{seed}.jsonl"
            monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
            log = file_logger("opd", f"{level}-{seed}")
            for step in range(0, 7):
                data = {"training/global_step": step, "actor/entropy": 0.5}
                if step:
                    data["rollout_corr/kl"] = kl * (1 + 0.1 * ((step + seed) % 3 - 1)) if kl else 1e-5 * step
                if step % 2 == 0:
                    # the same student validated before training (step 0) in every run, then each seed its own way
                    gained = (0.3 * step / 6 * (1 - LOSS[level] / 0.3) + 0.01 * seed) if step else 0.0
                    data["val-core/openai/gsm8k/acc/mean@1"] = 0.4 + gained
                log.log(data=data, step=step)
            log.finish()
            specs.append(f"{path}:level={level},seed={seed}")
    return specs


@pytest.mark.network
def test_verl_runs_become_a_budget(cli, released, tmp_path, monkeypatch):
    specs = _write_runs(_file_logger(released["verl"]), tmp_path, monkeypatch)
    first = json.loads((tmp_path / "fp8-0.jsonl").read_text().splitlines()[1])
    assert set(first) == {"step", "data"}  # verl's own line: {"step": N, "data": {...}}
    out = tmp_path / "budget"
    r = cli("budget", "--from-verl", *specs, "--tolerance", "0.05", "--bootstrap", "200", "--out", out)
    assert r.code == 0, r.err
    assert "quality val-core/openai/gsm8k/acc/mean@1 (auc" in r.out and "mismatch rollout_corr/kl" in r.out
    runs = pd.read_csv(out / "runs.csv", dtype={"level": str})
    assert len(runs) == 12 and set(runs["metric"]) == {"rollout_corr/kl"} and runs["higher_is_better"].all()
    # by hand from the logs: a run's mismatch is its steps' mean kl (0 for the twin), its quality its validations' mean
    for spec, row in zip(specs, runs.itertuples()):
        lines = [json.loads(x) for x in open(spec.split(":level=")[0])]
        kls = [x["data"]["rollout_corr/kl"] for x in lines if "rollout_corr/kl" in x["data"]]
        accs = [x["data"]["val-core/openai/gsm8k/acc/mean@1"] for x in lines if x["step"] % 2 == 0]
        assert row.mismatch == pytest.approx(0.0 if row.level == "0" else sum(kls) / len(kls), rel=1e-12)
        assert row.quality == pytest.approx(sum(accs) / len(accs), rel=1e-12) and row.quality_start == accs[0]
    b = json.loads((out / "budget.json").read_text())
    assert b["metric"] == "rollout_corr/kl" and b["calibrated"] and b["paired"]
    check = cli("check", "--budget", out / "budget.json", "--kv-cache-dtype", "fp8", "--out", tmp_path / "c")
    assert check.code == 2 and "bounds verl's rollout_corr/kl" in check.err and not (tmp_path / "c").exists()


def test_verl_runs_refuse_what_they_cannot_read(cli, tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_text(json.dumps({"step": 1, "data": {"val-core/x/acc": 0.5, "rollout_corr/kl": 0.01}}) + "\n")
    (tmp_path / "bad.jsonl").write_text('{"step": 1, "metrics": {}}\n')
    for args, message in [
        ([f"{good}"], "give PATH:level=L,seed=S"),
        ([f"{good}:level=0,seed=x"], "seed must be an integer"),
        ([f"{tmp_path / 'bad.jsonl'}:level=0,seed=0"], "is not a verl file-logger line"),
        ([f"{good}:level=0,seed=0", f"{good}:level=a,seed=0"], None),
    ]:
        r = cli("budget", "--from-verl", *args, "--out", tmp_path / "o")
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
        if message:
            assert message in r.err, r.err
        assert not (tmp_path / "o").exists()
    r = cli("budget", tmp_path / "runs.csv", "--from-verl", f"{good}:level=0,seed=0", "--out", tmp_path / "o")
    assert r.code == 2 and "not both" in r.err
