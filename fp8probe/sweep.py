"""The one-unit-at-a-time sweep: put one unit (or fused group, or one layer's KV cache) in FP8, score it.

For every row the mismatch metrics of mismatch.py are measured on the student's own rollouts against
the reference pass, reusing the reference's prefix (reference.py): a unit in block b costs the blocks
b..L-1 plus the lm_head on response positions, not a whole forward. Rows:

    one per unit (granularity="unit") or per fused group ("group"), kind q/k/v/o/gate/up/down/expert/...
    one per attention layer, kind "kv": that layer's KV cache in FP8 (include_kv=True)
    model.fp8_all        kind "model": every unit in FP8 (the usual "all but lm_head" recipe)
    model.fp8_all_kv     kind "model": the same plus an FP8 KV cache in every layer (include_kv=True)
    model.reference      kind "model": the reference against itself; exactly 0 or the sweep is broken

Results are appended to sensitivity.partial.csv after each row, so a killed sweep resumes where it
stopped (`resume=True`) and ends with the same table as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from .errors import FP8ProbeError
from .fp8 import KVCacheScheme, Scheme, num_scales
from .hooks import quantize_kv, quantize_units
from .mismatch import METRICS, summarize
from .reference import Reference
from .student import _is_experts

log = logging.getLogger(__name__)

COLUMNS = ["unit", "kind", "block", "group", "params", "bytes_saved", "kv_bytes_saved_per_token", "sqnr_db", *METRICS]
PARTIAL = "sensitivity.partial.csv"
PARTIAL_SETTINGS = "sweep.partial.json"


@dataclass
class Row:
    unit: str
    kind: str
    block: int
    group: str
    params: int
    bytes_saved: int
    kv_bytes_saved_per_token: int
    start_block: int
    members: list[str] = field(default_factory=list)  # unit names to quantize; empty for kv rows
    kv_layers: list[int] = field(default_factory=list)


def plan_rows(student, scheme: Scheme, granularity: str = "unit", include_kv: bool = True) -> list[Row]:
    """Every row the sweep will measure, in output order (block, then model order; model rows last)."""
    if granularity not in ("unit", "group"):
        raise FP8ProbeError(f"unknown granularity {granularity!r}; supported: unit, group")
    units = student.quantizable
    rows: list[Row] = []
    if granularity == "unit":
        for u in units:
            rows.append(Row(u.name, u.kind, u.block, u.group, u.params, _bytes_saved(u, scheme), 0, u.block, [u.name]))
    else:
        for g, us in student.groups().items():
            kind = "_".join(u.kind for u in us) if len(us) > 1 else us[0].kind
            kind = {"q_k_v": "qkv", "gate_up": "gate_up"}.get(kind, kind)
            rows.append(Row(g, kind, us[0].block, g, sum(u.params for u in us),
                            sum(_bytes_saved(u, scheme) for u in us), 0, us[0].block, [u.name for u in us]))
    if include_kv:
        cfg = student.model.config
        per_tok = _kv_bytes_per_token_layer(cfg)
        n_layers = cfg.num_hidden_layers
        for i in range(n_layers):
            name = f"model.layers.{i}.self_attn.kv_cache"
            rows.append(Row(name, "kv", i, name, 0, 0, per_tok, i, [], [i]))
    rows.sort(key=lambda r: r.block)  # stable: model order within a block, kv after the block's units
    all_units = [u.name for u in units]
    total_saved = sum(_bytes_saved(u, scheme) for u in units)
    total_params = sum(u.params for u in units)
    rows.append(Row("model.fp8_all", "model", -1, "model", total_params, total_saved, 0, 0, all_units))
    if include_kv:
        n = student.model.config.num_hidden_layers
        rows.append(Row("model.fp8_all_kv", "model", -1, "model", total_params, total_saved,
                        n * _kv_bytes_per_token_layer(student.model.config), 0, all_units, list(range(n))))
    rows.append(Row("model.reference", "model", -1, "model", 0, 0, 0, 0, []))
    return rows


def _kv_bytes_per_token_layer(cfg) -> int:
    """BF16 -> FP8 KV saves one byte per element: K and V, kv_heads x head_dim each."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return 2 * kv_heads * head_dim


