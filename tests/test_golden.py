"""A small golden run: sweep, recipe and capacity on a tiny model must write what the golden copies in
tests/golden/ hold. It guards refactors that promise "behaviour unchanged", on any CPU.

Exact for everything that is not a float: columns, units, kinds, groups, counts, bytes, the rollouts' tokens,
the recipe's membership and YAML structure, capacity.json. Floats within a tolerance measured across machines,
because fp32 GEMMs and reductions round differently on other CPUs (and thread counts), and a last-bit change
of an activation can flip one of its FP8 codes:

    measured (2026-12-01): this file's golden copies (written on the previous CI machine) against a run on a
    2-core Intel Xeon with AMX, same rollouts (token for token):
      unit and KV-cache rows    kl_q_p, kl_p_q <= 0.17 %; k1, k3, |dlog p|, rms_dp <= 0.16 %;
                                percentiles <= 1.3 %; sqnr_db <= 3e-6
      whole-model rows          kl_q_p, kl_p_q <= 0.28 %; sampled-token metrics <= 9.1 % (k3 of fp8_all_kv:
                                more FP8 codes flip, and 32 sampled tokens carry the mean); percentiles <= 3.6 %
      1 vs 2 torch threads on one machine: bit-identical (CI runs this test both ways)
    measured (2026-12-02): a 2-core AMD EPYC without AVX-512 against the same golden copies: the ends of the
      whole-model rows' 90 % intervals (run.json whole_model) moved 2.4 % (a bootstrap percentile over 4 prompts
      follows the few prompts at that end, where flipped codes concentrate) while every value stayed within 1 %
    tolerance (about four times the measured):
      full-vocabulary means and SQNR (kl_q_p, kl_p_q, kl_fisher, sqnr_db)   1 % everywhere
      sampled-token metrics and percentiles                                 5 % on unit / KV rows,
                                                                            30 % on whole-model rows and
                                                                            the recipe's measured passes
      top1_agree                                                            2 tokens of the run's 32
      the ends of a whole-model row's interval (run.json)                   10 %

Where a float decides a discrete outcome, the golden run must leave margins rounding cannot cross: every
measured and predicted pass of the recipe search lies more than twice the tolerance from the budget, and the
groups the search ranks (those not kept by --keep-last) differ in score per byte by more than twice it. The
test checks those margins too, so a regenerated golden run with a knife-edge decision fails here.

Regenerate after a deliberate change: FP8PROBE_REGEN_GOLDEN=1 pytest tests/test_golden.py (and say why in the
commit).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import tiny_model, tiny_tokenizer

from fp8probe.core.metrics import METRICS
from fp8probe.recipe.selection import group_scores, rank_groups

pytestmark = pytest.mark.committed

GOLDEN = Path(__file__).with_name("golden") / "tiny-llama"
VOLATILE = {"seconds", "versions", "arithmetic"}  # run.json keys that depend on the machine (threads)
BUDGET, KEEP_LAST, TOKENS = 0.004, 1, 32  # the recipe's budget and kept blocks; the run's response tokens

FULL = {"kl_q_p", "kl_p_q", "kl_fisher", "sqnr_db"}  # full-vocabulary means and the SQNR
RTOL_FULL = 0.01
RTOL_UNIT = 0.05  # sampled-token metrics and percentiles of a unit / KV row
RTOL_WHOLE = 0.30  # ... of a whole-model row or a recipe's measured pass
ATOL_TOP1 = 2 / TOKENS
RTOL_INTERVAL = 0.10  # the ends of a whole-model row's bootstrap interval


def tolerance(metric: str, whole: bool) -> tuple[float, float]:
    """(rtol, atol) for one metric of a row (see the module docstring)."""
    if metric == "top1_agree":
        return 0.0, ATOL_TOP1
    if metric == "interval":
        return RTOL_INTERVAL, 0.0
    if metric in FULL:
        return RTOL_FULL, 0.0
    return (RTOL_WHOLE if whole else RTOL_UNIT), 0.0


def _close(got: float, want: float, rtol: float, atol: float) -> bool:
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    if math.isinf(want) or math.isinf(got):
        return got == want
    return abs(got - want) <= atol + rtol * abs(want)


def compare_table(got: pd.DataFrame, want: pd.DataFrame, where: str) -> list[str]:
    """Columns, text and integer columns exactly; float columns by `tolerance`."""
    if list(got.columns) != list(want.columns) or len(got) != len(want):
        return [f"{where}: columns or row count differ"]
    bad = []
    for col in want.columns:
        if want[col].dtype.kind != "f":
            if not got[col].equals(want[col]):
                bad.append(f"{where}: column {col} differs")
            continue
        for i, (g, w) in enumerate(zip(got[col], want[col])):
            rtol, atol = tolerance(col, want["kind"].iloc[i] == "model")
            if not _close(float(g), float(w), rtol, atol):
                bad.append(f"{where}: {want['unit'].iloc[i]} {col} {g!r} vs golden {w!r} (rtol {rtol}, atol {atol})")
    return bad


def compare_json(got, want, where: str, key: str = "") -> list[str]:
    """Structure, strings, integers and booleans exactly; a float by the tolerance of the metric it is (a key in
    METRICS: as a whole-model row), else as a full-vocabulary value (recipe scores, predictions, measured kl_q_p)."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [f"{where}: keys differ: {sorted(set(got) ^ set(want)) if isinstance(got, dict) else got!r}"]
        return [m for k in want for m in compare_json(got[k], want[k], f"{where}.{k}", k)]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: lists differ in length"]
        return [m for i, (g, w) in enumerate(zip(got, want)) for m in compare_json(g, w, f"{where}[{i}]", key)]
    if isinstance(want, float) and isinstance(got, float):
        rtol, atol = tolerance(key, whole=True) if key in METRICS or key == "interval" else (RTOL_FULL, 0.0)
        return [] if _close(got, want, rtol, atol) else [f"{where}: {got!r} vs golden {want!r} (rtol {rtol})"]
    return [] if type(got) is type(want) and got == want else [f"{where}: {got!r} vs golden {want!r}"]


