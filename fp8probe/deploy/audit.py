"""Is the engine running the recipe? An exported checkpoint audited against the recipe it was made from.

What users of the RL frameworks run into (issue 39): a wrong MoE layout quantized layers the trainer kept BF16 (verl
PR #7986), calibrated KV-cache scales dropped and replaced by 1.0 on a refit path (NeMo-RL #3225). The audit reads
what an engine reads and checks it against the recipe, one finding per defect:

    membership   the modules the engine will quantize, resolved as vLLM resolves a compressed-tensors checkpoint
                 (its quantization_config's targets and ignore list, matched as vLLM 0.32's
                 compressed_tensors/utils.should_ignore_layer and find_matched_target do: exact names, "re:" patterns
                 matched from the start, a target naming a layer class matched by containment, e.g. "Linear"; the
                 fused layers vLLM builds, qkv_proj and gate_up_proj, resolved through their shards), module by
                 module against the recipe's FP8 units
    fused-split  a fused layer whose shards the ignore list splits: vLLM refuses to load it ("Found different
                 quantization schemes for the shards of ...")
    tensors      every module the engine quantizes has its FP8 weight and its scale in the checkpoint, and nothing
                 the model does not have is there (a renamed layer shows as both)
    weight-scale every FP8 weight, dequantized (codes x scale), reproduces the student's BF16 weight as fp8probe's
                 own quantization of it does (core/numerics.quantize_weight): scales within BF16 rounding, the
                 dequantized weights within 1 % (relative Frobenius norm)
    input-scale  static input scales present, finite, positive, and not the default 1.0 the recipe's calibration
                 never gives
    kv-scale     with an FP8 KV cache, each attention layer's k_scale and v_scale present, finite, positive, and not
                 1.0 where the recipe calibrated them
    kv-map       the layers whose KV cache vLLM keeps in the model dtype (vllm.yaml's kv-cache-dtype-skip-layers,
                 as vLLM's Attention layer matches them: layer indices; verl's and SkyRL's fragments' engine
                 keyword) against the recipe's per-layer KV map
    framework    every RL framework's fragment under frameworks/, read as that framework reads it (each target's
                 reader in frameworks/*.py), module by module and for the KV cache against the recipe

audit.json holds every finding and what was checked; the command exits 0 when clean, 1 with findings (2 on an error).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.records import AuditRecord, StudentRecord
from ..core.schemes import Scheme

# vLLM's packed_modules_mapping for the dense decoders fp8probe covers (Llama, Qwen, Gemma, Mistral): a fused layer
# and its shards, as the checkpoint names them
FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
WEIGHT_TOLERANCE = 0.01  # relative Frobenius distance of the dequantized weights to fp8probe's own
SCALE_TOLERANCE = 2**-7  # BF16's relative rounding


@dataclass
class Finding:
    kind: str  # membership, fused-split, tensors, weight-scale, input-scale, kv-scale
    where: str  # the module or tensor
    message: str

    def line(self) -> str:
        return f"{self.kind}: {self.where}: {self.message}"


@dataclass
class Audit:
    findings: list[Finding] = field(default_factory=list)
    checked: dict = field(default_factory=dict)  # what was checked: counts per check

    def add(self, kind, where, message) -> None:
        self.findings.append(Finding(kind, where, message))

    def record(self, student: dict | None = None, vllm: dict | None = None) -> AuditRecord:
        """audit.json's record: the findings, what was checked, the student checked against, vLLM's figures."""
        return AuditRecord(
            clean=not self.findings,
            findings=[f.__dict__ for f in self.findings],
            checked=self.checked,
            student=student,
            vllm=vllm,
        )


def _match(value: str, pattern: str, contains: bool = False) -> bool:
    """vLLM's is_equal_or_regex_match: "re:" patterns matched from the start, else equality (or, for class names,
    case-insensitive containment)."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], value) is not None
    return pattern.lower() in value.lower() if contains else pattern == value


