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
            specs.append(f"{path}:level={level},seed={seed},objective=opd-k3")
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
    o = "objective=opd-k3"
    for args, message in [
        ([f"{good}"], "give PATH:level=L,seed=S"),
        ([f"{good}:level=0,seed=x,{o}"], "seed must be an integer"),
        ([f"{good}:level=0,seed=0"], "give objective=O"),
        ([f"{good}:level=0,seed=0,objective=opd-k9"], "opd-k9"),
        ([f"{tmp_path / 'bad.jsonl'}:level=0,seed=0,{o}"], "is not a verl file-logger line"),
        ([f"{good}:level=0,seed=0,{o}", f"{good}:level=a,seed=0,{o}"], None),
        ([f"{good}:level=0,seed=0,{o}", f"{good}:level=a,seed=0,{o},config=stale:1"], "needs checkpoints"),
        ([f"{good}:level=0,seed=0,{o}", f"{good}:level=a,seed=0,{o},config=kv:fp8"], "give --student"),
    ]:
        r = cli("budget", "--from-verl", *args, "--out", tmp_path / "o")
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
        if message:
            assert message in r.err, r.err
        assert not (tmp_path / "o").exists()
    r = cli("budget", tmp_path / "runs.csv", "--from-verl", f"{good}:level=0,seed=0,{o}", "--out", tmp_path / "o")
    assert r.code == 2 and "not both" in r.err


def _write_json_runs(tmp_path, losses: dict) -> list[str]:
    """verl file-logger lines (as FileLogger writes them) of a twin and levels of known accuracy loss, three seeds."""
    specs = []
    for (level, config), lost in losses.items():
        for seed in range(3):
            path = tmp_path / f"{level}-{seed}.jsonl"
            lines = []
            for step in range(0, 7):
                data = {"rollout_corr/kl": 0.001 if level == "0" else 0.01 * (1 + seed)}
                if step % 2 == 0:
                    data["val-core/x/acc/mean@1"] = 0.4 + (0.3 * step / 6) * (1 - lost) + 0.001 * seed if step else 0.4
                lines.append(json.dumps({"step": step, "data": data}))
            path.write_text("\n".join(lines) + "\n")
            spec = f"{path}:level={level},seed={seed},objective=opd-k3"
            specs.append(spec + (f",config={config}" if config else ""))
    return specs


def test_a_budget_from_verl_runs_with_their_configurations_is_judged_by_check(cli, tiny_dirs, tmp_path):
    """verl runs named by their rollout configuration: a twin, whole-model FP8 that lost 60 % of the gain, an FP8 KV
    cache that lost none. `budget --from-verl ... --student` measures each level's dose on check's scale on the
    student (the logged rollout_corr/kl kept beside it, the twin's 0.001 included), and `check` judges the
    configurations against it: whole-model FP8 on its own level's loss (REJECT), the KV cache on its own (ADMIT).
    Seen failing with the levels left under the user's names (check found no level: UNCERTAIN)."""
    model = tiny_dirs["llama"]
    runs = {("0", None): 0.0, ("fp8-all", "fp8:FP8_DYNAMIC"): 0.6, ("kv", "kv:fp8"): 0.0}
    specs = _write_json_runs(tmp_path, runs)
    r = cli("budget", "--from-verl", *specs, "--student", model, "--out", tmp_path / "b")
    assert r.code == 0, r.err
    table = pd.read_csv(tmp_path / "b" / "runs.csv", dtype={"level": str})
    assert set(table["level"]) == {"0", "fp8:FP8_DYNAMIC", "kv:fp8"} and set(table["label"]) == {"0", "fp8-all", "kv"}
    assert (table[table["level"] == "0"]["mismatch_run"] == 0.001).all()  # the BF16 baseline kept, not zeroed
    assert (table[table["level"] == "0"]["mismatch"] == 0).all() and (table["metric"] == "kl_q_p").all()
    doses = json.loads((tmp_path / "b" / "doses.json").read_text())
    assert set(doses) == {"fp8:FP8_DYNAMIC", "kv:fp8"} and all(d["dose"] > 0 for d in doses.values())
    b = json.loads((tmp_path / "b" / "budget.json").read_text())
    assert b["dose_scale"]["engine"] == "sim" and b["student"]["hash"] == 2
    from fp8probe.model.student import load_student
    from fp8probe.recipe.recipe import Recipe

    Recipe.whole_model(load_student(str(model)).units, "FP8_DYNAMIC").write(tmp_path / "all")
    common = ["--budget", tmp_path / "b" / "budget.json", "--out"]
    r = cli("check", model, *common, tmp_path / "c1", "--recipe", tmp_path / "all" / "recipe.yaml")
    assert r.code == 1 and "its own calibration level fp8:FP8_DYNAMIC" in r.out, (r.code, r.out, r.err)
    r = cli("check", model, *common, tmp_path / "c2", "--kv-cache-dtype", "fp8")
    assert r.code == 0 and "its own calibration level kv:fp8" in r.out, (r.code, r.out, r.err)
