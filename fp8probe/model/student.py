"""A student model: loading it safely (structure.py says what its units, fused groups and KV geometry are).

Loading reads safetensors and GGUF only (a pickled checkpoint is refused unless allow_pickle), offline,
and refuses weights that hold NaN/inf. `load_config` gives the structure without weights (a bare
config.json is enough), which is how bad input is refused before any output exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..core.errors import FP8ProbeError, one_line
from ..core.files import atomic_write_text
from . import embedded
from .devices import parse_dtype
from .pruning import depth_pruned, is_pruned, pruned_config, pruned_every
from .structure import Unit, check_supported, fused_groups, list_units


@dataclass
class Student:
    model: nn.Module
    tokenizer: object
    units: list[Unit]
    name: str  # what the user asked for ("smollm2-135m", a path, an id)
    path: str  # where the weights came from
    model_type: str
    extra: dict = field(default_factory=dict)

    @property
    def quantizable(self) -> list[Unit]:
        return [u for u in self.units if u.quantizable]

    @property
    def unit_names(self) -> tuple[str, ...]:
        """Every quantizable unit's name, in model order: "every unit in FP8"."""
        return tuple(u.name for u in self.units if u.quantizable)

    @property
    def layers(self) -> tuple[int, ...]:
        """Every attention layer's index: "an FP8 KV cache in every layer"."""
        return tuple(range(self.model.config.num_hidden_layers))

    def groups(self) -> dict[str, list[Unit]]:
        """Fused group name -> its units, in block order."""
        return fused_groups(self.units)

    def unit(self, name: str) -> Unit:
        for u in self.units:
            if u.name == name:
                return u
        raise FP8ProbeError(f"no unit named {name!r} in {self.name}; see `fp8probe units` for the list")


# ---------------------------------------------------------------------------------------------------
# model structure


# ---------------------------------------------------------------------------------------------------
# loading


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def resolve_source(name_or_path: str | None, allow_pickle: bool = False) -> tuple[str, dict]:
    """Where to load from: (path or id, extra from_pretrained kwargs). Raises on a missing path.

    Weights are read from safetensors or GGUF only: a directory whose weights are pickled (.bin / .pt) is
    refused unless allow_pickle, and then transformers loads them with torch.load(weights_only=True).
    """
    safe = {"weights_only": True} if allow_pickle else {"use_safetensors": True}
    if name_or_path is None or str(name_or_path).strip().lower() in embedded.STUDENTS:
        return str(embedded.STUDENTS[str(name_or_path or embedded.NAME).strip().lower()]()), {"use_safetensors": True}
    s = str(name_or_path)
    p = Path(s).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise FP8ProbeError(f"no such GGUF file: {s}")
        _check_gguf(p)
        return str(embedded.gguf_copy(p)), {"use_safetensors": True}  # dequantized once, cached by the file's hash
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FP8ProbeError(f"{s} is not a Hugging Face model directory (no config.json)")
        has_safe = any(p.glob("*.safetensors"))
        pickled = sorted(f.name for f in p.iterdir() if f.suffix in PICKLE_SUFFIXES)
        if not has_safe and pickled and not allow_pickle:
            raise FP8ProbeError(
                f"{s} holds only pickled weights ({pickled[0]}); fp8probe never unpickles by "
                "default: convert them to safetensors, or pass `allow_pickle` to load them with "
                "torch.load(weights_only=True)"
            )
        return str(p), dict(safe)
    if p.is_file() and p.suffix in PICKLE_SUFFIXES:
        raise FP8ProbeError(
            f"{s} is a pickled checkpoint file; pass the Hugging Face directory that holds it "
            "(with its config.json), as safetensors"
        )
    if p.exists():
        raise FP8ProbeError(f"{s} is not a model: pass a Hugging Face directory, a .gguf file or a model id")
    if s.startswith((".", "/", "~")) or s.count("/") > 1 or s.endswith((".json", ".safetensors", ".bin")):
        raise FP8ProbeError(f"no such file or directory: {s}")
    return s, {"local_files_only": True, **safe}  # a model id, offline, from the local HF cache


def _check_gguf(p: Path) -> None:
    """A truncated or foreign file fails here in a line, not deep inside the GGUF reader."""
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise FP8ProbeError(f"{p} is not a GGUF file (bad magic bytes)")
    try:
        from gguf import GGUFReader

        GGUFReader(str(p))
    except ImportError as e:
        raise FP8ProbeError("reading .gguf files needs the gguf package: pip install gguf") from e
    except Exception as e:  # the reader raises assorted errors on a cut-off file
        raise FP8ProbeError(f"{p} is not a readable GGUF file (truncated or corrupt: {e})") from e


def config_kwargs(kwargs: dict) -> dict:
    """What AutoConfig / AutoTokenizer take of resolve_source's kwargs (the weight-format ones are the model's)."""
    return {k: v for k, v in kwargs.items() if k in ("gguf_file", "local_files_only")}


