"""fp8probe against NVIDIA ModelOpt's auto_quantize, at equal bytes saved, with one evaluator.

    python benchmarks/vs_modelopt.py [--sweep runs/smollm2-exact] [--effective-bits 12] [--refine 16]

1. ModelOpt, in its own venv (~/.cache/fp8probe/modelopt-venv, made on first use: nvidia-modelopt with a
   transformers it accepts, on the CPU torch wheel), runs auto_quantize on the embedded student with the
   student's own rollouts (modelopt_worker.py), in its kl_div and gradient modes, FP8_DEFAULT_CFG or BF16
   per layer group, lm_head disabled, at --effective-bits.
2. fp8probe sweeps the same rollouts with the same kind of FP8 (scheme FP8: per-tensor weights and static
   per-tensor inputs calibrated on the rollouts, as FP8_DEFAULT_CFG is), per fused group, then chooses a
   recipe that saves at least the bytes of each ModelOpt recipe (`recipe --min-bytes-saved`), refined.
3. One evaluator for every recipe: fp8probe.measurement.measure with scheme FP8 on the same tokens against the same
   reference: mean per-token KL(q||p). Printed: each recipe's KL, fp8probe's KL / ModelOpt's, wall times.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from fp8probe import load_rollouts, load_student, measure
from fp8probe.cli import main as cli
from fp8probe.measurement.reference import Reference
from fp8probe.model.embedded import embedded_student_dir
from fp8probe.recipe.selection import MemoryTarget, group_scores, linear_params, make_recipe
from fp8probe.sweeps.files import read_sweep

VENV = Path.home() / ".cache" / "fp8probe" / "modelopt-venv"
WORKER = Path(__file__).with_name("modelopt_worker.py")


def modelopt_python() -> Path:
    py = VENV / "bin" / "python"
    if not (VENV / ".ready").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + ["torch==2.13.0"], check=True)
        subprocess.run(pip + ["nvidia-modelopt", "transformers<5.15", "requests", "accelerate", "safetensors"], check=True)
        (VENV / ".ready").touch()
    return py


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", default="runs/smollm2-exact",
                    help="a sweep dir of the embedded student (its rollouts; `fp8probe sweep --out runs/smollm2-exact`)")
    ap.add_argument("--effective-bits", type=float, default=12.0)
    ap.add_argument("--refine", type=int, default=16)
    ap.add_argument("--out", default="runs/vs-modelopt")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rollouts = load_rollouts(args.sweep)
    tokens = out / "tokens.pt"
    torch.save({"input_ids": rollouts.input_ids, "attention_mask": rollouts.attention_mask,
                "response_mask": rollouts.response_mask}, tokens)
    py = modelopt_python()
    mo = {}
    for method in ("kl_div", "gradient"):
        res = out / f"modelopt-{method}.json"
        if not res.exists():
            subprocess.run([str(py), str(WORKER), str(embedded_student_dir()), str(tokens), method,
                            str(args.effective_bits), str(res)], check=True)
        mo[method] = json.loads(res.read_text())

    sweep_dir = out / "sweep-fp8"
    t = time.perf_counter()
    if not (sweep_dir / "sensitivity.csv").exists():
        assert cli(["-q", "sweep", "--rollouts", args.sweep, "--scheme", "FP8", "--granularity", "group", "--no-kv",
                    "--out", str(sweep_dir)]) == 0
    run = read_sweep(sweep_dir)
    t_sweep = run.run["seconds"]["reference"] + run.run["seconds"]["sweep"]
    student = load_student()
    reference = Reference(student, rollouts)
    groups = {g.group: g for g in group_scores(run.table, "kl_q_p", {g: [u.name for u in us]
                                                                      for g, us in student.groups().items()})}
    unit_group = {u.name: u.group for u in student.quantizable}

    def evaluate(units):
        return measure(student, rollouts, "FP8", units=units, reference=reference)["kl_q_p"]

    total = linear_params(student)  # effective bits as ModelOpt counts them: every Linear, lm_head included
    print(f"embedded student, {rollouts.num_sequences} rollouts, {rollouts.num_response_tokens} response tokens; "
          f"FP8 per-tensor (FP8_DEFAULT_CFG / scheme FP8); one evaluator: mean per-token KL(q||p)")
    print(f"{'recipe':<34}{'groups FP8':>11}{'MiB saved':>11}{'eff. bits':>10}{'KL(q||p)':>11}{'time s':>9}")
    for method, res in mo.items():
        chosen = sorted({unit_group[n] for n in res["fp8_modules"] if n in unit_group})
        units = [u for g in chosen for u in groups[g].units]
        saved = sum(groups[g].bytes_saved for g in chosen)
        bits = 16 - 8 * sum(groups[g].params for g in chosen) / total
        kl_mo = evaluate(units)
        print(f"{'ModelOpt ' + method:<34}{len(chosen):>11}{saved / 2**20:>11.2f}{bits:>10.2f}{kl_mo:>11.5f}"
              f"{res['seconds']:>9.0f}")
        for passes in (0, args.refine):
            t0 = time.perf_counter()
            rec = make_recipe(run.table, None, student, rollouts, scheme="FP8", reference=reference,
                              memory=MemoryTarget("bytes_saved", saved), refine_passes=passes)
            t_rec = time.perf_counter() - t0
            kl_fp = evaluate([n for g in rec.quantized for n in groups[g].units])
            name = f"fp8probe, same bytes{', refined' if passes else ''}"
            print(f"{name:<34}{len(rec.quantized):>11}{rec.bytes_saved / 2**20:>11.2f}{rec.effective_bits:>10.2f}"
                  f"{kl_fp:>11.5f}{t_sweep + t_rec:>9.0f}   ratio {kl_fp / kl_mo:.3f}x ModelOpt {method}")
    print(f"fp8probe time = its sweep ({t_sweep:.0f} s: reference + {len(run.table) - 2} group rows) + the recipe "
          f"search; ModelOpt time = auto_quantize (calibration, scores, search); model loading excluded for both "
          f"({time.perf_counter() - t:.0f} s in all here)")


if __name__ == "__main__":
    main()
