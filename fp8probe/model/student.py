"""A student model: loading it safely, and the one source of its units, fused groups, experts and KV geometry.

A *unit* is one weight that a recipe can put in FP8: a Linear inside a decoder block, or all experts of
one MoE layer (transformers stores them as one module holding 3-D weights). vLLM fuses some of them
(`packed_modules_mapping`): q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj, and every expert of a
layer shares one scheme. A recipe must keep each such *group* in one precision, so every unit carries
the name of its group. Embeddings, lm_head and MoE routers are listed too, but stay BF16.

Loading reads safetensors and GGUF only (a pickled checkpoint is refused unless allow_pickle), offline,
and refuses weights that hold NaN/inf. `load_config` and `meta_model` give the structure without weights
(a bare config.json is enough), which is how bad input is refused before any output exists.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from . import embedded
from ..core.errors import FP8ProbeError, one_line

log = logging.getLogger(__name__)

# model_type -> family; every one is tested on a tiny model built from its config (tests/test_student.py)
SUPPORTED = {
    "llama": "Llama / SmolLM",
    "mistral": "Mistral",
    "qwen2": "Qwen2 / Qwen2.5",
    "qwen3": "Qwen3",
    "gemma": "Gemma",
    "gemma2": "Gemma-2",
    "gemma3_text": "Gemma-3 (text)",
    "phi3": "Phi-3",
    "qwen3_moe": "Qwen3-MoE",
    "mixtral": "Mixtral",
}

# leaf module name -> (kind, the name vLLM's fused module gets, or None when it is not fused)
_KINDS = {
    "q_proj": ("q", "qkv_proj"),
    "k_proj": ("k", "qkv_proj"),
    "v_proj": ("v", "qkv_proj"),
    "qkv_proj": ("qkv", "qkv_proj"),
    "o_proj": ("o", None),
    "gate_proj": ("gate", "gate_up_proj"),
    "up_proj": ("up", "gate_up_proj"),
    "gate_up_proj": ("gate_up", "gate_up_proj"),
    "down_proj": ("down", None),
}
ROUTER_NAMES = ("gate", "router")  # leaf names of MoE routers (kept BF16 in every production FP8 setup)
EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")  # the Linears llm-compressor unpacks each expert into


@dataclass(frozen=True)
class Unit:
    """One weight a recipe can quantize (or, with quantizable=False, one that stays BF16)."""

    name: str  # module path, e.g. model.layers.0.self_attn.q_proj
    kind: str  # q k v o qkv gate up gate_up down expert | embed lm_head router
    block: int  # decoder block index; -1 outside the blocks
    group: str  # fused group as vLLM loads it, e.g. model.layers.0.self_attn.qkv_proj
    params: int
    shape: tuple[int, ...]  # weight shape: [out, in], or [experts, out, in] for an expert unit
    quantizable: bool = True


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

    def groups(self) -> dict[str, list[Unit]]:
        """Fused group name -> its units, in block order."""
        return fused_groups(self.units)

    def unit(self, name: str) -> Unit:
        for u in self.units:
            if u.name == name:
                return u
        raise FP8ProbeError(f"no unit named {name!r} in {self.name}; see `fp8probe units` for the list")


def fused_groups(units: list[Unit]) -> dict[str, list[Unit]]:
    """Fused group name (as vLLM loads it) -> its quantizable units, in model order."""
    out: dict[str, list[Unit]] = {}
    for u in units:
        if u.quantizable:
            out.setdefault(u.group, []).append(u)
    return out


def expert_linear_names(unit: str, num_experts: int) -> list[str]:
    """The Linear names llm-compressor gives the experts of one experts unit: `<unit>.<e>.<proj>`."""
    return [f"{unit}.{e}.{p}" for e in range(num_experts) for p in EXPERT_PROJS]


def expert_ignore_pattern(unit: str) -> str:
    """An llm-compressor ignore entry that keeps every expert of one experts unit in BF16."""
    return "re:^" + re.escape(unit) + r"\..*"


@dataclass(frozen=True)
class KVGeometry:
    """What the KV cache of one model looks like: per attention layer, K and V of kv_heads x head_dim."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def elements_per_token_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim  # K and V


