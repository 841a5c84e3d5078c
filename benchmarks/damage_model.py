"""How well a recipe's mismatch is predicted before it is measured: the damage model (damage.py, beside this file)
against the plain sum of single-group costs that selection predicts with, on random recipes it was not fitted on.

    python benchmarks/damage_model.py [--model smollm2-135m|gemma3-270m] [--scheme FP8] [--fit 50] [--test 40]
    python benchmarks/damage_model.py --refit runs/damage-model/gemma3-270m-FP8.json [--fit 50]   # no measuring
    python benchmarks/damage_model.py --extend runs/damage-model/gemma3-270m-FP8.json --fit 100 --test 60
    python benchmarks/damage_model.py --model gemma3-270m --by-prompts --fit 50 --test 40   # error against tokens

1. The student samples its own rollouts (--num-prompts, --max-new-tokens, seed 0); every measurement below is the
   simulation on those tokens (mean per-token KL(q||p) against the BF16 reference).
2. Prior per-group costs, two kinds: each fused group alone in FP8 (the sweep's group rows, measured), and its path
   attribution from BF16 to every group in FP8 (attribution.py, beside this file: a few forward and backward passes);
   and each group's in-context cost, left out of the whole model in FP8 (one measured pass per group), for the
   damage model's in-context term (damage.py, beside this file).
3. Random recipes (uniform sets of fused groups) measured: --fit of them, at sizes spread from 10 % to 90 % of the
   groups, to fit on; --test others (another seed, other sizes) to judge on.
4. Each predictor's |relative error| on the test recipes: median (with its 90 % bootstrap interval over the test
   recipes) and 90th percentile, and its Spearman correlation with the measured values. Predictors: the plain sum of
   single costs (selection's prediction), the plain sum of path shares, the damage model fitted on each prior, and
   the damage model on the single costs with the in-context term.
   Wall time of each step.

A run keeps each stage as it ends in `<out>/<model>-<scheme>.partial.json` and, started again with the same
settings, resumes there (the file goes when the JSON is written).

--extend measures --fit and --test more random recipes (fresh seeds, none measured before) on the same rollouts as a
JSON this benchmark wrote, keeps its priors, and judges again on all: more recipes without the priors' cost (the
sweep's group rows are most of it on Gemma 3). It re-measures one stored recipe first and stops if the value differs
(other rollouts, another reference). A JSON written before the in-context costs were measured gets them measured.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from attribution import path_attribution  # beside this file
from damage import fit_damage, prediction_errors, random_recipes

from fp8probe import load_student
from fp8probe.core.schemes import Scheme
from fp8probe.core.stats import bootstrap_interval, spearman
from fp8probe.measurement.bench import Bench
from fp8probe.model.rollouts import make_rollouts
from fp8probe.recipe.selection import GroupScore, group_scores, measure_groups
from fp8probe.sweeps.settings import SweepSettings
from fp8probe.sweeps.sweep import sweep

FIT_SIZES = (0.1, 0.25, 0.5, 0.75, 0.9)
TEST_SIZES = (0.15, 0.35, 0.6, 0.85)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--scheme", default="FP8")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--fit", type=int, default=50, help="random recipes fitted on")
    ap.add_argument("--test", type=int, default=40, help="random recipes judged on")
    ap.add_argument("--nodes", type=int, default=4, help="path attribution's nodes (0: no path attribution)")
    ap.add_argument("--out", default="runs/damage-model")
    ap.add_argument(
        "--refit",
        metavar="JSON",
        help="a JSON this benchmark wrote: fit and judge its measured recipes "
        "again (--fit of its fitted ones, evenly spaced), measuring nothing",
    )
    ap.add_argument(
        "--extend",
        metavar="JSON",
        help="a JSON this benchmark wrote: measure --fit and --test more "
        "random recipes on its rollouts, then fit and judge on all of them (written back to it)",
    )
    ap.add_argument(
        "--by-prompts",
        action="store_true",
        help="measure every group alone and the random recipes "
        "again, each figure kept over the first 4, 8 and all prompts, and judge the model at each: does "
        "its error shrink with the tokens (cross terms between groups' errors) or not?",
    )
    args = ap.parse_args()
    if args.by_prompts:
        doc = by_prompts(args)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"{args.model}-{args.scheme}-by-prompts.json").write_text(json.dumps(doc, indent=1))
        return
    if args.extend:
        doc = extend(args)
        doc["rows"] = report(doc)
        Path(args.extend).write_text(json.dumps(doc, indent=1))
        return
    if args.refit:
        doc = json.loads(Path(args.refit).read_text())
        step = max(1, len(doc["fit"]) // args.fit)  # every size kept: the recipes are stored size by size
        doc["fit"] = doc["fit"][::step][: args.fit]
        report(doc)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = measure(args)
    doc["rows"] = report(doc)
    (out / f"{args.model}-{doc['scheme']}.json").write_text(json.dumps(doc, indent=1))
    (out / f"{args.model}-{doc['scheme']}.partial.json").unlink()


def measure(args) -> dict:
    """The priors and the measured random recipes: everything the fits need (written to the JSON). Each stage is
    kept in `<out>/<model>-<scheme>.partial.json` as it ends (the recipes every 10), and a run with the same
    settings resumes from it: on Gemma 3 at 32 prompts the stages take hours here."""
    scheme = Scheme.from_name(args.scheme)
    part = Path(args.out) / f"{args.model}-{scheme.name}.partial.json"
    settings = {
        "model": args.model,
        "scheme": scheme.name,
        "num_prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "nodes": args.nodes,
    }
    doc = json.loads(part.read_text()) if part.is_file() else dict(settings)
    if any(doc.get(k) != v for k, v in settings.items()):
        raise SystemExit(
            f"{part} was measured with other settings ({', '.join(f'{k} {doc.get(k)}' for k in settings)})"
            ": delete it or pass those"
        )
    secs = doc.setdefault("seconds", {})

    def save():
        part.write_text(json.dumps(doc))

    t0 = time.perf_counter()
    student, rollouts, bench, members = _setup(args.model, args.num_prompts, args.max_new_tokens)
    secs["rollouts_and_reference"] = time.perf_counter() - t0
    measure_as = measurer(bench, members, scheme)

    def m(s):
        return measure_as(s)[0]

    if "priors" not in doc:
        t = time.perf_counter()
        table = sweep(
            bench, SweepSettings(method="exact", scheme=scheme.name, granularity="group", include_kv=False)
        ).table
        doc["priors"] = {"single": {g.group: g.score for g in group_scores(table, "kl_q_p", members)}}
        secs["single_rows"] = time.perf_counter() - t
        if args.nodes:
            t = time.perf_counter()
            att = path_attribution(student, rollouts, bench.reference(), members, scheme, nodes=args.nodes)
            doc["priors"]["path"] = att.shares
            doc |= {"path_total": att.total, "path": att.path}
            secs["path_attribution"] = time.perf_counter() - t
        save()
        print("single costs measured", flush=True)
    names = list(doc["priors"]["single"])
    t = time.perf_counter()
    if "whole" not in doc:
        doc["whole"] = m(names)
    _in_context(m, names, doc["whole"], doc.setdefault("in_context", {}), save)
    secs["in_context"] = secs.get("in_context", 0.0) + time.perf_counter() - t
    for key, sets in (("fit", _sets(names, FIT_SIZES, args.fit, 1)), ("test", _sets(names, TEST_SIZES, args.test, 2))):
        done = doc.setdefault(key, [])
        t = time.perf_counter()
        for s in sets[len(done) :]:
            done.append([sorted(s), m(s)])
            if len(done) % 10 == 0 or len(done) == len(sets):
                secs[f"measured_{key}"] = secs.get(f"measured_{key}", 0.0) + time.perf_counter() - t
                t = time.perf_counter()
                save()
                print(f"{len(done)}/{len(sets)} {key} recipes measured", flush=True)
    return doc | {"groups": len(names), "rollouts": [rollouts.num_sequences, rollouts.num_response_tokens]}


def _sets(names, fractions, n, seed) -> list:
    """About n random recipes (random_recipes), as many at each size, a fraction of the groups each."""
    sizes = [max(1, round(f * len(names))) for f in fractions]
    return random_recipes(names, sizes, -(-n // len(sizes)), seed)


def _in_context(m, names, whole: float, loo: dict, save=None) -> dict:
    """Each group's in-context cost, into `loo` (those already there kept): `whole` (every group in FP8, measured)
    minus the whole without it; save() every 12 groups."""
    for i, g in enumerate(names):
        if g not in loo:
            loo[g] = whole - m([h for h in names if h != g])
        if (i + 1) % 12 == 0 or i + 1 == len(names):
            print(f"in-context costs: {i + 1}/{len(names)} groups", flush=True)
            if save:
                save()
    return loo


def _setup(model: str, num_prompts: int, max_new_tokens: int):
    """The student, its own rollouts (seed 0, as every run of this benchmark samples them), their BF16 reference,
    and its fused groups' member units."""
    student = load_student(model)
    rollouts = make_rollouts(student, num_prompts=num_prompts, max_new_tokens=max_new_tokens, seed=0)
    members = {g: [u.name for u in us] for g, us in student.groups().items()}
    return student, rollouts, Bench(student, rollouts), members