def engine_layer(name: str) -> tuple[str, list[str]]:
    """The layer vLLM builds for a checkpoint module, and that layer's shards (itself alone when not fused)."""
    parent, _, proj = name.rpartition(".")
    for fused, shards in FUSED.items():
        if proj in shards:
            return f"{parent}.{fused}", [f"{parent}.{s}" for s in shards]
    return name, [name]


def engine_quantizes(layer: str, shards: list[str], qc: dict) -> tuple[bool, str | None]:
    """(whether vLLM quantizes this layer, why it refuses to load it or None), from the checkpoint's
    quantization_config."""
    ignore = qc.get("ignore") or []
    direct = [p for p in ignore if _match(layer, p)]
    if direct:
        ignored = True
    else:
        per_shard = [any(_match(s, p) for p in ignore) for s in shards]
        if any(per_shard) and not all(per_shard):
            return False, (
                f"vLLM refuses to load it: the ignore list splits its shards ("
                f"{', '.join(s.rpartition('.')[2] for s, i in zip(shards, per_shard) if i)} ignored, "
                f"{', '.join(s.rpartition('.')[2] for s, i in zip(shards, per_shard) if not i)} not)"
            )
        ignored = all(per_shard)
    if ignored:
        return False, None
    targets = [t for g in (qc.get("config_groups") or {}).values() for t in g.get("targets", [])]
    matched = (
        any(_match(layer, t) for t in targets)
        or any(all(_match(s, t) for s in shards) for t in targets)
        or any(_match("Linear", t, contains=True) for t in targets if not t.startswith("re:"))
    )
    return matched, None


def _tensors(ckpt: Path) -> dict[str, tuple]:
    """name -> (dtype name, shape) of every tensor in the checkpoint's safetensors files (headers only)."""
    out = {}
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise FP8ProbeError(f"{ckpt} holds no .safetensors files: is it an exported checkpoint?")
    for f in files:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                out[k] = (v["dtype"], tuple(v["shape"]))
    return out


def _read(ckpt: Path, names: list[str]) -> dict:
    from safetensors import safe_open

    out = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in set(st.keys()) & set(names):
                out[k] = st.get_tensor(k)
    return out


def recorded_student(ckpt: str | Path, allow_pickle: bool = False):
    """(the student an export was made from, loaded where its student.json names one that is at hand and unchanged,
    else None; what became of it, for audit.json). An export without student.json (before fp8probe recorded it) says
    so."""
    import torch

    from ..model.identity import SHORT, content_hash
    from ..model.student import load_student

    f = Path(ckpt) / "student.json"
    if not f.is_file():
        return None, {"status": "not recorded (an export without student.json): give `model` to check the weights"}
    rec = StudentRecord.read(f, "export again")
    try:
        student = load_student(rec.name, allow_pickle=allow_pickle)
    except FP8ProbeError as e:
        return None, {"name": rec.name, "status": f"not at hand ({e}): give `model` to check the weights"}
    got = content_hash(student.model, round_to=torch.bfloat16)
    if got != rec.sha256:
        return None, {
            "name": rec.name,
            "status": f"changed since the export (sha256 {got[:SHORT]}, exported from "
            f"{rec.sha256[:SHORT]}): give `model`, the student it was "
            "exported from, to check the weights",
        }
    return student, {"name": rec.name, "status": "checked: the student the export recorded (same sha256)"}