FLOAT = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")


def compare_yaml(got: str, want: str, where: str) -> list[str]:
    """The recipe exactly as data; its comment header with its floats (the measured value) by RTOL_FULL."""
    bad = [] if yaml.safe_load(got) == yaml.safe_load(want) else [f"{where}: the recipe differs"]
    head_got = [ln for ln in got.splitlines() if ln.startswith("#")]
    head_want = [ln for ln in want.splitlines() if ln.startswith("#")]
    for g, w in zip(head_got, head_want):
        if FLOAT.sub("F", g) != FLOAT.sub("F", w) or not all(
            _close(float(a), float(b), RTOL_FULL, 0.0) for a, b in zip(FLOAT.findall(g), FLOAT.findall(w))
        ):
            bad.append(f"{where}: header {g!r} vs golden {w!r}")
    return bad + ([f"{where}: header lines differ"] if len(head_got) != len(head_want) else [])


def compare_tensors(got: Path, want: Path, where: str) -> list[str]:
    from safetensors.torch import load_file

    a, b = load_file(str(got)), load_file(str(want))
    if set(a) != set(b):
        return [f"{where}: tensors differ"]
    return [f"{where}: {k} differs" for k in b if a[k].dtype != b[k].dtype or not bool((a[k] == b[k]).all())]


def _normalize(text: str, root: Path) -> str:
    return text.replace(str(root), "<ROOT>")


def _run_json(path: Path, root: Path) -> dict:
    run = {k: v for k, v in json.loads(_normalize(path.read_text(), root)).items() if k not in VOLATILE}
    # the KV cache's paired effect is a difference of two whole-model rows: near 0, where a relative tolerance means
    # nothing; the rows themselves (and their intervals) are compared, the effect is checked to be their difference
    effect = (run.get("whole_model") or {}).pop("kv_effect", None)
    if effect is not None:
        w = run["whole_model"]
        assert abs(effect["kl_q_p"] - (w["model.fp8_all_kv"]["kl_q_p"] - w["model.fp8_all"]["kl_q_p"])) < 1e-9
    return run


def check_margins(table: pd.DataFrame, recipe: dict, num_blocks: int) -> list[str]:
    """Decisions rounding within the tolerance cannot flip: see the module docstring."""
    bad = []
    margin = 2 * RTOL_FULL
    for e in recipe["search"]:
        for k in ("measured", "predicted"):
            if e[k] and abs(e[k] - BUDGET) <= margin * BUDGET:
                bad.append(f"the search's {e['move']} {k} {e[k]:.6g} is within {margin:.0%} of the budget {BUDGET}")
    free = [g for g in rank_groups(group_scores(table)) if g.block < num_blocks - KEEP_LAST]
    for a, b in zip(free, free[1:]):
        if b.per_byte <= a.per_byte * (1 + margin):
            bad.append(f"{a.group} and {b.group} rank within {margin:.0%} of each other per byte")
    return bad