def setup_as_measured(doc: dict, num_prompts: int, max_new_tokens: int, source):
    """_setup on the rollouts a JSON of this benchmark was measured on (the settings it records; an older one does
    not: these), and measurer() on them, checked: one stored recipe must measure as stored."""
    student, rollouts, bench, members = _setup(
        doc["model"], doc.get("num_prompts", num_prompts), doc.get("max_new_tokens", max_new_tokens)
    )
    measure_as = measurer(bench, members, Scheme.from_name(doc["scheme"]))
    stored, value = doc["fit"][0]
    again = measure_as(stored)[0]
    if not math.isclose(again, value, rel_tol=1e-6):
        raise SystemExit(
            f"a stored recipe measures {again:.6g} here, {value:.6g} in {source}: not the same "
            "rollouts or reference (pass the run's --num-prompts and --max-new-tokens)"
        )
    return measure_as


def measurer(bench, members, scheme):
    """measure_as(groups): measure_groups' (excess KL(q||p), every metric, the Measured) with these fused groups in
    FP8 on the bench's rollouts, against its reference."""

    def measure_as(groups):
        return measure_groups([GroupScore(g, members[g], 0, 0.0, 0) for g in groups], bench, scheme, "kl_q_p", None)

    return measure_as


def extend(args) -> dict:
    """The JSON `args.extend` with --fit and --test more random recipes measured on its rollouts (see the module
    doc)."""
    doc = json.loads(Path(args.extend).read_text())
    t0 = time.perf_counter()
    measure_as = setup_as_measured(doc, args.num_prompts, args.max_new_tokens, args.extend)
    names = list(doc["priors"]["single"])

    def m(s):
        return measure_as(s)[0]

    if "in_context" not in doc:
        t = time.perf_counter()
        doc["in_context"] = _in_context(m, names, doc["whole"], {})
        doc["seconds"]["in_context"] = time.perf_counter() - t
    seen = {frozenset(s) for s, _ in doc["fit"] + doc["test"]}
    rnd = doc.get("extended", 0) + 1
    for key, sizes, n, seed in (
        ("fit", FIT_SIZES, args.fit, 1 + 2 * rnd),
        ("test", TEST_SIZES, args.test, 2 + 2 * rnd),
    ):
        sets = _sets(names, sizes, n, seed)
        new = [s for s in sets if s not in seen][:n]
        t = time.perf_counter()
        doc[key] += [[sorted(s), m(s)] for s in new]
        print(f"{len(new)} more {key} recipes measured in {time.perf_counter() - t:.0f} s", flush=True)
    doc["extended"] = rnd
    doc["seconds"][f"extended_{rnd}"] = time.perf_counter() - t0
    return doc