def audit_checkpoint(ckpt: str | Path, recipe=None, student=None) -> Audit:
    """Audit what `fp8probe export` wrote into a directory against `recipe` (a Recipe; default: the recipe.yaml the
    export copied) and, when given, the BF16 `student` it was made from (its units; the weight scales): the
    checkpoint when there is one (config.json), and every framework fragment under frameworks/."""
    from ..model.structure import list_units, meta_model
    from ..model.student import load_config
    from ..recipe.recipe import read_recipe

    ckpt = Path(ckpt)
    has_ckpt = (ckpt / "config.json").is_file()
    frameworks = _fragments(ckpt / "frameworks")
    if not has_ckpt and not frameworks:
        raise FP8ProbeError(
            f"{ckpt} has no config.json and no framework fragments: pass the directory `fp8probe export` wrote"
        )
    qc = json.loads((ckpt / "config.json").read_text()).get("quantization_config") if has_ckpt else None
    if has_ckpt and (not qc or qc.get("quant_method") != "compressed-tensors"):
        raise FP8ProbeError(f"{ckpt}/config.json has no compressed-tensors quantization_config: not an FP8 export")
    if recipe is None:
        if not (ckpt / "recipe.yaml").is_file():
            raise FP8ProbeError(f"{ckpt} holds no recipe.yaml: pass the recipe it was exported from (`recipe`)")
        recipe = read_recipe(ckpt / "recipe.yaml")
    if has_ckpt:
        meta = meta_model(load_config(str(ckpt)))
    elif student is not None:
        meta = student.model
    else:
        raise FP8ProbeError(f"{ckpt} holds framework fragments only: pass `model`, the student they were made for")
    units = list_units(meta)
    if any(u.kind == "expert" for u in units):
        raise FP8ProbeError(
            "audit reads dense checkpoints; this model has MoE experts, whose per-expert tensors it "
            "does not resolve yet"
        )
    a = Audit()
    if has_ckpt:
        _audit_checkpoint(a, ckpt, qc, recipe, units, {name for name, _ in meta.named_modules()}, student)
    _audit_frameworks(a, ckpt / "frameworks", frameworks, recipe, units, int(meta.config.num_hidden_layers))
    return a


def _audit_checkpoint(a: Audit, ckpt: Path, qc: dict, recipe, units, modules: set[str], student) -> None:
    fp8 = _membership(a, recipe, units, qc)
    tensors = _tensors(ckpt)
    _check_tensors(a, fp8, modules, tensors)
    _check_scales(a, ckpt, fp8, qc, units, tensors, recipe)
    _check_kv_map(a, ckpt, recipe)
    if student is not None:
        _check_weights(a, ckpt, fp8, tensors, student, recipe)


def _check_kv_map(a: Audit, ckpt: Path, recipe) -> None:
    """vllm.yaml's kv-cache-dtype-skip-layers against the recipe's kv_skip_layers, layer by layer: vLLM's Attention
    keeps a layer's KV cache in the model dtype when its index (or its attention type) is listed
    (vllm/model_executor/layers/attention/attention.py)."""
    import yaml

    path = ckpt / "vllm.yaml"
    if recipe.kv_cache_scheme is None or not path.is_file():
        return
    from .frameworks.base import skipped_layers

    listed = (yaml.safe_load(path.read_text()) or {}).get("kv-cache-dtype-skip-layers") or []
    engine = skipped_layers(listed)
    for x in listed:
        if not str(x).isdigit():
            a.add("kv-map", f"vllm.yaml: {x}", "vLLM skips layers by this name; the recipe lists layer indices only")
    want = set(recipe.kv_skip_layers)
    for i in sorted(engine ^ want):
        a.add(
            "kv-map",
            f"layer {i}",
            "vLLM keeps its KV cache BF16 (vllm.yaml), the recipe puts it in FP8"
            if i in engine
            else "the recipe keeps its KV cache BF16, vLLM would put it in FP8 (vllm.yaml does not skip it)",
        )
    a.checked["kv_map_layers_skipped"] = sorted(engine)


def _fragments(d: Path) -> dict[str, dict[str, str]]:
    """target -> {file: text} of every framework fragment `export` wrote under frameworks/."""
    from .frameworks.base import RESOLVERS

    out = {}
    for name, (files, _) in RESOLVERS.items():
        if files and all((d / f).is_file() for f in files):
            out[name] = {f: (d / f).read_text() for f in files}
    return out