def kv_geometry(config) -> KVGeometry:
    cfg = text_config(config)
    heads = cfg.num_attention_heads
    return KVGeometry(cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", None) or heads,
                      getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)


def text_config(config):
    """The language model's config (multimodal configs nest it)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def meta_model(config):
    """The model built on the meta device: shapes and names, no memory, no weights."""
    from transformers import AutoModelForCausalLM

    check_supported(config)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _supported_list() -> str:
    return ", ".join(f"{v} ({k})" for k, v in SUPPORTED.items())


# config fields fp8probe computes with: each must be a positive integer when present (required: True)
_CONFIG_INTS = {"num_hidden_layers": True, "hidden_size": True, "num_attention_heads": True, "vocab_size": True,
                "num_key_value_heads": False, "head_dim": False, "intermediate_size": False,
                "max_position_embeddings": False, "sliding_window": False}


def check_supported(config) -> str:
    """The config's model_type, if fp8probe supports it and its sizes are sane; a one-line refusal otherwise."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        raise FP8ProbeError(f"unsupported architecture {model_type!r}; fp8probe supports {_supported_list()}")
    cfg = text_config(config)
    for key, required in _CONFIG_INTS.items():
        v = getattr(cfg, key, None)
        if v is None and not required:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise FP8ProbeError(f"the model config's {key} is {v!r}; it must be a positive integer: "
                                "is this a real Hugging Face config.json?")
    return model_type


# ---------------------------------------------------------------------------------------------------
# model structure


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise FP8ProbeError(f"{type(model).__name__} has no model.layers; fp8probe supports {_supported_list()}")
    return layers


def list_units(model: nn.Module) -> list[Unit]:
    """Every quantizable weight in the decoder blocks, plus embeddings / lm_head / routers (kept BF16)."""
    check_supported(model.config)
    layers = decoder_layers(model)
    prefix = _module_path(model, layers)
    units: list[Unit] = []
    emb = model.get_input_embeddings()
    units.append(_unit(_module_path(model, emb), "embed", -1, emb.weight, quantizable=False))
    for b, layer in enumerate(layers):
        for sub, mod in layer.named_modules():
            if not sub:
                continue
            name = f"{prefix}.{b}.{sub}"
            leaf = sub.rsplit(".", 1)[-1]
            parent = name.rsplit(".", 1)[0]
            if is_experts(mod):
                params = mod.gate_up_proj.numel() + mod.down_proj.numel()
                units.append(Unit(name, "expert", b, name, params, tuple(mod.gate_up_proj.shape)))
            elif isinstance(mod, nn.Linear) and not _inside_experts(layer, sub):
                if leaf in _KINDS:
                    kind, fused = _KINDS[leaf]
                    group = f"{parent}.{fused}" if fused else name
                    units.append(_unit(name, kind, b, mod.weight, group=group))
                elif leaf in ROUTER_NAMES:
                    units.append(_unit(name, "router", b, mod.weight, quantizable=False))
                else:
                    units.append(_unit(name, "other", b, mod.weight))
            elif leaf in ROUTER_NAMES and hasattr(mod, "weight") and isinstance(mod.weight, nn.Parameter):
                units.append(_unit(name, "router", b, mod.weight, quantizable=False))
    head = model.get_output_embeddings()
    if head is not None and head.weight is not emb.weight:
        units.append(_unit(_module_path(model, head), "lm_head", -1, head.weight, quantizable=False))
    elif head is not None:
        # tied embeddings: listed (it is a GEMM in vLLM) but its weight is the embedding's
        units.append(Unit(_module_path(model, head), "lm_head", -1, _module_path(model, emb), 0,
                          tuple(head.weight.shape), quantizable=False))
    return units


