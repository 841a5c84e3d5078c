"""How often the budget's 90 % interval holds the true benchmark dose, simulating the whole `calibrate` procedure.

    python benchmarks/budget_coverage.py --out runs/coverage [--draws 200] [--workers 2] [--bootstrap 300]
                                         [--scenarios NAME ...]

Each draw is one calibration from scratch, run by the package's own `training.experiment.Ladder` (the ladder of noise
levels, the adaptive level, the allocation of `max_runs` runs with its preset-budget stop rule, every refit) on
synthetic runs instead of trained ones: a run's quality is drawn from the seed random-effect model of
budget/design.py,

    q = m0 + u_seed + e_run + f(dose) · (start − m0)

with the twins' mean m0 = 4, the quality before training start = 8 (lower is better: a gain of 4), a seed effect u
shared by every run of a seed, and each run's own noise e (the twins' σ0, the perturbed runs' σ1): against a twin at m0
a run's gain-based loss is f(dose) exactly, so f is the true curve on the response the budget reads. The noise is set by
the paired loss's per-run standard deviation (`sd`: pair A measured 5-8 % for OPD, 11 % for GRPO) and the twin's share
of it (`twin`: σ0² / (σ0² + σ1²), 0-0.5), the seed effect by its share of a run's variance (`seed`). A level's dose
grows as pair A's measured doses on check's scale do (`DOSES`: σ² at first, saturating above σ = 0.05). The truths
include curves no family of the fit has: a plateau, a threshold, a concave low dose, a dip below zero before the rise.
The true BMD is where the true curve first reaches the tolerance (by bisection; hand values in TRUTHS' notes); a draw
covers it when its interval holds it, an end censored at the highest tested dose counting as open.

Beside two-sided coverage, what the verdicts rest on: the lower end's miss rate (the BMDL above the true BMD: a
configuration between them is admitted though it loses more than the tolerance; a 90 % interval allows 5 %), the upper
end's, and power: the share of calibrations whose interval ADMITs a configuration at half the true BMD (its measured
interval's upper end at or below the BMDL) and REJECTs one at twice it (its lower end above an uncensored BMDU). A
configuration's dose is measured as `check` measures it: with `--check-error` (default 0.14, the relative half-width
of a 16-prompt check on pair A) about it. Two scenario options model what the shipped data show beside the random-effect
model: `dose_error` (each level's dose as `calibrate` records it is the true one times a lognormal error of that sd:
doses.json's draws spread about 10-20 %) and `tails` (each run's own noise Student-t with 3 degrees of freedom, scaled
to the same sd: a few runs far off, as pair A's KV level's seed that lost 23 %).

Coverage per scenario with its 90 % Clopper-Pearson interval; resumable (one JSON line per draw in --out); the fits
inside use --bootstrap draws per bootstrap (300 by default; the command line's default is 1000), stated with the
table. Pass --stop-rule narrow to simulate the old rule (stop once BMDU / BMDL <= 3), for the comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

TOLERANCE = 0.02
# pair A's doses on check's scale (recipes/smollm2-135m/calibration/doses.json): σ -> kl_q_p, log-log between them
DOSES = {
    0.00333: 0.0181,
    0.01: 0.1572,
    0.03: 1.103,
    0.0405: 1.681,
    0.0548: 2.483,
    0.074: 3.604,
    0.1: 4.915,
    0.15: 6.703,
    0.2: 8.273,
}
LEVELS = ("0", "0.01", "0.03", "0.1")  # the demo's ladder (σ); calibrate adds one adaptive level and the allocation
M0, START = 4.0, 8.0


def _hill(v, k, n):
    return lambda d: v * d**n / (k**n + d**n)


# name -> (the true loss at a dose (gain scale), a note on its BMD at 2 %)
TRUTHS = {
    "linear": (lambda d: 0.02 * d / 1.0, "0.02·d: BMD 1.0"),
    "hill": (_hill(0.08, 2.0, 2.0), "0.08·d²/(4 + d²): BMD 2/sqrt(3) = 1.155"),
    "plateau": (_hill(0.04, 0.3, 1.0), "0.04·d/(0.3 + d), a plateau at 4 % (Hill n = 1): BMD 0.3"),
    "threshold": (lambda d: np.maximum(0.0, d - 1.0) * 0.02, "0 below d = 1, then 0.02·(d − 1): BMD 2.0"),
    "concave": (lambda d: 0.02 * np.sqrt(d / 0.5), "0.02·sqrt(d / 0.5), steeper than any family at 0: BMD 0.5"),
    "dip": (lambda d: 0.01 * d - 0.03 * d * np.exp(-d / 0.3), "a dip to −1 % near 0.3, then 0.01·d: BMD ~2.0"),
}


@dataclass(frozen=True)
class Scenario:
    name: str
    truth: str
    sd: float  # the paired loss's per-run sd on the gain scale
    twin: float  # the twin's share of the paired loss's variance
    seed: float  # the seed effect's share of a perturbed run's variance
    seeds: int = 3
    max_runs: int = 12
    dose_error: float = 0.0  # sd of the log of a level's recorded dose about its true one
    tails: bool = False  # each run's own noise Student-t (3 df) at the same sd


SCENARIOS = [
    Scenario("linear, sd 5 %, twin 0.5", "linear", 0.05, 0.5, 0.45),
    Scenario("hill, sd 5 %, twin 0.25", "hill", 0.05, 0.25, 0.45),
    Scenario("plateau, sd 5 %, twin 0.5", "plateau", 0.05, 0.5, 0.45),
    Scenario("threshold, sd 5 %, twin 0", "threshold", 0.05, 0.0, 0.45),
    Scenario("concave, sd 8 %, twin 0.5", "concave", 0.08, 0.5, 0.0),
    Scenario("dip, sd 8 %, twin 0.25", "dip", 0.08, 0.25, 0.45),
    Scenario("linear, sd 11 %, twin 0.5, GRPO-like", "linear", 0.11, 0.5, 0.0),
    Scenario("hill, sd 11 %, twin 0.5, 5 seeds", "hill", 0.11, 0.5, 0.0, seeds=5),
    # the shipped GRPO budget's own components (recipes/smollm2-135m/calibration/budget-grpo.json: twin share 0.76)
    Scenario("linear, sd 11 %, twin 0.76, GRPO regime", "linear", 0.11, 0.76, 0.0),
    Scenario("linear, sd 5 %, twin 0.5, dose error 15 %", "linear", 0.05, 0.5, 0.45, dose_error=0.15),
    Scenario("linear, sd 5 %, twin 0.5, heavy tails", "linear", 0.05, 0.5, 0.45, tails=True),
]
CHECK_ERROR = 0.14  # a check's relative 90 % half-width on 16 prompts (pair A's KV cache: 0.2035 [0.1742, 0.2336])


def true_bmd(truth: str, tolerance: float = TOLERANCE) -> float:
    """Where the true curve first reaches the tolerance (a fine grid, then bisection)."""
    f = TRUTHS[truth][0]
    grid = np.geomspace(1e-4, 1e4, 20001)
    up = np.flatnonzero(f(grid) >= tolerance)
    if not len(up):
        return math.inf
    lo, hi = (grid[up[0] - 1] if up[0] else 0.0), grid[up[0]]
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if f(mid) >= tolerance else (mid, hi)
    return hi


def _run(sc: Scenario, draw: int, level, seed: int):
    """A synthetic calibration run (the TrainingRunRecord training/runs.py writes), its quality drawn from the
    random-effect model at the level's true dose; its recorded dose is the one `_recorded` gives."""
    from fp8probe.core.records import TrainingRunRecord

    sd_pair = sc.sd * (START - M0)
    s0, s1 = sd_pair * math.sqrt(sc.twin), sd_pair * math.sqrt(1 - sc.twin)
    su = s1 * math.sqrt(sc.seed / (1 - sc.seed)) if sc.seed < 1 else 0.0
    u = np.random.default_rng([7, _index(sc), draw, seed]).normal(0, su)  # the seed's effect
    lv = int(round((level.value or 0.0) * 1e6))
    rng = np.random.default_rng([11, _index(sc), draw, seed, lv])
    sd = s0 if level.kind == "none" else s1
    e = rng.standard_t(3) * sd / math.sqrt(3.0) if sc.tails else rng.normal(0, sd)  # t3's variance is 3
    dose = _dose(level)
    q = M0 + u + e + float(TRUTHS[sc.truth][0](dose)) * (START - M0)
    quality = {"auc": q, "final": q, "plateau": q, "late_improvement": 0.0}
    return TrainingRunRecord(
        objective="opd",
        level=level.name,
        kind=level.kind,
        value=level.value,
        scheme=None,
        seed=seed,
        steps=20,
        seconds=0.0,
        mismatch={"kl_q_p": dose, "k3": dose, "tokens": 128},
        quality_start={"reverse_kl": START, "teacher_logp": 0.0},
        quality_end={"reverse_kl": q, "teacher_logp": 0.0},
        quality=quality,
        losses=[],
    )