def by_prompts(args) -> dict:
    """Each group alone and --fit / --test random recipes measured once, each figure kept over the first k prompts
    (k = 4, 8, all); the damage model fitted and judged at each k, printed. If a recipe's error is cross terms
    between groups' errors, zero on average over rollouts, the model's error falls with k (as 1/sqrt(k) for tokens of
    finite variance; more slowly for a heavy-tailed KL, which one subset per k cannot tell from a systematic part:
    benchmarks/damage_noise.py can)."""
    from fp8probe.measurement.mismatch import metric_over

    scheme = Scheme.from_name(args.scheme)
    student, rollouts, bench, members = _setup(args.model, args.num_prompts, args.max_new_tokens)
    measure_as = measurer(bench, members, scheme)
    names = list(members)
    steps = sorted({min(k, args.num_prompts) for k in (4, 8, args.num_prompts)})

    def m(s):
        meas = measure_as(s)[2]
        _, reduce = metric_over(meas.stats, "kl_q_p")
        p = meas.prompt.numpy()
        first = np.unique(p)
        return {str(k): reduce(np.where(np.isin(p, first[:k]))[0]) for k in steps}

    t = time.perf_counter()
    single = {g: m([g]) for g in names}
    print(f"{len(names)} groups alone in {time.perf_counter() - t:.0f} s", flush=True)
    fit_sets, test_sets = _sets(names, FIT_SIZES, args.fit, 1), _sets(names, TEST_SIZES, args.test, 2)
    t = time.perf_counter()
    fit_m, test_m = [m(s) for s in fit_sets], [m(s) for s in test_sets]
    print(f"{len(fit_sets) + len(test_sets)} recipes in {time.perf_counter() - t:.0f} s", flush=True)
    rows = []
    print(f"{args.model}: the damage model on single costs, fitted and judged on the first k prompts' tokens")
    print(f"{'prompts':>8}{'sum: median |err|':>20}{'model: median |err| [90 %]':>30}{'p90':>8}")
    for k in map(str, steps):
        prior = {g: max(v[k], 1e-12) for g, v in single.items()}
        tm = np.array([v[k] for v in test_m])
        plain = np.array([sum(prior[g] for g in s) for s in test_sets])
        model = fit_damage(fit_sets, [v[k] for v in fit_m], prior)
        r = _judge(k, np.array(prediction_errors(model, test_sets, tm)["predicted"]), tm)
        r["sum_median"] = float(np.median(np.abs(plain / tm - 1)))
        rows.append(r | {"rho": model.rho})
        print(
            f"{k:>8}{r['sum_median']:>20.3f}{r['median']:>13.3f} [{r['median_interval'][0]:.3f}, "
            f"{r['median_interval'][1]:.3f}]{r['p90']:>8.3f}"
        )
    return {
        "model": args.model,
        "scheme": scheme.name,
        "steps": steps,
        "single": single,
        "fit": [[sorted(s), v] for s, v in zip(fit_sets, fit_m)],
        "test": [[sorted(s), v] for s, v in zip(test_sets, test_m)],
        "rows": rows,
    }