def input_dim(unit: Unit) -> int:
    """The smallest input dim among the unit's GEMMs (experts: gate_up [E, 2I, H] takes H, down takes I)."""
    if unit.kind == "expert":
        return min(unit.shape[-1], unit.shape[-2] // 2)
    return unit.shape[-1]


def scheme_blockers(units: list[Unit], scheme) -> dict[str, str]:
    """fused group -> why `scheme` cannot quantize it, for the groups whose shapes its kernels refuse.

    FP8_BLOCK (as vLLM's block-FP8 kernels): each input dim in whole groups of 128 (per-token-group activation
    quantization), and in a fused group (q/k/v, gate/up) every output but the last in whole 128-row blocks.
    Other schemes take every shape."""
    out = {}
    g_in = scheme.input.group_size if scheme.input.strategy == "group" else None
    bn = scheme.weight.block[0] if scheme.weight.strategy == "block" else None
    for g, us in fused_groups(units).items():
        bad = [f"{u.name.rsplit('.', 1)[-1]} input dim {input_dim(u)}" for u in us if g_in and input_dim(u) % g_in]
        bad += [f"{u.name.rsplit('.', 1)[-1]} output dim {u.shape[-2]} (fused)" for u in us[:-1] if bn and u.shape[-2] % bn]
        if bad:
            out[g] = f"{bad[0]} not a multiple of {g_in or bn}"
    return out


def check_scheme(config, scheme, partial: bool = False) -> dict[str, str]:
    """Refuse, from the config alone, a scheme this model's shapes cannot take (FP8_BLOCK on dims that are not
    whole groups of 128), before any weight is loaded or any output exists. With partial=True (a sweep) only
    a scheme that can take no group at all is refused; returns the fused groups it cannot take (not swept,
    BF16 in every recipe), after a warning naming them."""
    units = [u for u in list_units(meta_model(config)) if u.quantizable]
    blocked = scheme_blockers(units, scheme)
    groups = fused_groups(units)
    if blocked and (not partial or len(blocked) == len(groups)):
        scheme.check_input_dims({u.name: input_dim(u) for u in units})
        g, why = next(iter(blocked.items()))
        raise FP8ProbeError(f"{scheme.name} cannot quantize {'any' if partial else len(blocked)} of this model's "
                            f"fused groups ({g}: {why}); use FP8_DYNAMIC")
    if blocked:
        g, why = next(iter(blocked.items()))
        log.warning("%s cannot quantize %d of this model's %d fused groups (%s: %s); they are not swept and stay "
                    "BF16 in every recipe", scheme.name, len(blocked), len(groups), g, why)
    return blocked


def _unit(name, kind, block, weight, group=None, quantizable=True) -> Unit:
    return Unit(name, kind, block, group or name, weight.numel(), tuple(weight.shape), quantizable)


def is_experts(mod: nn.Module) -> bool:
    """transformers >= 5 keeps all experts of a layer in one module with 3-D gate_up_proj / down_proj."""
    gu, dn = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    return isinstance(gu, nn.Parameter) and isinstance(dn, nn.Parameter) and gu.ndim == 3


def _inside_experts(layer: nn.Module, sub: str) -> bool:
    parts = sub.split(".")
    return any(is_experts(layer.get_submodule(".".join(parts[:i]))) for i in range(1, len(parts)))


def _module_path(model: nn.Module, target: nn.Module) -> str:
    for name, mod in model.named_modules():
        if mod is target:
            return name
    raise FP8ProbeError(f"module {type(target).__name__} not found in the model")


# ---------------------------------------------------------------------------------------------------
# loading


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def resolve_source(name_or_path: str | None, allow_pickle: bool = False) -> tuple[str, dict]:
    """Where to load from: (path or id, extra from_pretrained kwargs). Raises on a missing path.

    Weights are read from safetensors or GGUF only: a directory whose weights are pickled (.bin / .pt) is
    refused unless allow_pickle, and then transformers loads them with torch.load(weights_only=True).
    """
    safe = {"weights_only": True} if allow_pickle else {"use_safetensors": True}
    if name_or_path is None or str(name_or_path).strip().lower() == embedded.NAME:
        return str(embedded.embedded_student_dir()), {"use_safetensors": True}
    s = str(name_or_path)
    p = Path(s).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise FP8ProbeError(f"no such GGUF file: {s}")
        _check_gguf(p)
        return str(p.parent), {"gguf_file": p.name}
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FP8ProbeError(f"{s} is not a Hugging Face model directory (no config.json)")
        has_safe = any(p.glob("*.safetensors"))
        pickled = sorted(f.name for f in p.iterdir() if f.suffix in PICKLE_SUFFIXES)
        if not has_safe and pickled and not allow_pickle:
            raise FP8ProbeError(f"{s} holds only pickled weights ({pickled[0]}); fp8probe never unpickles by "
                                "default: convert them to safetensors, or pass --allow-pickle to load them with "
                                "torch.load(weights_only=True)")
        return str(p), dict(safe)
    if p.is_file() and p.suffix in PICKLE_SUFFIXES:
        raise FP8ProbeError(f"{s} is a pickled checkpoint file; pass the Hugging Face directory that holds it "
                            "(with its config.json), as safetensors")
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
    """The model config: from a model directory / id / .gguf, a bare config.json, or a directory holding
    only one (capacity needs nothing else)."""
    from transformers import AutoConfig

    if name_or_path is not None:
        p = Path(name_or_path).expanduser()
        if p.is_file() and p.suffix == ".json":
            return _bare_config(p, AutoConfig)
    src, kwargs = resolve_source(name_or_path, allow_pickle)
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
    import json

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
            raise FP8ProbeError(f"the weights of {name} hold {bad} NaN/inf values in {pname}; the checkpoint is "
                                "broken: fix or re-export it before measuring")


def check_device(device: str) -> torch.device:
    """A torch device that exists here; a one-line refusal otherwise."""
    if device == "auto":  # Accelerate's device_map: the model spread over this machine's GPUs
        if not torch.cuda.is_available():
            raise FP8ProbeError("--device auto spreads the model over CUDA GPUs, and none is available here; use "
                                "--device cpu")
        return torch.device("cuda", 0)
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise FP8ProbeError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise FP8ProbeError(f"--device {device}: no CUDA device is available here; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise FP8ProbeError(f"--device {device}: only {torch.cuda.device_count()} CUDA devices here")
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise FP8ProbeError(f"unsupported device {device!r}; use cpu or cuda")
    return dev


def parse_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
             "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
    if str(dtype).lower() not in table:
        raise FP8ProbeError(f"unknown dtype {dtype!r}; supported: float32, bfloat16, float16")
    return table[str(dtype).lower()]


def depth_pruned(model: nn.Module, every: int = 2) -> nn.Module:
    """A depth-pruned copy of `model`, initialised from its weights (Minitron-style): decoder blocks 0, every,
    2·every, ... kept, the embeddings, final norm and head copied; the rest dropped. The teacher is untouched."""
    import copy

    if every < 2:
        raise FP8ProbeError("a depth-pruned student keeps every k-th block for k >= 2")
    n = len(decoder_layers(model))
    keep = list(range(0, n, every))
    if len(keep) == n:
        raise FP8ProbeError(f"the teacher has {n} decoder block(s): too few to prune")
    pruned = copy.deepcopy(model)
    layers = decoder_layers(pruned)
    kept = nn.ModuleList([layers[i] for i in keep])
    pruned.model.layers = kept
    for j, layer in enumerate(kept):  # the KV cache is indexed by the attention's layer_idx
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = j
    cfg = pruned.config
    text = text_config(cfg)
    text.num_hidden_layers = len(keep)
    if isinstance(getattr(text, "layer_types", None), list) and len(text.layer_types) == n:
        text.layer_types = [text.layer_types[i] for i in keep]
    if isinstance(getattr(text, "mlp_only_layers", None), list):  # block indices: renumbered
        text.mlp_only_layers = [keep.index(i) for i in text.mlp_only_layers if i in keep]
    return pruned
