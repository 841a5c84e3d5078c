"""CI's check of the README's first command: what it printed and what it wrote, not only that files exist.

    python .ci/check_quickstart.py RUN_DIR STDOUT_FILE

The embedded student (SmolLM2-135M: 30 blocks of 7 Linear units, 30 KV-cache layers) swept with --method auto:
243 rows (210 units, 30 KV layers, 3 whole-model rows); `method` is exact for the 24 highest estimates, the 8
controls and the 3 whole-model rows (35), fisher for the other 208. The printed block holds the ten rows with
the highest kl_q_p of sensitivity.csv, every one of them measured, then the two whole-model lines and the summary.
Plain Python and the standard library: it runs in the venv `scripts/setup` made.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

UNITS, KV, WHOLE, TOP_K, CONTROLS = 210, 30, 3, 24, 8


def fail(msg: str) -> None:
    print(f"check_quickstart: {msg}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    run, out = Path(sys.argv[1]), Path(sys.argv[2]).read_text()
    with open(run / "sensitivity.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    kinds = [r["kind"] for r in rows]
    if len(rows) != UNITS + KV + WHOLE or kinds.count("kv") != KV or kinds.count("model") != WHOLE:
        fail(
            f"sensitivity.csv has {len(rows)} rows ({kinds.count('kv')} kv, {kinds.count('model')} model); "
            f"expected {UNITS + KV + WHOLE} ({KV} kv, {WHOLE} model)"
        )
    methods = {m: sum(r["method"] == m for r in rows) for m in {r["method"] for r in rows}}
    want = {"exact": TOP_K + CONTROLS + WHOLE, "fisher": UNITS + KV - TOP_K - CONTROLS}
    if methods != want:
        fail(f"method counts {methods}, expected {want}")
    if any(r["method"] != "exact" for r in rows if r["kind"] == "model"):
        fail("a whole-model row was not measured")
    lines = out.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("ten most sensitive rows"))
    except StopIteration:
        fail("the output has no 'ten most sensitive rows' block")
    header = lines[start + 1].split()
    if header != ["unit", "kind", "method", "kl_q_p", "k3", "top1_agree", "sqnr_db"]:
        fail(f"the block's columns are {header}")
    printed = [ln.split() for ln in lines[start + 2 : start + 12]]
    top = sorted((r for r in rows if r["kind"] != "model"), key=lambda r: -float(r["kl_q_p"]))[:10]
    if [p[0] for p in printed] != [r["unit"] for r in top]:
        fail(f"the block lists {[p[0] for p in printed]}, the table's ten highest are {[r['unit'] for r in top]}")
    if any(p[2] != "exact" for p in printed):
        fail("a row of the block was not measured")
    for p, r in zip(printed, top):
        if abs(float(p[3]) - float(r["kl_q_p"])) > 0.0051 * float(r["kl_q_p"]):  # printed to 3 digits
            fail(f"{p[0]}: printed kl_q_p {p[3]}, the table holds {r['kl_q_p']}")
    rest = lines[start + 12 :]
    if not (
        len(rest) >= 3
        and rest[0].startswith("model.fp8_all: kl_q_p=")
        and rest[1].startswith("model.fp8_all_kv: kl_q_p=")
        and rest[-1].startswith(f"sweep: {len(rows)} rows in ")
    ):
        fail(f"the lines after the block are {rest}")
    print(f"check_quickstart: {len(rows)} rows, {methods['exact']} measured, the printed ten are the table's ten")


if __name__ == "__main__":
    main()
