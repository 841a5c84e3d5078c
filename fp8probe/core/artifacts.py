"""Every versioned file fp8probe writes, in one table: the schema version each is written and read with.

    file                 version  written by                        read back by
    rollouts.json        1        model/rollouts.py (and .safetensors)  load_rollouts
    run.json             1        sweeps/files.py (a sweep)         read_sweep
    recipe.json          3        recipe/recipe.py                  read_recipe (beside recipe.yaml; also 1, 2)
    budget.json          4        budget/fit.py                     read_budget (also 1, 2, 3)
    agreement.json       1        recipe/agreement.py               plots
    capacity.json        1        deploy/capacity.py                plots
    mismatch.json        1        apps/measure.py (measure)         -
    ladder.json          1        apps/ladder.py (ladder)           -
    check.json           2        budget/admission.py (check)       plots
    calibrate.json       3        training/experiment.py (and each run's run.json, training/runs.py)  calibrate --resume
    plan.json            1        apps/plan.py (plan; plan.csv beside it)  plots
    audit.json           1        deploy/audit.py (audit)           -
    series.json          1        apps/series.py (check --checkpoints)  -
    student.json         1        deploy/export.py (beside the checkpoint)  apps/audit.py (the student to audit against)

recipe.json is at 2: form, target, kv_scale, memory_target, fp8_share, effective_bits and the search's moves; at 3
`measured` is the held-out prompts' value (measured_search the search set's, measured_interval, split), and a move
of the search has an `outcome` (taken, not better, noise, probe).
budget.json is at 2: paired, levels (each level's loss, interval and fit), seed_spread; at 3 the value and interval
are the benchmark dose of a dose–response fit (`method`, `dose_response`: families, fits, curves, predictions), or
the isotonic fit where no family fits; a level holds both fits (`fitted`, `isotonic`). At 4 the loss is `response`
(gain: the share of the training gain lost; relative before), the seed a random effect in the interval, and the
budget names its `student` and `teacher` (name, sha256), `objective` and `dose` (what `mismatch` measured), its
`censored` and `interval_censored` ends and the `kinds` run as levels with their own loss.
calibrate.json is at 2: objectives, tolerance, quality, bracket, max_added, added_levels; runs under runs/<objective>/.
At 3: `response`, the levels' `dose` on check's scale (`dose_mapping` beside the run-mean KL), no target_ratio
(the allocation's stop rule is its preset budget); a resume reads 2.
check.json is at 2: the verdict may be UNCERTAIN; measured_interval, interval_level, prompts_to_decide, num_prompts.
Readers go through read_artifact (the plots, read_budget, the calibration's learning curves; read_sweep,
load_rollouts and calibrate --resume check their own files with their own lines), which refuses a version not listed
here or in ALSO_READ. An optional field that readers default may be added within a version (rollouts.json's
sampling.samples_per_prompt, default 1; the `arithmetic` record). Changing what a file holds otherwise means a new
version here, and a reader that refuses the old one in one line (or reads it, as read_recipe reads version 1).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

from .errors import FP8ProbeError

SCHEMAS = {
    "rollouts.json": 1,
    "run.json": 1,
    "recipe.json": 3,
    "audit.json": 1,
    "series.json": 1,
    "budget.json": 4,
    "agreement.json": 1,
    "capacity.json": 1,
    "mismatch.json": 1,
    "ladder.json": 1,
    "check.json": 2,
    "calibrate.json": 3,
    "plan.json": 1,
    "student.json": 1,
}


# the older versions each reader still takes (read_recipe reads 1 and 2; read_budget 1, 2 and 3)
ALSO_READ = {"recipe.json": (1, 2), "budget.json": (1, 2, 3), "calibrate.json": (2,)}


def version(kind: str) -> int:
    """The schema version `kind` (a file name of SCHEMAS) is written with."""
    if kind not in SCHEMAS:
        raise FP8ProbeError(f"internal: {kind} is not a versioned artifact")
    return SCHEMAS[kind]


def stamped(kind: str, doc: dict) -> dict:
    """`doc` with its schema version first, as every versioned JSON file starts."""
    return {"schema_version": version(kind), **doc}


def read_artifact(kind: str, path, redo: str) -> dict:
    """The versioned JSON file of `kind` at `path`, read and checked: one that is missing, not JSON, not an object, or
    of a schema version this fp8probe does not read (SCHEMAS, ALSO_READ) fails in one line that says what to do
    (`redo`). The readers the module's docstring names go through here."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise FP8ProbeError(f"no {kind} at {p}: {redo}") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FP8ProbeError(f"{p} is not a readable {kind} ({type(e).__name__}: {e}): {redo}") from e
    got = doc.get("schema_version") if isinstance(doc, dict) else None
    if got != version(kind) and got not in ALSO_READ.get(kind, ()):
        raise FP8ProbeError(f"{p} has schema_version {got!r}; this fp8probe reads {kind} {version(kind)}: {redo}")
    return doc


def versions() -> dict:
    """The versions a run was made with (run.json, mismatch.json, ladder.json)."""
    import torch
    import transformers

    from .. import __version__

    return {"fp8probe": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


# how every measurement lays out its arithmetic (Rollouts.batches); the words stored beside the batch size
BATCHING = "batch_size sequences at a time in rollout order, each batch cut to its longest sequence"


def arithmetic(batch_size: int) -> dict:
    """The arithmetic a measurement ran in, stated beside its figures (run.json, mismatch.json, ladder.json,
    check.json, plan.json). Another batch composition pads to other lengths and moves the GEMMs' last fp32 bits, and
    an FP8 code on a rounding boundary flips: the figure moves within its interval (docs/numerics.md, "The arithmetic
    a measurement ran in"). The thread count is recorded too (measured: it did not move any figure on this CPU)."""
    import torch

    return {"batch_size": int(batch_size), "batching": BATCHING, "torch_threads": torch.get_num_threads()}
