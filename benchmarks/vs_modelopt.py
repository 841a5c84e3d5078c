"""fp8probe against NVIDIA ModelOpt's auto_quantize at three sizes, judged where neither searched, beside the headroom.

    python benchmarks/vs_modelopt.py [--model smollm2-135m] [--sweep runs/smollm2] [--bits 14 12 10] [--headroom 200]
        [--modes kl_div gradient] [--methods exact fisher path] [--costs single path context] [--out runs/vs-modelopt]

1. ModelOpt, in its own venv (~/.cache/fp8probe/modelopt-venv, made on first use: nvidia-modelopt with a
   transformers it accepts, on the CPU torch wheel), runs auto_quantize on the embedded student with the sweep's
   rollouts (modelopt_worker.py), in its kl_div and gradient modes, FP8_DEFAULT_CFG or BF16 per layer group,
   lm_head disabled, at each size's effective bits over the weights ModelOpt counts (every Linear, lm_head included
   at its full size): 14, 12, 10 on the embedded student put about 25 %, 50 % and 75 % of those in FP8 (32, 63 and
   95 % of the decoder's); Gemma 3 270M's lm_head is 63 % of them and stays BF16 (ModelOpt's floor: 13.0 bits), so
   its sizes are 15.25, 14.5 and 13.75 (a quarter, half and three quarters of the decoder's Linear weights). Its
   results are kept in --out (a rerun reuses them, wall time included, and shows every mode kept there).
2. fp8probe sweeps the same rollouts with the same kind of FP8 (scheme FP8: per-tensor weights and static per-tensor
   inputs, as FP8_DEFAULT_CFG), per fused group (exact, fisher, and path: path_sweep.py, beside this file, `sweep
   --method path` until it left the package), then chooses the recipe that saves at least ModelOpt gradient's bytes at
   that size (`--min-bytes-saved`) by each path: the sweep's rows (with and without refinement), and groups priced at
   the operating point (`--costs path`, `--costs context`: pricing.py, beside this file, writes the prices into the
   table make_recipe ranks; `--costs damage`: the groups ranked by the terms of a damage model fitted on 40 measured
   random recipes around the operating point, what `recipe --damage-model 40` did before it left the package); the
   row "default path" is what `fp8probe sweep` then `fp8probe recipe` run with neither told otherwise (the defaults
   read from their settings: the fisher estimate, no refinement under a memory target, the recipe's own held-out
   split), but for the recipe's vllm-cuda figure (`--engine`, a report beside the held-out one that chooses nothing),
   which every row leaves out: the judge below measures every recipe that way.
3. The headroom: an evolutionary search (evolve.py, beside this file) measures --headroom candidates at those bytes on
   the search rollouts, from the best fp8probe recipe there: the best any selection found at that size.
4. Judged on rollouts no search saw: the student's samples of other prompts (the built-in prompts the sweep did not
   use) with another seed. Two evaluators that no search used: the simulation on those tokens (static input scales
   calibrated on the search rollouts, as an export would) and the vllm-cuda engine profile (vLLM's bf16 model with
   its FP8 GEMMs; vllm-cpu does not cover per-tensor FP8). Each KL with its 90 % bootstrap interval over the
   held-out prompts, and each ratio to ModelOpt gradient's with a paired one (the same tokens under both recipes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pricing  # beside this file: the scripts' folder is on sys.path
import torch

from fp8probe import RecipeSettings, SweepSettings, load_rollouts, load_student
from fp8probe.cli import main as cli
from fp8probe.core.schemes import Scheme
from fp8probe.core.stats import bootstrap_interval
from fp8probe.measurement.bench import Bench
from fp8probe.measurement.measure import measure
from fp8probe.measurement.mismatch import metric_over
from fp8probe.measurement.perturbation import Perturbation
from fp8probe.measurement.reference import Reference
from fp8probe.model.embedded import STUDENTS
from fp8probe.model.prompts import BUILTIN_PROMPTS
from fp8probe.model.rollouts import make_rollouts
from fp8probe.recipe.refine import DEFAULT_REFINE_PASSES
from fp8probe.recipe.selection import group_scores, linear_params, make_recipe
from fp8probe.recipe.settings import RecipeContext
from fp8probe.sweeps.files import read_sweep

CACHE = Path.home() / ".cache" / "fp8probe"
VENV = CACHE / "modelopt-venv"  # the released wheel, MODELOPT_RELEASE
VENV_AS = CACHE / "modelopt-as-venv"  # ModelOpt built from PR #2183's merge commit (its source given as --as-source)
MODELOPT_RELEASE = "0.47.0"
WORKER = Path(__file__).with_name("modelopt_worker.py")
METHODS = ("exact", "fisher", "path")
ENGINES = ("sim", "vllm-cuda")
# ModelOpt's search modes, every one from the PR's merge build; "aumann_shapley:8" at 8 path nodes (its default: 2);
# "gradient@0.47.0" the released wheel's gradient mode, a check that the two builds agree
MODES = ("gradient", "kl_div", "aumann_shapley", "aumann_shapley:8", f"gradient@{MODELOPT_RELEASE}")


def _venv(path: Path, *packages: str) -> Path:
    py = path / "bin" / "python"
    if not (path / ".ready").exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + ["torch==2.13.0"], check=True)
        subprocess.run(pip + ["transformers<5.15", "requests", "accelerate", "safetensors", *packages], check=True)
    return py


def modelopt_python(mode: str, source: str | None) -> Path:
    """The venv that runs `mode`: ModelOpt's released wheel for "...@0.47.0", else ModelOpt built from the
    saturation-aware mode's source (NVIDIA Model-Optimizer PR #2183's merge commit, a checkout given as --as-source)
    over the same dependencies, made on first use."""
    if mode.endswith(f"@{MODELOPT_RELEASE}"):
        py = _venv(VENV, f"nvidia-modelopt=={MODELOPT_RELEASE}")
        (VENV / ".ready").touch()
        return py
    if not (VENV_AS / ".ready").exists() and source is None:
        raise SystemExit("ModelOpt's merge build: pass --as-source, a checkout of Model-Optimizer PR #2183's merge")
    py = _venv(VENV_AS, f"nvidia-modelopt=={MODELOPT_RELEASE}", "setuptools", "setuptools_scm", "wheel")
    if not (VENV_AS / ".ready").exists():  # the source over the wheel's dependencies; it has no git for its version
        env = {**os.environ, "SETUPTOOLS_SCM_PRETEND_VERSION": "0.48.0.dev0"}
        pip = [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--force-reinstall"]
        subprocess.run(pip + [source], check=True, env=env)
        (VENV_AS / ".ready").touch()
    return py


def run_modelopt(
    rollouts,
    out: Path,
    bits: float,
    modes=("kl_div", "gradient"),
    as_source: str | None = None,
    model: str = "smollm2-135m",
    reuse_scores: bool = False,
) -> dict:
    """ModelOpt's recipe of each mode at `bits` (kept in `out`, run where missing). With `reuse_scores` each mode
    searches once, through ModelOpt's own search checkpoint in `out`: the first size calibrates and scores, a later
    size restores them and only solves; a restored size's `seconds` is the scoring run's (what one recipe of any size
    costs a user who searches once), its own in `solve_seconds`."""
    tokens = out / "tokens.pt"
    torch.save(
        {
            "input_ids": rollouts.input_ids,
            "attention_mask": rollouts.attention_mask,
            "response_mask": rollouts.response_mask,
        },
        tokens,
    )
    mo = {}
    # the modes asked for, then any other mode run before at this size and kept in --out
    for mode in [*modes, *(m for m in MODES if m not in modes)]:
        res = out / f"modelopt-{mode.replace(':', '-')}-{bits:g}.json"
        if mode in modes and not res.exists():
            method, _, nodes = mode.split("@")[0].partition(":")
            search = search_stem(out, mode, rollouts) if reuse_scores else None
            args = [str(STUDENTS[model]()), str(tokens), method, str(bits), str(res), nodes or "-"]
            args += [str(search.with_suffix(".pth"))] if search else []
            done = subprocess.run([str(modelopt_python(mode, as_source)), str(WORKER), *args])
            if done.returncode != 0:  # said in the table's place, the other modes still compared
                print(f"ModelOpt {mode} at {bits:g} bits failed (exit {done.returncode}): no row", flush=True)
                continue
            if search:
                _share_search_time(res, search.with_suffix(".json"))
        if res.exists():
            mo[mode] = json.loads(res.read_text())
    return mo


def search_stem(out: Path, mode: str, rollouts) -> Path:
    """Where ModelOpt's search checkpoint of `mode` and its scoring time live: keyed by the rollouts' digest, so scores
    made on other rollouts in the same --out are never restored."""
    return out / f"modelopt-{mode.replace(':', '-')}-search-{rollouts.digest()[:12]}"


def _share_search_time(res: Path, scoring: Path) -> None:
    """The scoring run's seconds kept beside ModelOpt's checkpoint, and given to every size that restored it."""
    got = json.loads(res.read_text())
    if not got["restored"]:
        scoring.write_text(json.dumps({"seconds": got["seconds"], "effective_bits": got["effective_bits"]}))
        return
    first = json.loads(scoring.read_text())
    got |= {"solve_seconds": got["seconds"], "seconds": first["seconds"], "scored_at_bits": first["effective_bits"]}
    res.write_text(json.dumps(got))


def sweeps(sweep: str, out: Path, model: str = "smollm2-135m", methods=METHODS) -> dict:
    """method -> (the per-group FP8 sweep table, its seconds: reference + rows, the per-sequence amax it kept for the
    recipe or None). The path sweep (path_sweep.py, beside this file: out of the package) prices the fisher sweep's
    rows, made first where not kept."""
    tables = {}
    for method in methods:
        d = out / f"sweep-fp8-{method}"
        if not (d / "sensitivity.csv").exists():
            _sweep(sweep, out, model, method)
        run = read_sweep(d)
        # reference, estimate and rows, no loading; the amax `fp8probe recipe` reads from the sweep, as it reads them
        tables[method] = (run.table, run.run.seconds["sweep"], run.sequence_scales(load_rollouts(d)))
    return tables


def _sweep(sweep: str, out: Path, model: str, method: str) -> None:
    d = out / f"sweep-fp8-{method}"
    if method == "path":
        from path_sweep import path_sweep  # beside this file

        if not (out / "sweep-fp8-fisher" / "sensitivity.csv").exists():
            _sweep(sweep, out, model, "fisher")
        path_sweep(load_student(model), out / "sweep-fp8-fisher", d)
        return
    args = ["-q", "sweep", model, "--rollouts", sweep, "--scheme", "FP8", "--granularity", "group", "--no-kv"]
    assert cli([*args, "--method", method, "--out", str(d)]) == 0


class Judge:
    """Every recipe on the held-out rollouts by both evaluators, with intervals; ratios paired on the same tokens; and
    by the simulation on the search rollouts (what every search saw), beside them."""

    def __init__(self, student, held, search: Bench):
        self.student, self.held, self.search = student, held, search
        self.reference = Reference(student, held, calibrate=False)
        self.reference.calibration = search.reference().calibration  # static input scales from the search rollouts
        self.bench = Bench.around(self.reference, student, held)
        self.prompt = self.reference.prompt.numpy()

    def __call__(self, units) -> dict:
        p = Perturbation(tuple(units), Scheme.from_name("FP8"))
        got = {e: measure(self.bench, p, engine=e) for e in ENGINES}
        return got | {"search": measure(self.search, p)}

    def kl(self, m) -> tuple[float, float, float]:
        lo, hi = m.interval("kl_q_p")
        return m.metrics["kl_q_p"], lo, hi

    def ratio(self, a, b) -> tuple[float, float, float]:
        """KL(a) / KL(b) on the same tokens, with a paired bootstrap interval over the held-out prompts."""
        _, ra = metric_over(a.stats, "kl_q_p")
        _, rb = metric_over(b.stats, "kl_q_p")
        lo, hi = bootstrap_interval(self.prompt, lambda i: ra(i) / rb(i))
        return ra(np.arange(len(self.prompt))) / rb(np.arange(len(self.prompt))), lo, hi


SIZES = (14.0, 12.0, 10.0)  # effective bits: about 25 %, 50 % and 75 % of the Linear weights (lm_head included) in FP8
# fp8probe's paths: (sweep method, how groups are priced, refinement passes, the recipe's own held-out split); the
# CLI's default path, `sweep` then `recipe` with neither told otherwise, is DEFAULT_PATH
_RECIPE = RecipeSettings(effective_bits=SIZES[0])  # every size here is a memory target: its defaults resolved
_SWEEP = {f.name: f.default for f in dataclasses.fields(SweepSettings)}
DEFAULT_PATH = (_SWEEP["method"], "single", _RECIPE.refine_passes, _RECIPE.holdout)
PATHS = (
    ("exact", "single", 0, 0),
    ("exact", "single", DEFAULT_REFINE_PASSES, 0),
    ("fisher", "single", 0, 0),
    DEFAULT_PATH,
    ("path", "single", 0, 0),
    ("fisher", "path", 0, 0),
    ("exact", "path", 0, 0),
    ("exact", "context", 0, 0),
    ("fisher", "damage", 0, 0),
)
COSTS = tuple(dict.fromkeys(p[1] for p in PATHS))
# the kinds pricing.py writes into the table (its every kind but the single rows themselves)
PRICED = tuple(c for c in pricing.COSTS if c != "single")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--model",
        default="smollm2-135m",
        choices=sorted(STUDENTS),
        help="the student (the embedded one, or Gemma 3 270M)",
    )
    ap.add_argument(
        "--sweep",
        default="runs/smollm2",
        help="a sweep dir of that student: its rollouts are what every tool searches on",
    )
    ap.add_argument("--bits", type=float, nargs="+", default=list(SIZES), help="effective bits of the sizes compared")
    ap.add_argument("--heldout-seed", type=int, default=1)
    ap.add_argument(
        "--modes",
        nargs="+",
        default=["gradient", "aumann_shapley", f"gradient@{MODELOPT_RELEASE}"],
        choices=MODES,
        help="ModelOpt's search modes (aumann_shapley: the saturation-aware mode, from --as-source)",
    )
    ap.add_argument("--as-source", help="a checkout of Model-Optimizer PR #2183 (ModelOpt's aumann_shapley mode)")
    ap.add_argument(
        "--headroom",
        type=int,
        default=200,
        help="candidates the evolutionary search measures per size (0: no headroom row)",
    )
    ap.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        choices=METHODS,
        help="fp8probe's sweep methods compared (the paths of the others are left out)",
    )
    ap.add_argument(
        "--costs",
        nargs="+",
        default=list(COSTS),
        choices=COSTS,
        help="how fp8probe's recipes price groups (context: one measured pass per group, slow)",
    )
    ap.add_argument(
        "--refine",
        type=int,
        nargs="+",
        default=sorted({p[2] for p in PATHS}),
        help="the refinement passes of the paths compared (0: unrefined alone; each pass a measured search pass)",
    )
    ap.add_argument(
        "--reuse-scores",
        action="store_true",
        help="each ModelOpt mode scores once and solves every size from its search checkpoint (its time: the scoring)",
    )
    ap.add_argument("--out", default="runs/vs-modelopt")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rollouts = load_rollouts(args.sweep)
    mo = {
        bits: run_modelopt(rollouts, out, bits, args.modes, args.as_source, args.model, args.reuse_scores)
        for bits in args.bits
    }
    tables = sweeps(args.sweep, out, args.model, args.methods)
    paths = [p for p in PATHS if p[0] in args.methods and p[1] in args.costs and p[2] in args.refine]
    student = load_student(args.model)
    search_ref = Bench(student, rollouts)  # the search rollouts, their reference made once
    seen = set(rollouts.meta.prompts)
    unseen = [p for p in BUILTIN_PROMPTS if p not in seen]
    held = make_rollouts(student, prompts=unseen, max_new_tokens=64, seed=args.heldout_seed)
    judge = Judge(student, held, search_ref)
    members = {g: [u.name for u in us] for g, us in student.groups().items()}
    unit_group = {u.name: u.group for u in student.quantizable}
    total = linear_params(student)
    groups = group_scores(tables[args.methods[0]][0], "kl_q_p", members)  # bytes and params: the same in any
    by_name = {g.group: g for g in groups}

    print(
        f"{args.model}; every tool searches on the sweep's {rollouts.num_sequences} rollouts; judged on "
        f"{held.num_sequences} samples of {len(unseen)} other prompts (seed {args.heldout_seed}, "
        f"{held.num_response_tokens} response tokens) by the simulation and the vllm-cuda profile; FP8 per-tensor "
        "(FP8_DEFAULT_CFG / scheme FP8); KL(q||p) per token [90 % interval over the held-out prompts]; ratios to "
        "ModelOpt gradient's recipe of the size, paired on the held-out tokens"
    )
    rows = []
    for bits in args.bits:
        print(f"\n{bits:g} effective bits")
        print(
            f"{'recipe':<34}{'groups':>7}{'MiB':>7}{'bits':>6}  {'KL sim':<28}{'KL vllm-cuda':<28}{'KL search':<28}"
            f"{'ratio sim':<24}{'ratio vllm-cuda':<24}{'time s':>7}"
        )
        chosen = {
            mode: sorted({unit_group[n] for n in res["fp8_modules"] if n in unit_group})
            for mode, res in mo[bits].items()
        }
        if not chosen:  # every ModelOpt mode failed at this size (said above): nothing to compare against
            print(f"no ModelOpt recipe at {bits:g} bits: the size is skipped")
            continue
        base_mode = "gradient" if "gradient" in chosen else next(iter(chosen))
        saved = sum(by_name[g].bytes_saved for g in chosen[base_mode])
        base = judge([u for g in chosen[base_mode] for u in members[g]])
        recipes = {}
        for mode in chosen:
            gs = chosen[mode]
            got = base if mode == base_mode else judge([u for g in gs for u in members[g]])
            b = 16 - 8 * sum(by_name[g].params for g in gs) / total
            rows.append(
                _row(
                    f"ModelOpt {mode}",
                    len(gs),
                    sum(by_name[g].bytes_saved for g in gs),
                    b,
                    got,
                    None if mode == base_mode else base,
                    judge,
                    mo[bits][mode]["seconds"],
                )
                | {"bits_target": bits, "tool": "modelopt", "mode": mode, "fp8_groups": gs}
            )
        for method, costs, passes, holdout in paths:
            table, t_sweep, kept = tables[method]
            t0 = time.perf_counter()
            # with its own held-out split the recipe makes its references (the CLI's time), else it reuses one
            ask = RecipeSettings(min_bytes_saved=saved, refine=passes, holdout=holdout, engine="none")
            if costs in PRICED:  # priced where the single rows' recipe runs, then ranked by those prices
                point = recipes.get((method, "single", 0, 0), (None,))[0]  # made above, where PATHS lists it first
                table = _priced(table, costs, saved, search_ref, members, point)
            rec = make_recipe(table, search_ref, ask, context=RecipeContext(scheme="FP8", scales=kept))
            secs = t_sweep + time.perf_counter() - t0
            got = judge([u for g in rec.quantized for u in members[g]])
            recipes[(method, costs, passes, holdout)] = (rec.quantized, got)
            label = (
                "default path (sweep, recipe)"
                if (method, costs, passes, holdout) == DEFAULT_PATH
                else f"  {method}, {costs}, refine {passes}"
            )
            rows.append(
                _row(label, len(rec.quantized), rec.bytes_saved, rec.effective_bits, got, base, judge, secs)
                | {
                    "bits_target": bits,
                    "tool": "fp8probe",
                    "method": method,
                    "costs": costs,
                    "refine": passes,
                    "holdout": holdout,
                    "fp8_groups": list(rec.quantized),  # kept: any two recipes can be paired again later
                }
            )
        if args.headroom:
            rows.append(
                _headroom(
                    args.headroom,
                    recipes,
                    student,
                    rollouts,
                    search_ref,
                    members,
                    by_name,
                    saved,
                    total,
                    judge,
                    base,
                    bits,
                )
            )
    (out / "table.json").write_text(json.dumps(rows, indent=1))
    print(
        "time: ModelOpt = auto_quantize (calibration, scores, search; model loading excluded), fp8probe = its sweep "
        "(reference + group rows) + the recipe (pricing and search); headroom = the evolutionary search alone; "
        "ratios below 1 favour fp8probe"
    )


def _priced(table, costs, saved, search_ref, members, point=None):
    """The group table with each group priced at the operating point the single rows choose at these bytes (`costs`
    path, context or damage: pricing.py, beside this file); `point`: that recipe's groups where the table already
    made it (its row "method, single, refine 0"), else made here."""
    if point is None:
        ask = RecipeSettings(min_bytes_saved=saved, refine=0, holdout=0, engine="none")
        ctx = RecipeContext(scheme="FP8")
        point = make_recipe(table, search_ref, ask, context=ctx).quantized
    by_name = {g.group: g for g in group_scores(table, "kl_q_p", members)}
    current = [by_name[g] for g in point]
    return pricing.priced_table(table, costs, current, list(by_name.values()), search_ref, Scheme.from_name("FP8"))[0]


def _headroom(
    evaluations, recipes, student, rollouts, search_ref, members, by_name, saved, total, judge, base, bits
) -> dict:
    """The best recipe at these bytes an evolutionary search finds, measuring `evaluations` candidates on the search
    rollouts, started from the best fp8probe recipe there; judged like the others."""
    from evolve import evolve  # benchmarks/evolve.py: the script's own folder is on sys.path

    from fp8probe.recipe.selection import measure_groups

    def fitness(s):
        gs = [by_name[g] for g in s]
        return measure_groups(gs, search_ref, Scheme.from_name("FP8"), "kl_q_p", None)[0]

    def value(s):
        return sum(by_name[g].bytes_saved for g in s)

    start = min((frozenset(q) for q, _ in recipes.values()), key=fitness)
    t0 = time.perf_counter()
    ev = evolve(list(by_name), value, saved, fitness, start, evaluations)
    secs = time.perf_counter() - t0
    got = judge([u for g in ev.best for u in members[g]])
    b = 16 - 8 * sum(by_name[g].params for g in ev.best) / total
    # did it converge: the best KL on the search rollouts against the candidates measured so far
    print("  headroom, best search KL by candidates measured: " + ", ".join(f"{n}: {f:.5f}" for n, f in ev.history))
    return _row(f"  headroom ({ev.evaluations} measured)", len(ev.best), value(ev.best), b, got, base, judge, secs) | {
        "bits_target": bits,
        "tool": "headroom",
        "evaluations": ev.evaluations,
        "search_kl": ev.fitness,
        "history": ev.history,
        "start_search_kl": ev.history[0][1],  # the start, as the search measured it first
    }


def _row(name, groups, saved, bits, got, base, judge, secs) -> dict:
    cells, row = [], {"recipe": name.strip(), "groups": groups, "mib": saved / 2**20, "bits": bits, "seconds": secs}
    for e in (*ENGINES, "search"):
        v, lo, hi = judge.kl(got[e])
        cells.append(f"{v:.5f} [{lo:.5f}, {hi:.5f}]  ")
        row[f"kl_{e}"] = [v, lo, hi]
    for e in ENGINES:
        if base is None:
            cells.append(" " * 24)
            continue
        r, lo, hi = judge.ratio(got[e], base[e])
        cells.append(f"{r:.3f} [{lo:.3f}, {hi:.3f}]".ljust(24))
        row[f"ratio_{e}"] = [r, lo, hi]
    print(f"{name:<34}{groups:>7}{saved / 2**20:>7.1f}{bits:>6.2f}  {''.join(cells)}{secs:>7.0f}")
    return row


if __name__ == "__main__":
    main()
