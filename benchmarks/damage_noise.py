"""How much of the damage model's error is the rollouts' token noise, and how much would more rollouts remove?

    python benchmarks/damage_noise.py runs/damage-model/gemma3-270m-FP8.json [--fit 40] [--test 40] [--splits 60]

The damage model is fitted and judged on one set of rollout tokens (benchmarks/damage_model.py). Part of its error is
the same on any tokens (an interaction between groups no per-group term carries); part is particular to these tokens
(two groups' FP8 errors cancelling or adding on a few tokens), and shrinks as tokens are added. This splits the two
and projects the error at more prompts: a modelled figure, checked against the error measured on all the prompts.

1. Per-token KL(q||p) of every fused group alone in FP8, and of the first --fit and --test random recipes the JSON
   stores, on the same rollouts (checked: one stored recipe must measure as stored). Kept next to the JSON
   (`...-tokens.npz`) and measured once.
2. For k = 2, 4, ... up to half the prompts, --splits random pairs of disjoint k-prompt subsets: on each subset the
   damage model on single costs with the link alone (damage.py beside this file; no per-group corrections: two
   parameters, so a small subset can fit it) is fitted on the fit recipes and its log error log(measured /
   predicted) taken on the test recipes. The variance of that error over test recipes is V(k); its covariance
   between the two disjoint subsets is the part the subsets share: the systematic variance V_s (the mean over k).
3. The rest, V(k) - V_s, is the token noise; a power law V_n(k) = a * k^-beta fits it (beta = 1 for tokens with a
   finite variance; less for a heavy-tailed KL, where a few tokens carry much of the mean). Projected to all the
   prompts, V is compared with the V measured there; projected to 2 and 4 times the prompts, the median |error|
   scales with sqrt(V). That projection assumes new prompts are like these; on Gemma 3 it was not borne out (9.7 %
   projected at 32 prompts; 16.6 % [12.8, 19.7] measured there for the damage model on single costs:
   docs/modelopt.md).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from damage import fit_damage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json", help="a JSON benchmarks/damage_model.py wrote")
    ap.add_argument("--fit", type=int, default=40, help="its first fit recipes used")
    ap.add_argument("--test", type=int, default=40, help="its first test recipes used")
    ap.add_argument("--splits", type=int, default=60, help="random pairs of disjoint prompt subsets per size")
    args = ap.parse_args()
    doc = json.loads(Path(args.json).read_text())
    n = doc.get("num_prompts", doc["rollouts"][0])
    if n < 4:
        raise SystemExit(f"{args.json}: {n} prompts; the split needs two disjoint subsets of at least 2 (measure >= 4)")
    tok = tokens(doc, Path(args.json), args.fit, args.test)
    out = analyse(doc, tok, args.fit, args.test, args.splits)
    Path(args.json).with_name(Path(args.json).stem + "-noise.json").write_text(json.dumps(out, indent=1))


def tokens(doc: dict, path: Path, n_fit: int, n_test: int) -> dict:
    """Per-token KL of every group alone and of the first n_fit / n_test stored recipes (cached in an npz)."""
    cache = path.with_name(path.stem + "-tokens.npz")
    if cache.is_file():
        z = dict(np.load(cache))
        if len(z["fit"]) >= n_fit and len(z["test"]) >= n_test:
            return z
    from damage_model import setup_as_measured

    # an older JSON does not record its settings: one rollout per prompt, damage_model.py's default length
    measure_as = setup_as_measured(doc, doc["rollouts"][0], 48, path)
    names = list(doc["priors"]["single"])

    def m(s):
        return measure_as(s)[2]

    singles = [m([g]) for g in names]
    z = {"names": np.array(names), "prompt": singles[0].prompt.numpy(), "single": np.stack([_kl(x) for x in singles])}
    print(f"{len(names)} groups alone measured", flush=True)
    for key, n in (("fit", n_fit), ("test", n_test)):
        z[key] = np.stack([_kl(m(s)) for s, _ in doc[key][:n]])
        print(f"{n} {key} recipes measured", flush=True)
    np.savez(cache, **z)
    return z


def _kl(measured) -> np.ndarray:
    """A Measured's per-token KL(q||p), float64."""
    return measured.stats["kl_q_p"].double().numpy()