def _audit_frameworks(a: Audit, d: Path, fragments: dict, recipe, units, n_blocks: int) -> None:
    """Each fragment read as its framework reads it (frameworks/*.py: resolves), against the recipe."""
    from .frameworks.base import RESOLVERS

    applies = _applied_recipes(d)
    for name, files in fragments.items():
        rec = applies[name][0] if name in applies else recipe
        want = {u.name for u in rec.fp8_units(units)}
        applied = RESOLVERS[name][1](files, units, n_blocks)
        for u in sorted(applied.fp8 ^ want):
            a.add(
                "framework",
                f"{name}: {u}",
                f"{name} quantizes it, the recipe keeps it BF16"
                if u in applied.fp8
                else f"the recipe puts it in FP8, {name} keeps it BF16",
            )
        if (rec.kv_cache_dtype is not None) != (applied.kv is not None):
            a.add(
                "framework",
                f"{name}: kv_cache_dtype",
                f"{name} sets {applied.kv}, the recipe has {rec.kv_cache_dtype or 'a BF16 KV cache'}"
                if applied.kv
                else f"the recipe has an FP8 KV cache ({rec.kv_cache_dtype}), {name}'s fragment sets none",
            )
        elif applied.kv is not None:  # both FP8: the per-layer map, layer by layer
            for i in sorted(applied.kv_skip ^ set(rec.kv_skip_layers)):
                a.add(
                    "kv-map",
                    f"{name}: layer {i}",
                    f"{name} keeps its KV cache BF16, the recipe puts it in FP8"
                    if i in applied.kv_skip
                    else f"the recipe keeps its KV cache BF16, {name} would put it in FP8",
                )
    a.checked["frameworks"] = sorted(fragments)
    a.checked["framework_recipes"] = {
        n: applies[n][1] if n in applies else "the audited recipe" for n in sorted(fragments)
    }


def _applied_recipes(d: Path) -> dict:
    """target -> (the Recipe it applies, its path), as frameworks/README.md records it ("- NAME: ... from PATH"),
    where that file is still there: an export of several recipes gives each target its own."""
    from ..recipe.recipe import read_recipe

    readme = d / "README.md"
    out = {}
    for line in readme.read_text().splitlines() if readme.is_file() else []:
        m = re.match(r"^- ([\w-]+): .* from (.+)$", line)
        if m and Path(m.group(2)).is_file():
            out[m.group(1)] = (read_recipe(m.group(2)), m.group(2))
    return out


def _membership(a: Audit, recipe, units, qc) -> list[str]:
    """The units the engine quantizes; a finding for each that differs from the recipe, and for each split layer."""
    want = {u.name for u in recipe.fp8_units(units)}
    linear = [u for u in units if u.quantizable]
    engine, seen = [], set()
    for u in linear:
        layer, shards = engine_layer(u.name)
        quantized, refused = engine_quantizes(layer, shards, qc)
        if refused and layer not in seen:
            a.add("fused-split", layer, refused)
        seen.add(layer)
        if quantized:
            engine.append(u.name)
        if quantized != (u.name in want):
            a.add(
                "membership",
                u.name,
                "the engine quantizes it, the recipe keeps it BF16"
                if quantized
                else "the recipe puts it in FP8, the engine keeps it BF16" + (" (refused layer)" if refused else ""),
            )
    a.checked["modules"] = len(linear)
    a.checked["engine_fp8"] = len(engine)
    a.checked["recipe_fp8"] = len(want)
    return engine


def _check_tensors(a: Audit, fp8: list[str], modules: set[str], tensors: dict) -> None:
    for n in fp8:
        w = tensors.get(f"{n}.weight")
        if w is None:
            a.add("tensors", n, "no weight in the checkpoint under this name (renamed or missing)")
        elif not w[0].startswith("F8"):
            a.add("tensors", n, f"the engine quantizes it but its weight is stored as {w[0]}, not FP8")
        if f"{n}.weight_scale" not in tensors:
            a.add("tensors", n, "no weight_scale: the engine cannot dequantize it")
    for m in sorted({k.rpartition(".")[0] for k in tensors} - modules):
        a.add("tensors", m, "the checkpoint holds tensors of a module the model does not have (renamed?)")
    a.checked["tensors"] = len(tensors)