def _index(sc: Scenario) -> int:
    """The scenario's place in SCENARIOS (its random streams' key), or a CRC of its fields for one made elsewhere (not
    Python's hash(): salted per process, it gave the same scenario other draws in every run)."""
    import zlib

    return SCENARIOS.index(sc) if sc in SCENARIOS else zlib.crc32(repr(sc).encode())


def _recorded(sc: Scenario, draw: int, level) -> float:
    """A level's dose as calibrate records it: the true one, times a lognormal measurement error (`dose_error`)."""
    dose = _dose(level)
    if not sc.dose_error or dose <= 0:
        return dose
    lv = int(round(level.value * 1e6))
    return dose * math.exp(np.random.default_rng([13, _index(sc), draw, lv]).normal(0, sc.dose_error))


def _dose(level) -> float:
    """A noise level's dose: pair A's measured doses, log-log between them (beyond them: the nearest two's slope)."""
    if level.kind != "noise":
        return 0.0
    xs, ys = np.log(list(DOSES)), np.log(list(DOSES.values()))
    x = math.log(level.value)
    i = int(np.clip(np.searchsorted(xs, x), 1, len(xs) - 1))
    return float(math.exp(ys[i - 1] + (x - xs[i - 1]) * (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])))


def one_draw(args) -> dict:
    """One calibration from scratch: whether its interval holds the true BMD, which end missed it, and the verdicts
    (admission.judge on the noise ruler) of configurations at half and twice the true BMD, measured with the check's
    error about them."""
    from fp8probe.budget.admission import judge
    from fp8probe.training.experiment import Experiment, Ladder
    from fp8probe.training.settings import TrainSettings

    sc, draw, bootstrap, stop_rule = args[:4]
    check_error = args[4] if len(args) > 4 else CHECK_ERROR
    cal = Experiment(
        None,
        "synthetic",
        LEVELS,
        sc.seeds,
        TrainSettings(),
        ("a",),
        ("b",),
        max_added=1,
        max_runs=sc.max_runs,
        tolerance=TOLERANCE,
    )
    ladder = Ladder(
        cal,
        lambda o, level, seed: _run(sc, draw, level, seed),
        lambda o, level: {"dose": _recorded(sc, draw, level)},
        bootstrap=bootstrap,
    )
    if stop_rule == "narrow":
        ladder = _NarrowStop(cal, ladder)
    t = time.perf_counter()
    df, budget, added = ladder.objective("opd")
    noise = budget.dose_response["rulers"]["noise"] if budget.dose_response else {}
    lo, hi = budget.interval if budget.interval else (math.nan, math.nan)
    truth = true_bmd(sc.truth)
    top = float(noise.get("scale", math.nan))
    open_high = budget.censored or budget.interval_censored
    covered = bool(lo <= truth and (truth <= hi or (open_high and truth >= hi)))
    verdicts = {}
    for name, d in (("half", truth / 2), ("twice", truth * 2)):
        at = (d * (1 - check_error), d * (1 + check_error))
        verdicts[name] = judge(d, at, budget, 16, ("noise",)).verdict if math.isfinite(d) else None
    return {
        "scenario": sc.name,
        "draw": draw,
        "covered": covered,
        "missed_low": bool(truth < lo),
        "missed_high": bool(truth > hi and not open_high),
        "admit_at_half": verdicts["half"] == "ADMIT",
        "reject_at_twice": verdicts["twice"] == "REJECT",
        "bmd": budget.value,
        "interval": [lo, hi],
        "open_high": open_high,
        "truth": truth,
        "top": top,
        "method": budget.method,
        "runs": len(df),
        "pairing": (noise.get("response") or {}).get("pairing"),
        "low_from": noise.get("low_from"),
        "high_from": noise.get("high_from"),
        "seconds": time.perf_counter() - t,
    }