def analyse(doc: dict, z: dict, n_fit: int, n_test: int, splits: int) -> dict:
    """Steps 2 and 3 of the module doc, printed; what they found."""
    names = [str(n) for n in z["names"]]
    prompt, prompts = z["prompt"], np.unique(z["prompt"])
    fit_sets = [s for s, _ in doc["fit"][:n_fit]]
    test_sets = [s for s, _ in doc["test"][:n_test]]

    def log_errors(subset) -> np.ndarray:
        w = np.isin(prompt, subset).astype(float)
        w /= w.sum()
        single = dict(zip(names, np.maximum(z["single"] @ w, 1e-12)))
        model = fit_damage(fit_sets, z["fit"][:n_fit] @ w, single, taus=(0.0,))
        tm = z["test"][:n_test] @ w
        return np.log(tm / np.array([model.predict(s) for s in test_sets]))

    rng = np.random.default_rng(0)
    rows = []
    print(
        f"{doc['model']}: the damage model's log error on {n_test} test recipes, fitted on {n_fit}, on disjoint "
        f"subsets of the {len(prompts)} prompts ({splits} random pairs per size)"
    )
    print(f"{'prompts':>8}{'var':>10}{'shared (cov)':>14}{'median |err|':>14}")
    k = 2
    while 2 * k <= len(prompts):
        v, c, e = [], [], []
        for _ in range(splits):
            perm = rng.permutation(prompts)
            a, b = log_errors(perm[:k]), log_errors(perm[k : 2 * k])
            v += [a.var(), b.var()]
            c.append(float(np.mean((a - a.mean()) * (b - b.mean()))))
            e += [np.median(np.abs(np.expm1(a))), np.median(np.abs(np.expm1(b)))]
        rows.append({"prompts": k, "var": float(np.mean(v)), "cov": float(np.mean(c)), "median": float(np.mean(e))})
        print(f"{k:>8}{rows[-1]['var']:>10.4f}{rows[-1]['cov']:>14.4f}{rows[-1]['median']:>14.3f}")
        k *= 2
    full = log_errors(prompts)
    v_all, e_all = float(full.var()), float(np.median(np.abs(np.expm1(full))))
    v_s = float(np.mean([r["cov"] for r in rows]))
    ks = np.array([r["prompts"] for r in rows], dtype=float)
    noise = np.array([r["var"] for r in rows]) - v_s
    if len(ks) < 2 or (noise <= 0).any():
        print("the subsets' noise does not fall with the prompts as a power law: no projection")
        return {"rows": rows, "all": {"var": v_all, "median": e_all}, "systematic_var": v_s}
    slope, icpt = np.polyfit(np.log(ks), np.log(noise), 1)
    beta = -float(slope)

    def var_at(n):
        return v_s + math.exp(icpt) * n**-beta

    n = len(prompts)
    proj = {str(f * n): e_all * math.sqrt(var_at(f * n) / v_all) for f in (2, 4)}
    print(
        f"{n:>8}{v_all:>10.4f}{'':>14}{e_all:>14.3f}   all the prompts (projected from the subsets: var "
        f"{var_at(n):.4f})"
    )
    print(
        f"systematic variance {v_s:.4f} ({v_s / v_all:.0%} of it at {n} prompts); noise ~ prompts^-{beta:.2f}; "
        f"modelled median |err| at "
        + ", ".join(f"{k} prompts {v:.3f}" for k, v in proj.items())
        + f"; every token noise gone: {e_all * math.sqrt(v_s / v_all):.3f}"
    )
    return {
        "rows": rows,
        "all": {"prompts": n, "var": v_all, "median": e_all, "projected_var": var_at(n)},
        "systematic_var": v_s,
        "beta": beta,
        "projected_median": proj,
    }


if __name__ == "__main__":
    main()
