"""One label draw or two: the fast estimate's rank quality against the exact sweep per draw count, over estimate seeds
(#76: one draw is what would bring the default sweep near 1.6x its floor, two cost 2.2x; docs/performance.md).

    python benchmarks/label_draws.py EXACT_SWEEP [--seeds 5] [--draws 1 2] [--json OUT.json]

On a finished exact sweep (its rollouts, student, scheme and granularity), the estimate (fisher_rows, the sweep's
default estimator) is made with each draw count at seeds 0 .. n-1, with one calibration made beforehand (static
schemes) so that the times are the estimate's alone. Each estimate is compared with the exact kl_q_p of every unit or
group row (no KV or whole-model rows): Spearman's rho and the top-10 overlap. Per draw count: each seed's figures,
their mean and range, the median time; and the change from the fewest draws, seed by seed. The seeds are the
estimate's only randomness, so their range is the estimate's own noise; the exact table is one measurement, whose
noise is not in it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def compare(sweep_dir, seeds: int = 5, draws=(1, 2)) -> dict:
    """{draw count: {"rho": [per seed], "top10": [...], "seconds": median}, "rows": n, "change": {count: {...}}}."""
    from fp8probe.core.schemes import KVCacheScheme, Scheme
    from fp8probe.core.stats import spearman, top_overlap
    from fp8probe.measurement.calibration import calibrate
    from fp8probe.measurement.fisher import DEFAULT_ESTIMATOR, Draws, fisher_rows
    from fp8probe.model.rollouts import load_rollouts
    from fp8probe.model.student import load_student
    from fp8probe.sweeps.files import read_sweep
    from fp8probe.sweeps.sweep import plan_rows

    run = read_sweep(sweep_dir)
    rollouts = load_rollouts(sweep_dir)
    student = load_student(run.model_source, dtype=run.run.dtype or "float32")
    scheme, granularity, bs = Scheme.from_name(run.run.scheme), run.run.granularity or "unit", run.run.batch_size or 8
    rows = [r for r in plan_rows(student, scheme, granularity, include_kv=False) if r.kind != "model"]
    exact = dict(zip(run.table["unit"], run.table["kl_q_p"]))
    names = [r.unit for r in rows]
    units = sorted({u for r in rows for u in r.perturbation.units})
    cal = (
        calibrate(student, rollouts, units, KVCacheScheme().strategy, bs, per_sequence=True)
        if scheme.static_input
        else None
    )
    out: dict = {"rows": len(names), "response_tokens": rollouts.num_response_tokens}
    for d in draws:
        rho, top, secs = [], [], []
        for seed in range(seeds):
            t = time.perf_counter()
            fr = fisher_rows(student, rollouts, rows, Draws(d, seed), batch_size=bs, calibration=cal,
                             fused=granularity == "group")  # fmt: skip
            secs.append(time.perf_counter() - t)
            est = fr.column(DEFAULT_ESTIMATOR)
            rho.append(spearman([est[n] for n in names], [exact[n] for n in names]))
            top.append(top_overlap({n: est[n] for n in names}, {n: exact[n] for n in names}))
        out[d] = {"rho": rho, "top10": top, "seconds": statistics.median(secs)}
    base = min(draws)
    out["change"] = {
        d: {k: [a - b for a, b in zip(out[d][k], out[base][k])] for k in ("rho", "top10")} for d in draws if d != base
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--draws", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json")
    args = ap.parse_args()
    res = compare(args.sweep, args.seeds, tuple(args.draws))
    print(f"{res['rows']} rows, {res['response_tokens']} response tokens; rho and top-10 against the exact kl_q_p")
    for d in args.draws:
        r = res[d]
        print(
            f"{d} draw(s): rho mean {statistics.mean(r['rho']):.3f} [{min(r['rho']):.3f}, {max(r['rho']):.3f}], "
            f"top-10 mean {statistics.mean(r['top10']):.1f} [{min(r['top10'])}, {max(r['top10'])}], "
            f"{r['seconds']:.1f} s (median)"
        )
    for d, c in res["change"].items():
        print(
            f"{d} draws - {min(args.draws)}, seed by seed: rho {statistics.mean(c['rho']):+.3f} "
            f"[{min(c['rho']):+.3f}, {max(c['rho']):+.3f}], top-10 {statistics.mean(c['top10']):+.1f} "
            f"[{min(c['top10']):+d}, {max(c['top10']):+d}]"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), **{str(k): v for k, v in res.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