def test_golden_run(cli, tmp_path):
    model = tmp_path / "model"
    tiny_model("llama").save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    sweep, recipe, cap = tmp_path / "sweep", tmp_path / "recipe", tmp_path / "capacity"
    r = cli(
        "-q",
        "sweep",
        model,
        "--out",
        sweep,
        "--method",
        "exact",
        "--num-prompts",
        4,
        "--max-new-tokens",
        8,
        "--seed",
        3,
    )
    assert r.code == 0, r.err
    r = cli(
        "-q", "recipe", sweep, "--budget", BUDGET, "--keep-last", KEEP_LAST, "--out", recipe, "--engine", "none"
    )  # the engine profile's bf16 arithmetic differs more across CPUs; tested elsewhere
    assert r.code == 0, r.err
    r = cli(
        "-q",
        "capacity",
        model,
        "--recipe",
        recipe / "recipe.yaml",
        "--kv-cache-memory",
        1 << 24,
        "--max-model-len",
        256,
        "--out",
        cap,
    )
    assert r.code == 0, r.err
    if os.environ.get("FP8PROBE_REGEN_GOLDEN"):
        for src, name in (
            (sweep, "sweep/sensitivity.csv"),
            (sweep, "sweep/rollouts.json"),
            (sweep, "sweep/rollouts.safetensors"),
            (recipe, "recipe/recipe.yaml"),
            (recipe, "recipe/recipe.json"),
            (cap, "capacity/capacity.json"),
        ):
            dst = GOLDEN / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            data = (src / Path(name).name).read_bytes()
            dst.write_bytes(data if dst.suffix == ".safetensors" else _normalize(data.decode(), tmp_path).encode())
        (GOLDEN / "sweep" / "run.json").write_text(json.dumps(_run_json(sweep / "run.json", tmp_path), indent=2) + "\n")
    g = GOLDEN
    assert (sweep / "rollouts.safetensors").read_bytes() == (g / "sweep/rollouts.safetensors").read_bytes(), (
        "the sampled rollouts differ from the golden run's tokens: every float below would differ too"
    )
    table = pd.read_csv(sweep / "sensitivity.csv")
    bad = compare_table(table, pd.read_csv(g / "sweep/sensitivity.csv"), "sweep/sensitivity.csv")
    bad += compare_json(
        _run_json(sweep / "run.json", tmp_path), json.loads((g / "sweep/run.json").read_text()), "sweep/run.json"
    )
    for d, name in ((sweep, "rollouts.json"), (recipe, "recipe.json"), (cap, "capacity.json")):
        got = json.loads(_normalize((d / name).read_text(), tmp_path))
        bad += compare_json(got, json.loads((g / d.name / name).read_text()), f"{d.name}/{name}")
    bad += compare_yaml(
        _normalize((recipe / "recipe.yaml").read_text(), tmp_path),
        (g / "recipe/recipe.yaml").read_text(),
        "recipe/recipe.yaml",
    )
    bad += compare_tensors(sweep / "rollouts.safetensors", g / "sweep/rollouts.safetensors", "sweep/rollouts")
    assert not bad, "differs from the golden run:\n" + "\n".join(bad[:20])
    margins = check_margins(
        pd.read_csv(g / "sweep/sensitivity.csv"), json.loads((g / "recipe/recipe.json").read_text()), num_blocks=3
    )
    assert not margins, "the golden run decides on a knife edge: " + "; ".join(margins)


def test_the_comparison_can_tell():
    """The tolerances catch what they must: a row's kl_q_p off by 2 % or k3 off by 6 % on a unit row, a
    recipe's measured value off by 2 %, a changed token, a changed ignore list."""
    want = pd.read_csv(GOLDEN / "sweep/sensitivity.csv")
    assert compare_table(want.copy(), want, "t") == []
    for col, factor, row in (
        ("kl_q_p", 1.02, 0),
        ("k3", 1.06, 0),
        ("kl_q_p", 1.02, len(want) - 2),
        ("top1_agree", 0.9, 0),
    ):
        bad = want.copy()
        bad.loc[row, col] = bad.loc[row, col] * factor
        assert compare_table(bad, want, "t"), (col, row)
    ok = want.copy()
    ok.loc[len(want) - 2, "k3"] *= 1.2  # a whole-model row's k3 moves this much between machines
    assert compare_table(ok, want, "t") == []
    rec = json.loads((GOLDEN / "recipe/recipe.json").read_text())
    moved = json.loads(json.dumps(rec))
    moved["measured"] *= 1.02
    assert compare_json(moved, rec, "r")
    run = json.loads((GOLDEN / "sweep/run.json").read_text())
    wide = json.loads(json.dumps(run))
    wide["whole_model"]["model.fp8_all"]["interval"][0] *= 1.12  # an interval end off by 12 %
    assert compare_json(wide, run, "w") and compare_json(run, run, "w") == []
    text = (GOLDEN / "recipe/recipe.yaml").read_text()
    assert compare_yaml(text.replace("model.layers.0.self_attn.o_proj, ", ""), text, "y")
    assert compare_yaml(text, text, "y") == []