def _finite_positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def _check_scales(a: Audit, ckpt: Path, fp8: list[str], qc: dict, units, tensors: dict, recipe) -> None:
    static = any(
        not (g.get("input_activations") or {}).get("dynamic", True)
        for g in (qc.get("config_groups") or {}).values()
        if g.get("input_activations")
    )
    names = [f"{n}.input_scale" for n in fp8] if static else []
    layers = sorted({u.block for u in units if u.block >= 0})
    kv = qc.get("kv_cache_scheme") is not None
    kv_names = [f"{_attn(units, i)}.{s}_scale" for i in layers for s in ("k", "v")] if kv else []
    if recipe.kv_cache_scheme is not None and not kv:
        a.add(
            "kv-scale",
            "config.json",
            "the recipe has an FP8 KV cache, the checkpoint's config has no "
            "kv_cache_scheme: the engine runs a BF16 cache or uncalibrated scales",
        )
    got = _read(ckpt, names + kv_names)
    for k in names:
        _scale(a, "input-scale", k, got.get(k), calibrated=True)
    for k in kv_names:
        _scale(a, "kv-scale", k, got.get(k), calibrated=recipe.kv_scale == "calibrated")
    a.checked["input_scales"] = len(names)
    a.checked["kv_scales"] = len(kv_names)


def _attn(units, i: int) -> str:
    """The attention module of block i, as the checkpoint names it (where k_scale and v_scale live)."""
    for u in units:
        if u.block == i and u.name.endswith(".k_proj"):
            return u.name.rpartition(".")[0]
    return f"model.layers.{i}.self_attn"


def _scale(a: Audit, kind: str, key: str, t, calibrated: bool) -> None:
    if t is None:
        a.add(kind, key, "missing: the engine has no calibrated scale for it")
        return
    x = float(t.float().max())
    if not _finite_positive(float(t.float().min())) or not _finite_positive(x):
        a.add(kind, key, f"{x:g}: a scale must be finite and positive")
    elif calibrated and x == 1.0:
        a.add(kind, key, "1.0, the engine's default, where the recipe calibrated a scale (dropped on the way?)")


def _check_weights(a: Audit, ckpt: Path, fp8: list[str], tensors: dict, student, recipe) -> None:
    """Each FP8 weight (codes x scale) against fp8probe's quantization of the student's BF16 weight."""
    import torch

    from ..core.numerics import STORAGE_DTYPE, dequantize, quantize_weight

    scheme = Scheme.from_name(recipe.scheme)
    present = [n for n in fp8 if f"{n}.weight" in tensors and f"{n}.weight_scale" in tensors]
    got = _read(ckpt, [f"{n}.{s}" for n in present for s in ("weight", "weight_scale")])
    model = student.model
    for n in present:
        w = model.get_submodule(n).weight.detach().to(torch.bfloat16)
        codes, scale = quantize_weight(w, scheme, STORAGE_DTYPE)
        ref = dequantize(codes, scale, scheme.weight).float()
        c, s = got[f"{n}.weight"], got[f"{n}.weight_scale"].float()
        if c.shape != ref.shape:
            a.add("weight-scale", n, f"weight shape {tuple(c.shape)}, the student's {tuple(ref.shape)}")
            continue
        deq = dequantize(c, s.reshape(scale.shape) if s.numel() == scale.numel() else s, scheme.weight).float()
        ratio = float((s.float().flatten() / scale.float().flatten()).max()) if s.numel() == scale.numel() else None
        err = float((deq - ref).norm() / ref.norm().clamp_min(1e-30))
        if ratio is not None and abs(ratio - 1) > SCALE_TOLERANCE or err > WEIGHT_TOLERANCE:
            a.add(
                "weight-scale",
                n,
                f"dequantized weight {err:.1%} from the student's (scale x{ratio:.4g} of fp8probe's)"
                if ratio is not None
                else f"dequantized weight {err:.1%} from the student's",
            )
    a.checked["weights"] = len(present)