def report(doc: dict) -> list[dict]:
    """Each predictor on the test recipes (the plain sums and the damage model fitted on the fit recipes, on each
    prior), printed; the median |error| with its 90 % bootstrap interval over the test recipes."""
    fit_sets, fit_m = [s for s, _ in doc["fit"]], [v for _, v in doc["fit"]]
    test_sets, test_m = [s for s, _ in doc["test"]], [v for _, v in doc["test"]]
    rows = []
    for pname, prior in doc["priors"].items():
        plain = np.array([sum(prior[g] for g in s) for s in test_sets])
        rows.append(_judge(f"sum of {pname} costs", plain, test_m))
        t = time.perf_counter()
        model = fit_damage(fit_sets, fit_m, {g: max(v, 1e-12) for g, v in prior.items()})
        fit_s = time.perf_counter() - t
        pred = np.array(prediction_errors(model, test_sets, test_m)["predicted"])
        rows.append(_judge(f"damage model on {pname}", pred, test_m) | _fitted(model, fit_s))
    if "in_context" in doc:  # the single costs with the in-context term
        single = {g: max(v, 1e-12) for g, v in doc["priors"]["single"].items()}
        t = time.perf_counter()
        model = fit_damage(fit_sets, fit_m, single, context=doc["in_context"])
        pred = np.array(prediction_errors(model, test_sets, test_m)["predicted"])
        rows.append(
            _judge("damage model, single + context", pred, test_m)
            | _fitted(model, time.perf_counter() - t)
            | {"gamma": model.context.gamma}
        )
    sizes = sorted({len(s) for s in test_sets})
    n_roll, n_tok = doc.get("rollouts", ["?", "?"])
    print(
        f"{doc['model']}, {doc['scheme']}, {n_roll} rollouts ({n_tok} response tokens); {doc['groups']} fused "
        f"groups; every group in FP8: KL {doc['whole']:.5f}"
        + (
            f", path shares sum {doc['path_total']:.5f} (completeness {doc['path_total'] / doc['whole']:.3f})"
            if "path_total" in doc
            else ""
        )
        + f"; {len(fit_sets)} random recipes fitted on, {len(test_sets)} "
        f"others judged on (sizes {', '.join(map(str, sizes))} of the {doc['groups']} groups)"
    )
    print(f"{'predictor':<30}{'median |err| [90 %]':>24}{'p90 |err|':>11}{'spearman':>10}   fitted")
    for r in rows:
        extra = (
            f"rho {r['rho']:.3g}, k {r['k']:.3g}, tau {r['tau']:g}, cv {r['cv_median']:.3f}" if "rho" in r else ""
        ) + (f", gamma {r['gamma']:.3g}" if "gamma" in r else "")
        med = f"{r['median']:.3f} [{r['median_interval'][0]:.3f}, {r['median_interval'][1]:.3f}]"
        print(f"{r['predictor']:<30}{med:>24}{r['p90']:>11.3f}{r['spearman']:>10.3f}   {extra}")
    if "seconds" in doc:
        print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in doc["seconds"].items()))
    return rows


def _fitted(model, seconds) -> dict:
    return {"rho": model.rho, "k": model.k, "tau": model.tau, "cv_median": model.cv_error, "fit_seconds": seconds}


def _judge(name, pred, measured) -> dict:
    measured = np.asarray(measured)
    err = np.abs(np.asarray(pred) / measured - 1)
    lo, hi = bootstrap_interval(np.arange(len(err)), lambda i: float(np.median(err[i])), bounds=(0.0, math.inf))
    return {
        "predictor": name,
        "median": float(np.median(err)),
        "median_interval": [lo, hi],
        "p90": float(np.quantile(err, 0.9)),
        "spearman": float(spearman(list(pred), list(measured))),
    }


if __name__ == "__main__":
    main()