class _NarrowStop:
    """The old stop rule, for the comparison: stop allocating once BMDU / BMDL <= 3 (optional stopping)."""

    def __init__(self, cal, ladder):
        self.ladder = ladder
        original = ladder.fit

        def fit(df):
            b = original(df)
            if b.interval and b.interval[0] > 0 and b.interval[1] / b.interval[0] <= 3:
                ladder.c = replace(ladder.c, max_runs=0)  # the allocation's loop ends on its next check
            return b

        ladder.fit = fit

    def objective(self, objective):
        return self.ladder.objective(objective)


def clopper_pearson(k: int, n: int, level: float = 0.90) -> tuple[float, float]:
    from scipy.stats import beta

    a = (1 - level) / 2
    lo = float(beta.ppf(a, k, n - k + 1)) if k > 0 else 0.0
    hi = float(beta.ppf(1 - a, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory: draws.jsonl (resumed), coverage.json")
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bootstrap", type=int, default=300)
    ap.add_argument("--scenarios", nargs="*", default=None, help="names (a prefix matches); default: all")
    ap.add_argument("--stop-rule", choices=("budget", "narrow"), default="budget")
    ap.add_argument("--check-error", type=float, default=CHECK_ERROR, help="a check's relative 90 %% half-width")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"draws-{args.stop_rule}.jsonl"
    done = (
        {(d["scenario"], d["draw"]) for d in map(json.loads, log.read_text().splitlines())} if log.exists() else set()
    )
    chosen = [s for s in SCENARIOS if not args.scenarios or any(s.name.startswith(p) for p in args.scenarios)]
    todo = [
        (s, k, args.bootstrap, args.stop_rule, args.check_error)
        for k in range(args.draws)
        for s in chosen
        if (s.name, k) not in done
    ]
    print(f"{len(todo)} draws to run ({len(done)} done), {args.workers} workers, {args.bootstrap} bootstrap draws")
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool, log.open("a") as f:
        for i, r in enumerate(pool.map(one_draw, todo, chunksize=1)):
            f.write(json.dumps(r) + "\n")
            f.flush()
            if (i + 1) % 20 == 0:
                print(f"  {i + 1}/{len(todo)} in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    report(log, out / f"coverage-{args.stop_rule}.json", args.bootstrap, args.stop_rule)


def report(log: Path, path: Path, bootstrap: int, stop_rule: str) -> None:
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    table = []
    print(f"\ncoverage of the 90 % interval, stop rule {stop_rule}, {bootstrap} bootstrap draws per fit:")
    print(
        f"{'scenario':<44} {'true BMD':>9} {'draws':>6} {'coverage':>9} {'90 % CP':>16} {'low miss':>9} "
        f"{'high miss':>9} {'ADMIT @½':>9} {'REJECT @2':>9} {'median width':>13}"
    )
    for sc in SCENARIOS:
        r = [x for x in rows if x["scenario"] == sc.name]
        if not r or "missed_low" not in r[0]:
            continue
        k, n = sum(x["covered"] for x in r), len(r)
        lo, hi = clopper_pearson(k, n)
        rates = {
            key: sum(x[key] for x in r) for key in ("missed_low", "missed_high", "admit_at_half", "reject_at_twice")
        }
        widths = [x["interval"][1] / x["interval"][0] for x in r if x["interval"][0] > 0 and not x["open_high"]]
        width = float(np.median(widths)) if widths else math.nan
        table.append(
            {
                "scenario": sc.name,
                "truth": sc.truth,
                "true_bmd": true_bmd(sc.truth),
                "note": TRUTHS[sc.truth][1],
                "sd": sc.sd,
                "twin_share": sc.twin,
                "seed_share": sc.seed,
                "seeds": sc.seeds,
                "max_runs": sc.max_runs,
                "draws": n,
                "covered": k,
                "coverage": k / n,
                "clopper_pearson_90": [lo, hi],
                "median_width": width,
                "open_high": sum(x["open_high"] for x in r),
                "median_seconds": float(np.median([x["seconds"] for x in r])),
                "dose_error": sc.dose_error,
                "tails": sc.tails,
                **{f"{key}_rate": v / n for key, v in rates.items()},
                **{f"{key}_cp90": list(clopper_pearson(v, n)) for key, v in rates.items()},
                "median_bmd_over_truth": float(np.median([x["bmd"] / x["truth"] for x in r])),
            }
        )
        print(
            f"{sc.name:<44} {true_bmd(sc.truth):>9.3g} {n:>6} {k / n:>9.3f} [{lo:.3f}, {hi:.3f}] "
            + " ".join(f"{rates[key] / n:>9.3f}" for key in rates)
            + f" {width:>12.3g}x"
        )
    path.write_text(
        json.dumps(
            {
                "stop_rule": stop_rule,
                "bootstrap": bootstrap,
                "tolerance": TOLERANCE,
                "levels": LEVELS,
                "doses": DOSES,
                "scenarios": table,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