def load_config(name_or_path: str | None = None, trust_remote_code: bool = False, allow_pickle: bool = False):
    """The model config: from a model directory / id / .gguf, a bare config.json, a directory holding only one, or
    `shape:NAME` (model/shapes.py; capacity and plan need nothing else)."""
    from transformers import AutoConfig

    from .shapes import is_shape, shape_config

    if is_shape(name_or_path):  # a public architecture's shape (shapes.py): config only, no weights
        return shape_config(name_or_path)
    if is_pruned(name_or_path):  # the embedded student depth-pruned (pruning.py)
        return pruned_config(name_or_path, load_config(None))
    if str(name_or_path or "").strip().lower() in embedded.SPLIT_GGUFS:  # its GGUF's metadata: nothing converted
        name_or_path = str(embedded.split_gguf(str(name_or_path).strip().lower()))
    if name_or_path is not None:
        p = Path(name_or_path).expanduser()
        if p.is_file() and p.suffix == ".json":
            return _bare_config(p, AutoConfig)
        if p.is_file() and p.suffix == ".gguf":  # the config alone: read from the file's metadata, nothing converted
            return _gguf_config(p, AutoConfig, name_or_path, trust_remote_code)
    src, kwargs = resolve_source(name_or_path, allow_pickle)
    return _read_config(AutoConfig, src, kwargs, name_or_path, trust_remote_code)


def _gguf_config(p: Path, AutoConfig, name_or_path, trust_remote_code):
    """A GGUF's config: from its converted copy, else from the config cached beside it, else read from the file's
    metadata once (minutes for a 262k-token vocabulary: the reader walks every tokenizer field) and cached by the
    file's hash (embedded.gguf_config_path)."""
    copy = embedded.gguf_copy_dir(p)
    if (copy / "config.json").exists():
        return _read_config(AutoConfig, str(copy), {}, name_or_path, trust_remote_code)
    cached = embedded.gguf_config_path(p)
    if cached.is_file():
        return _bare_config(cached, AutoConfig)
    _check_gguf(p)
    cfg = _read_config(AutoConfig, str(p.parent), {"gguf_file": p.name}, name_or_path, trust_remote_code)

    cached.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(cached, cfg.to_json_string())
    return cfg


def _read_config(AutoConfig, src, kwargs, name_or_path, trust_remote_code):
    try:
        cfg = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code, **config_kwargs(kwargs))
    except OSError as e:
        if kwargs.get("local_files_only"):
            raise FP8ProbeError(
                f"model {name_or_path!r} is not a local path and not in the local Hugging Face cache; "
                "download it first or pass a local directory"
            ) from e
        raise FP8ProbeError(f"could not read the model config from {name_or_path}: {e}") from e
    except Exception as e:  # transformers validates configs with assorted exception types
        raise FP8ProbeError(f"could not read the model config from {name_or_path}: {one_line(e)}") from e
    return cfg


def _bare_config(p: Path, AutoConfig):
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FP8ProbeError(f"{p} is not valid JSON ({e}); pass a Hugging Face config.json") from e
    if not isinstance(d, dict) or "model_type" not in d:
        raise FP8ProbeError(f"{p} has no model_type; pass a Hugging Face config.json")
    try:
        return AutoConfig.for_model(**d)
    except Exception as e:  # transformers validates configs with assorted exception types
        raise FP8ProbeError(f"{p} is not a config transformers accepts: {one_line(e)}") from e


def load_student(
    name_or_path: str | None = None,
    device: str = "cpu",
    dtype: torch.dtype | str = torch.float32,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> Student:
    """Load a student: a local HF directory, a model id in the local HF cache, a .gguf file, or
    None / "smollm2-135m" for the embedded default. fp32 on CPU by default (bf16 is ~5x slower there).

    Only safetensors and GGUF weights are read unless allow_pickle; weights holding NaN or inf are refused.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = parse_dtype(dtype)
    if is_pruned(name_or_path):  # the embedded student depth-pruned, as `calibrate --student pruned:K` makes it
        teacher = load_student(None, device, dtype)
        pruned = depth_pruned(teacher.model, pruned_every(name_or_path))
        return Student(
            pruned, teacher.tokenizer, list_units(pruned), str(name_or_path).strip(), teacher.path, teacher.model_type
        )
    config = load_config(name_or_path, trust_remote_code, allow_pickle)
    model_type = check_supported(config)
    src, kwargs = resolve_source(name_or_path, allow_pickle)
    try:
        tok = AutoTokenizer.from_pretrained(src, trust_remote_code=trust_remote_code, **config_kwargs(kwargs))
        spread = {"device_map": "auto"} if device == "auto" else {}
        model = AutoModelForCausalLM.from_pretrained(
            src, dtype=dtype, trust_remote_code=trust_remote_code, **kwargs, **spread
        )
    except (OSError, ValueError, RuntimeError) as e:
        raise FP8ProbeError(f"could not load the model from {name_or_path or src}: {str(e).splitlines()[0]}") from e
    if device != "auto":
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    check_finite_weights(model, str(name_or_path or src))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return Student(model, tok, list_units(model), str(name_or_path or "smollm2-135m"), src, model_type)


def check_finite_weights(model: nn.Module, name: str) -> None:
    """A checkpoint whose weights hold NaN or inf gives meaningless mismatch: report it, do not sweep it."""
    for pname, p in model.named_parameters():
        if not torch.isfinite(p).all():
            bad = int((~torch.isfinite(p)).sum())
            raise FP8ProbeError(
                f"the weights of {name} hold {bad} NaN/inf values in {pname}; the checkpoint is "
                "broken: fix or re-export it before measuring"
            )
