"""The path sweep, `sweep --method path` until it left the package (docs/modelopt.md: no better than the fisher
default at any size of search measured on either student): every weight row's path attribution from BF16 to every
weight row in FP8 (attribution.py, beside this file), each row priced with the others partly in FP8, written as a
sweep directory that `fp8probe recipe` reads.

    python benchmarks/path_sweep.py SWEEP OUT [--nodes 2] [--model smollm2-135m]

SWEEP: a sweep of the student per fused group, by any method (its rollouts, rows and settings); OUT gets the same
rows with every weight row's kl_q_p and kl_fisher its path share and method "path" (the whole-model and KV-cache rows,
not on the path, as SWEEP has them), its rollouts, and run.json with method {"method": "path", "nodes": N} and the
seconds of the reference pass and of the attribution ("sweep": their sum; loading excluded).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from pathlib import Path

from attribution import path_attribution  # beside this file

from fp8probe.core.errors import FP8ProbeError
from fp8probe.core.schemes import Scheme
from fp8probe.measurement.reference import Reference
from fp8probe.model.rollouts import load_rollouts
from fp8probe.sweeps.files import read_sweep, write_run, write_table

NODES = 2  # the nodes `sweep --method path` used by default


def path_sweep(student, sweep_dir, out, nodes: int = NODES):
    """OUT (a new directory) as the path sweep of `sweep_dir`'s rollouts (module docstring); returns read_sweep(out).
    Refused, before any pass or output: a table with a row per unit (not per fused group), a MoE student (experts
    are not on the path: attribution.py scales the dense Linears' weights)."""
    src, out = read_sweep(sweep_dir), Path(out)
    df = src.table.copy()
    on_path = ~df["kind"].isin(["model", "kv"])
    if (df.loc[on_path, "kind"] == "expert").any():
        raise FP8ProbeError("the path sweep does not cover MoE experts")
    if df.loc[on_path, "group"].duplicated().any() or src.run.granularity != "group":
        raise FP8ProbeError(f"{sweep_dir}: the path sweep prices fused groups; give a sweep with --granularity group")
    if out.exists():
        raise FP8ProbeError(f"{out} exists: give a new directory")
    groups = student.groups()
    members = {g: [u.name for u in groups[g]] for g in df.loc[on_path, "group"]}
    rollouts = load_rollouts(sweep_dir)
    batch_size = src.run.batch_size
    t0 = time.perf_counter()
    reference = Reference(student, rollouts, batch_size)
    t_ref = time.perf_counter() - t0
    att = path_attribution(student, rollouts, reference, members, Scheme.from_name(src.run.scheme), nodes, batch_size)
    shares = df.loc[on_path, "group"].map(att.shares)
    df.loc[on_path, "kl_q_p"] = shares
    df.loc[on_path, "kl_fisher"] = shares
    df.loc[on_path, "method"] = "path"
    out.mkdir(parents=True)
    for name in ("rollouts.json", "rollouts.safetensors"):
        shutil.copy2(Path(sweep_dir) / name, out / name)
    write_table(out, df)
    seconds = {"reference": round(t_ref, 3), "path": round(att.seconds, 3), "sweep": round(t_ref + att.seconds, 3)}
    write_run(out, dataclasses.replace(src.run, method={"method": "path", "nodes": nodes}, seconds=seconds))
    return read_sweep(out)


def main():
    from fp8probe import load_student

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", help="a sweep directory per fused group (its rollouts and rows)")
    ap.add_argument("out", help="a new directory for the path sweep")
    ap.add_argument("--nodes", type=int, default=NODES, help="Gauss-Legendre nodes: one forward and backward each")
    ap.add_argument("--model", default=None, help="the student (default: the sweep's)")
    args = ap.parse_args()
    student = load_student(args.model or read_sweep(args.sweep).model_source)
    run = path_sweep(student, args.sweep, args.out, args.nodes)
    print(f"path sweep: {len(run.table)} rows in {run.run.seconds['sweep']:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