def _bytes_saved(unit, scheme: Scheme) -> int:
    """BF16 (2 bytes) -> FP8 (1 byte) per weight, minus the BF16 scales the checkpoint adds."""
    shape = unit.shape
    mats = shape[0] if len(shape) == 3 else 1
    if unit.kind == "expert":  # gate_up [E, 2I, H] and down [E, H, I]
        e, two_i, h = shape
        scales = e * (num_scales((two_i, h), scheme.weight) + num_scales((h, two_i // 2), scheme.weight))
    else:
        scales = mats * num_scales(shape[-2:], scheme.weight)
    return unit.params - 2 * scales


# ---------------------------------------------------------------------------------------------------
# SQNR of the perturbed unit's own output (torchao's definition), a cheap local second view


class _Energy:
    def __init__(self):
        self.signal = 0.0
        self.noise = 0.0

    def add(self, ref, approx):
        ref = ref.float()
        self.signal += float(ref.pow(2).sum())
        self.noise += float((ref - approx.float()).pow(2).sum())

    @property
    def db(self) -> float:
        if self.noise == 0:
            return math.inf
        return 10 * math.log10(self.signal / self.noise) if self.signal > 0 else -math.inf


@contextlib.contextmanager
def _observe_outputs(model: nn.Module, names: list[str], energy: _Energy):
    """Compare each named unit's output with what its original weights give on the same input."""
    handles = []
    try:
        for n in names:
            mod = model.get_submodule(n)
            if isinstance(mod, nn.Linear):
                w, b = mod.weight.data, mod.bias
                box = {}
                handles.append(mod.register_forward_pre_hook(lambda m, a, box=box: box.__setitem__("x", a[0]),
                                                             prepend=True))
                handles.append(mod.register_forward_hook(
                    lambda m, a, out, box=box, w=w, b=b: energy.add(nn.functional.linear(box.pop("x"), w, b), out)))
            elif _is_experts(mod):
                handles.append(mod.register_forward_hook(
                    lambda m, a, out: energy.add(type(m).forward(m, *a), out)))
        yield
    finally:
        for h in handles:
            h.remove()


def _kv_observer(energy: _Energy):
    def observe(k, kq, v, vq):
        energy.add(k, kq)
        energy.add(v, vq)
    return observe


# ---------------------------------------------------------------------------------------------------
# the sweep


def measure_row(ref: Reference, student, row: Row, scheme: Scheme, kv: KVCacheScheme) -> dict:
    model = student.model
    energy = _Energy()
    with contextlib.ExitStack() as stack:
        if row.members:
            stack.enter_context(_observe_outputs(model, row.members if row.kind != "model" else [], energy))
            stack.enter_context(quantize_units(model, row.members, scheme, calibration=ref.calibration))
        if row.kv_layers:
            obs = _kv_observer(energy) if row.kind == "kv" else None
            stack.enter_context(quantize_kv(model, row.kv_layers, kv, calibration=ref.calibration, observer=obs))
        metrics = summarize(ref.candidate_stats(row.start_block))
    out = {"unit": row.unit, "kind": row.kind, "block": row.block, "group": row.group, "params": row.params,
           "bytes_saved": row.bytes_saved, "kv_bytes_saved_per_token": row.kv_bytes_saved_per_token,
           "sqnr_db": energy.db if row.kind != "model" else float("nan")}
    out.update(metrics)
    return out


def sweep(student, rollouts, scheme="FP8_DYNAMIC", granularity: str = "unit", include_kv: bool = True,
          kv="fp8", batch_size: int = 8, progress: bool = False, out_dir: str | Path | None = None,
          resume: bool = False, reference: Reference | None = None):
    """Measure every row of plan_rows(); returns a pandas DataFrame with COLUMNS.

    With out_dir, each finished row is appended to out_dir/sensitivity.partial.csv; with resume=True,
    rows already there are not measured again (the settings must match).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from ._files import bar_interval as _bar_interval

    scheme = Scheme.from_name(scheme)
    kv = KVCacheScheme.from_name(kv)
    rows = plan_rows(student, scheme, granularity, include_kv)
    done: dict[str, dict] = {}
    writer = None
    if out_dir is not None:
        settings = _settings(student, rollouts, scheme, granularity, include_kv, kv, batch_size)
        done = _open_partial(Path(out_dir), settings, resume)
        writer = _PartialWriter(Path(out_dir), settings)
    if reference is None:
        reference = Reference(student, rollouts, batch_size, kv_strategy=kv.strategy)
    todo = [r for r in rows if r.unit not in done]
    bar = tqdm(total=len(rows), initial=len(rows) - len(todo), desc="sweep", unit="row", disable=not progress, mininterval=_bar_interval())
    try:
        for row in todo:
            bar.set_postfix_str(row.unit[-32:], refresh=False)
            result = measure_row(reference, student, row, scheme, kv)
            if row.kind == "model" and row.unit == "model.reference":
                bad = {k: v for k, v in result.items() if k in METRICS and k not in ("token_mult_prob_error", "top1_agree") and v != 0}
                if bad or result["top1_agree"] != 1 or result["token_mult_prob_error"] != 1:
                    raise RuntimeError(f"reference against itself is not 0: {bad}; this is a bug in fp8probe")
            done[row.unit] = result
            if writer:
                writer.append(result)
            bar.update(1)
    finally:
        bar.close()
        if writer:
            writer.close()
    df = pd.DataFrame([done[r.unit] for r in rows], columns=COLUMNS)
    df.attrs["reference_seconds"] = reference.seconds
    return df


def _settings(student, rollouts, scheme, granularity, include_kv, kv, batch_size) -> dict:
    import hashlib

    h = hashlib.sha256()
    for t in (rollouts.input_ids, rollouts.attention_mask, rollouts.response_mask):
        h.update(t.contiguous().numpy().tobytes())
    from . import __version__

    return {"fp8probe_version": __version__, "model": student.name, "scheme": scheme.name, "granularity": granularity, "include_kv": include_kv,
            "kv": {"fmt": kv.fmt, "strategy": kv.strategy, "scale": kv.scale}, "batch_size": batch_size,
            "rollouts_sha256": h.hexdigest(), "dtype": str(next(student.model.parameters()).dtype)}


def check_resume_state(out: Path, resume: bool) -> dict | None:
    """The settings of the unfinished sweep in `out` (None when there is none), if it can be resumed by this
    fp8probe; refuses an unfinished sweep without --resume, and one written by another version."""
    part, sfile = out / PARTIAL, out / PARTIAL_SETTINGS
    if not part.exists():
        return None
    if not resume:
        raise FP8ProbeError(f"{out} holds an unfinished sweep; pass --resume to continue it, or choose another --out")
    from . import __version__

    try:
        old = json.loads(sfile.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FP8ProbeError(f"--resume: {sfile} is missing or unreadable ({e}); start the sweep again in an empty "
                            "--out") from e
    if not isinstance(old, dict):
        raise FP8ProbeError(f"--resume: {sfile} is not a JSON object; start the sweep again in an empty --out")
    if old.get("fp8probe_version") != __version__:
        raise FP8ProbeError(f"--resume: the saved sweep in {out} was made by fp8probe "
                            f"{old.get('fp8probe_version', 'older than 0.1.1')}, this is {__version__}; "
                            "start a new sweep in another --out")
    return old


def _open_partial(out: Path, settings: dict, resume: bool) -> dict[str, dict]:
    """Rows already finished in `out` (resume), after checking they were made with the same settings.

    Nothing is written here: the resume state appears with the first finished row (_PartialWriter), so a
    failure before that row leaves no state behind that would have to be resumed.
    """
    old = check_resume_state(out, resume)
    if old is not None:
        if old != settings:
            diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
            raise FP8ProbeError(f"--resume: the saved sweep in {out} was run with other settings ({', '.join(diff)}); "
                                "rerun with the same settings or without --resume")
        return _read_partial(out / PARTIAL)
    (out / PARTIAL_SETTINGS).unlink(missing_ok=True)
    return {}


def _read_partial(path: Path) -> dict[str, dict]:
    """Rows of a partial CSV; a last line cut off by a kill is dropped."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]
    done = {}
    for i, rec in enumerate(csv.DictReader(lines), 2):
        if None in rec or any(rec.get(c) is None for c in COLUMNS):
            continue
        try:
            done[rec["unit"]] = _parse(rec)
        except ValueError as e:
            raise FP8ProbeError(f"--resume: {path}:{i} is not a row fp8probe wrote ({e}); start the sweep again "
                                "without --resume in an empty --out") from e
    # rewrite without the cut-off line, so that appends start on a fresh line
    from ._files import atomic_write_text

    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    for r in done.values():
        w.writerow(_fmt(r))
    atomic_write_text(path, buf.getvalue())
    return done


def _parse(rec: dict) -> dict:
    out = {}
    for c in COLUMNS:
        v = rec[c]
        out[c] = v if c in ("unit", "kind", "group") else (int(v) if c in ("block", "params", "bytes_saved",
                                                                           "kv_bytes_saved_per_token") else float(v))
    return out


def _fmt(r: dict) -> dict:
    return {c: (repr(float(r[c])) if isinstance(r[c], float) else r[c]) for c in COLUMNS}


class _PartialWriter:
    """Appends one CSV row at a time and makes it durable (fsync) before the next row starts.

    The file (and the settings it must be resumed with) is created with the first row.
    """

    def __init__(self, out: Path, settings: dict):
        self.path, self.settings_path, self.settings = out / PARTIAL, out / PARTIAL_SETTINGS, settings
        self.f = None

    def append(self, row: dict):
        if self.f is None:
            from ._files import atomic_write_json

            new = not self.path.exists() or self.path.stat().st_size == 0
            if new:
                atomic_write_json(self.settings_path, self.settings)
            self.f = open(self.path, "a", newline="")
            self.w = csv.DictWriter(self.f, fieldnames=COLUMNS)
            if new:
                self.w.writeheader()
        self.w.writerow(_fmt(row))
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self):
        if self.f is not None:
            self.f.close()
