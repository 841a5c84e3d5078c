"""The one Recipe type: which units run in FP8 (and in which scheme), with or without an FP8 KV cache.

A recipe is data, written as llm-compressor's own YAML and read back by llm-compressor's recipe parser
(tests/recipe/test_recipe.py):

    default_stage:
      default_modifiers:
        QuantizationModifier:
          targets: [Linear]
          scheme: FP8_DYNAMIC                # a compressed-tensors preset
          ignore: [lm_head, <units kept in BF16>, ...]
          kv_cache_scheme: {...}             # optional: an FP8 KV cache with calibrated k/v scales

The ignore list is the recipe's precision per unit: a quantizable unit is in FP8 unless ignored
(`fp8_units`), by compressed-tensors' rule (exact module names; "re:" patterns match from the start).
Beside the YAML, recipe.json records how the recipe was chosen (selection.py): budget, metric, predicted
and measured mismatch, bytes saved, the fused groups kept and quantized, every measured search pass.

`check_vllm_loadable` refuses, naming the units, what vLLM would refuse or silently get wrong: a fused
group (q/k/v, gate/up) split across precisions, the experts of one layer in different precisions, and
shapes the scheme cannot take. `check_model` refuses a recipe made for another model.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import FP8ProbeError
from ..core.files import atomic_write_text
from ..core.records import RecipeRecord
from ..core.schemes import KV_CACHE_SCHEMES, Scheme, check_recipe_kv, kv_cache_name
from ..model.structure import Unit, expert_ignore_pattern, expert_linear_names, fused_groups, input_dim, scheme_blockers
from .forms import FORMS

log = logging.getLogger(__name__)

MODIFIER_KEYS = {"targets", "ignore", "scheme", "config_groups", "kv_cache_scheme"}  # what fp8probe writes and reads


@dataclass
class Recipe:
    scheme: str  # a schemes.SCHEMES name: a compressed-tensors preset, or FP8_TENSOR_DYNAMIC (vLLM's online FP8)
    ignore: list[str]  # llm-compressor's ignore list: module names / "re:" patterns kept BF16
    kv_cache_dtype: str | None = None  # an FP8 KV cache as vLLM names it (a KV_CACHE_SCHEMES key), None: the model's
    kv_cache_scheme: dict | None = None  # the kv_cache_scheme mapping as written
    model: str | None = None
    # how it was chosen (recipe.json); empty for a recipe read back from its YAML
    quantized: list[str] = field(default_factory=list)  # fused groups in FP8
    kept: list[str] = field(default_factory=list)  # fused groups kept BF16
    group_units: dict[str, list[str]] = field(default_factory=dict)
    budget: float | None = None
    metric: str = "kl_q_p"
    predicted: float | None = None
    measured: float | None = None
    measured_metrics: dict = field(default_factory=dict)
    bytes_saved: int = 0
    kept_scores: list[dict] = field(default_factory=list)
    search: list[dict] = field(default_factory=list)
    sweep: str | None = None
    form: str = "free"  # FORMS: the shape of recipe searched (what a framework can express)
    target: str | None = None  # the rollout framework it was made for (frameworks.TARGETS), if any
    kv_scale: str = "calibrated"  # FP8 KV-cache scales as measured: "calibrated" (checkpoint) or "unit" (1.0)
    memory_target: dict | None = None  # {"kind", "value"} when chosen under a memory target instead of a budget
    fp8_share: float | None = None  # FP8 weights / weights of every Linear, lm_head included (selection.MemoryTarget)
    effective_bits: float | None = None  # 16 - 8 x fp8_share
    measured_search: float | None = None  # the search set's value (= measured without a split; None: not measured)
    measured_interval: list | None = None  # measured's 90 % bootstrap interval over the held-out prompts
    split: dict | None = None  # the held-out split (Rollouts.split), or None: measured on the rollouts searched
    measured_engine: dict | None = None  # the same figure as a rollout engine's profile computes it (measured_as)
    # a per-layer KV map: the layers whose KV cache stays in the model dtype (vLLM's kv_cache_dtype_skip_layers), and
    # the KV tokens in flight it was chosen at; empty: the FP8 KV cache (if any) in every layer
    kv_skip_layers: list[int] = field(default_factory=list)
    kv_tokens: int | None = None
    kv_context: int | None = None  # one sequence's tokens, where sliding-window layers' KV was priced at its window

    def __post_init__(self):
        Scheme.from_name(self.scheme)
        check_recipe_kv(self.kv_cache_dtype)
        if self.kv_cache_dtype is not None and self.kv_cache_scheme is None:
            self.kv_cache_scheme = dict(KV_CACHE_SCHEMES[self.kv_cache_dtype])

    # ------------------------------------------------------------------------------------------------
    # building one

    @classmethod
    def from_groups(cls, units: list[Unit], scheme: str, fp8_groups, **info) -> "Recipe":
        """FP8 for the given fused groups, BF16 for every other quantizable unit (and lm_head, routers)."""
        groups = fused_groups(units)
        keep = [g for g in groups if g not in set(fp8_groups)]
        ignore = ["lm_head", *(u.name for u in units if u.kind == "router")]
        for g in keep:
            ignore += [expert_ignore_pattern(u.name) if u.kind == "expert" else u.name for u in groups[g]]
        return cls(scheme=Scheme.from_name(scheme).name, ignore=ignore, **info)

    @classmethod
    def whole_model(cls, units: list[Unit], scheme: str = "FP8_DYNAMIC", kv_cache_dtype: str | None = None) -> "Recipe":
        """Every quantizable unit in FP8: the usual "all but lm_head" rollout setup."""
        return cls.from_groups(units, scheme, fused_groups(units), kv_cache_dtype=kv_cache_dtype)

    # ------------------------------------------------------------------------------------------------
    # precision per unit

    @property
    def preset(self) -> Scheme:
        return Scheme.from_name(self.scheme)

    def is_ignored(self, name: str) -> bool:
        """compressed-tensors' rule for module names: "re:" patterns match from the start, others exactly."""
        return any(re.match(p[3:], name) if p.startswith("re:") else name == p for p in self.ignore)

    def fp8_units(self, units: list[Unit]) -> list[Unit]:
        """The quantizable units this recipe puts in FP8 (experts: as llm-compressor names their Linears)."""
        return [u for u in units if u.quantizable and not self._ignores(u)]

    def _ignores(self, u: Unit) -> bool:
        if u.kind == "expert":
            return self.is_ignored(expert_linear_names(u.name, 1)[0])
        return self.is_ignored(u.name)

    # ------------------------------------------------------------------------------------------------
    # what vLLM would refuse

    def check_model(self, units: list[Unit], where: str = "the recipe") -> None:
        """Refuse a recipe whose ignore list names modules this model lacks: it was made for another model."""
        names = {u.name for u in units}
        foreign = [p for p in self.ignore if not p.startswith("re:") and p != "lm_head" and p not in names]
        if foreign:
            raise FP8ProbeError(
                f"{where} keeps {foreign[0]} in BF16, but this model has no such module"
                f"{f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''}: it was made for "
                "another model; make a recipe from a sweep of this one"
            )

    def check_vllm_loadable(self, units: list[Unit]) -> None:
        """Refuse, naming the units, what vLLM cannot load: split fused groups, mixed experts, bad shapes."""
        groups = fused_groups(units)
        fp8 = {u.name for u in self.fp8_units(units)}
        for g, us in groups.items():
            if len({u.name in fp8 for u in us}) > 1:
                q = [u.name for u in us if u.name in fp8]
                b = [u.name for u in us if u.name not in fp8]
                raise FP8ProbeError(
                    f"the recipe splits vLLM's fused {g.rsplit('.', 1)[-1]} of block {us[0].block}: "
                    f"FP8 {', '.join(q)} but BF16 {', '.join(b)}; keep the whole group in one "
                    "precision"
                )
        for u in units:
            if u.kind == "expert" and len({self.is_ignored(n) for n in expert_linear_names(u.name, u.shape[0])}) > 1:
                raise FP8ProbeError(
                    f"the recipe gives the experts of {u.name} different precisions; vLLM runs all "
                    "experts of a layer with one scheme"
                )
        scheme = self.preset
        scheme.check_input_dims({u.name: input_dim(u) for u in units if u.name in fp8})
        bad = [f"{g} ({why})" for g, why in scheme_blockers([u for u in units if u.name in fp8], scheme).items()]
        if bad:  # what is left after the input dims: fused outputs that are not whole blocks
            raise FP8ProbeError(
                f"{scheme.name} cannot take these shapes: {', '.join(bad[:4])}"
                f"{' ...' if len(bad) > 4 else ''}; keep these in BF16 or use FP8_DYNAMIC"
            )

    @property
    def needs_calibration(self) -> bool:
        """Static input scales or a kv_cache_scheme are calibrated on data when the checkpoint is made."""
        return self.preset.static_input or self.kv_cache_scheme is not None

    # ------------------------------------------------------------------------------------------------
    # files

    def to_yaml(self) -> str:
        import yaml

        if self.preset.is_preset and not self.preset.static_input:
            mod = {"targets": ["Linear"], "ignore": list(self.ignore), "scheme": self.scheme}
        else:  # spelled out; compressed-tensors names config groups group_N (vLLM matches on those names)
            mod = {"ignore": list(self.ignore), "config_groups": {"group_0": self.preset.config_group()}}
        if self.kv_cache_scheme is not None:
            mod["kv_cache_scheme"] = dict(self.kv_cache_scheme)
        doc = {"default_stage": {"default_modifiers": {"QuantizationModifier": mod}}}
        header = (
            f"# fp8probe recipe for {self.model}: {self.scheme}, {len(self.quantized)} fused groups in FP8, "
            f"{len(self.kept)} kept BF16{self._kv_map()}\n"
            f"# {self._constraint()}; measured {self.metric} {self.measured}"
            f"{' on held-out prompts' if self.split else ''}\n"
        )
        return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)

    def kv_layers(self, layers) -> tuple[int, ...]:
        """Of a model's attention layers, those whose KV cache this recipe puts in FP8 (none without one)."""
        if self.kv_cache_scheme is None:
            return ()
        return tuple(i for i in layers if i not in set(self.kv_skip_layers))

    def _kv_map(self) -> str:
        if not self.kv_skip_layers:
            return ""
        skip = ", ".join(map(str, self.kv_skip_layers))
        return f"; KV cache BF16 in layers {skip} (vLLM's kv_cache_dtype_skip_layers; recipe.json, vllm.yaml)"

    def _constraint(self) -> str:
        if self.memory_target:
            return f"memory target {self.memory_target['kind']} >= {self.memory_target['value']}"
        return f"budget {self.metric} <= {self.budget}"

    def record(self) -> RecipeRecord:
        """recipe.json's record: how this recipe was chosen."""
        return RecipeRecord(
            model=self.model,
            scheme=self.scheme,
            kv_cache_scheme=self.kv_cache_dtype,
            budget=self.budget,
            metric=self.metric,
            predicted=self.predicted,
            measured=self.measured,
            measured_metrics=self.measured_metrics,
            bytes_saved=self.bytes_saved,
            kept=self.kept,
            quantized=self.quantized,
            kept_scores=self.kept_scores,
            group_units=self.group_units,
            search=self.search,
            sweep=self.sweep,
            form=self.form,
            target=self.target,
            kv_scale=self.kv_scale,
            memory_target=self.memory_target,
            fp8_share=self.fp8_share,
            effective_bits=self.effective_bits,
            measured_search=self.measured_search,
            measured_interval=self.measured_interval,
            split=self.split,
            measured_engine=self.measured_engine,
            kv_skip_layers=list(self.kv_skip_layers) or None,
            kv_tokens=self.kv_tokens,
            kv_context=self.kv_context,
        )

    def to_json(self) -> dict:
        return self.record().to_json()

    def write(self, out_dir: str | Path) -> None:
        """DIR/recipe.yaml (llm-compressor's format) and DIR/recipe.json (how it was chosen)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "recipe.yaml", self.to_yaml())
        self.record().write(out / RecipeRecord.KIND)


def read_recipe(path: str | Path) -> Recipe:
    """A recipe.yaml (fp8probe's, or any llm-compressor recipe of that shape), validated."""
    import yaml

    p = Path(path)
    if p.is_dir():
        raise FP8ProbeError(f"{path} is a directory; pass its recipe.yaml")
    if not p.is_file():
        raise FP8ProbeError(f"no such recipe file: {path}")
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise FP8ProbeError(f"{path} is not a UTF-8 YAML file") from e
    except yaml.YAMLError as e:
        raise FP8ProbeError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from e
    mods = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "QuantizationModifier" and isinstance(v, dict):
                    mods.append(v)
                else:
                    walk(v)

    walk(doc)
    if len(mods) != 1:
        raise FP8ProbeError(f"{path} must hold exactly one QuantizationModifier (found {len(mods)})")
    m = mods[0]
    unknown = sorted(set(m) - MODIFIER_KEYS)
    if unknown:
        raise FP8ProbeError(
            f"{path}: unsupported QuantizationModifier key {unknown[0]!r}; fp8probe reads "
            f"{', '.join(sorted(MODIFIER_KEYS))} (write recipes with `fp8probe recipe`)"
        )
    scheme = _scheme_of(m, path)
    ignore = m.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise FP8ProbeError(f"{path}: `ignore` must be a list of module names, got {ignore!r}")
    for pattern in ignore:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as e:
                raise FP8ProbeError(
                    f"{path}: ignore pattern {pattern!r} is not a valid regular expression ({e})"
                ) from e
    kv = m.get("kv_cache_scheme")
    if kv is not None and not isinstance(kv, dict):
        raise FP8ProbeError(f"{path}: `kv_cache_scheme` must be a mapping such as {KV_CACHE_SCHEMES['fp8']}")
    kv_name = kv_cache_name(kv) if kv is not None else None
    recipe = Recipe(scheme=scheme.name, ignore=list(ignore), kv_cache_dtype=kv_name, kv_cache_scheme=kv)
    _read_info(recipe, p.parent / "recipe.json")
    return recipe


INFO_FIELDS = (
    "model",
    "budget",
    "metric",
    "predicted",
    "measured",
    "bytes_saved",
    "quantized",
    "kept",
    "sweep",
    "form",
    "target",
    "kv_scale",
    "memory_target",
    "fp8_share",
    "effective_bits",
    "measured_search",
    "measured_interval",
    "split",
    "measured_engine",
    "kv_skip_layers",
    "kv_tokens",
    "kv_context",
)


def _read_info(recipe: Recipe, path: Path) -> None:
    """How the recipe was chosen, from the recipe.json written beside it (when it describes this recipe)."""
    try:
        info = RecipeRecord.read(path, "")
    except FP8ProbeError:  # none, or not one this fp8probe reads: the recipe is what its YAML says
        return
    if info.scheme != recipe.scheme or info.kv_cache_scheme != recipe.kv_cache_dtype:
        return
    for k in INFO_FIELDS:
        if getattr(info, k) is not None:
            setattr(recipe, k, getattr(info, k))
    if recipe.form not in FORMS or recipe.kv_scale not in ("calibrated", "unit"):
        recipe.form, recipe.kv_scale = "free", "calibrated"


def _scheme_of(m: dict, path) -> Scheme:
    """A preset `scheme:` with `targets: [Linear]`, or exactly one config group over Linear."""
    if "scheme" in m and "config_groups" in m:
        raise FP8ProbeError(f"{path}: give either `scheme` or `config_groups`, not both")
    if "config_groups" in m:
        groups = m["config_groups"]
        if not isinstance(groups, dict) or len(groups) != 1:
            raise FP8ProbeError(f"{path}: fp8probe reads exactly one config group (one scheme for every FP8 Linear)")
        (group,) = groups.values()
        if not isinstance(group, dict) or group.get("targets") != ["Linear"]:
            raise FP8ProbeError(f"{path}: the config group must have `targets: [Linear]`")
        try:
            return Scheme.from_specs(group.get("weights"), group.get("input_activations"))
        except FP8ProbeError as e:
            raise FP8ProbeError(f"{path}: {e}") from e
    if "scheme" not in m or not isinstance(m["scheme"], str):
        raise FP8ProbeError(f"{path}: the QuantizationModifier needs a preset `scheme` (FP8, FP8_DYNAMIC, FP8_BLOCK)")
    targets = m.get("targets", ["Linear"])
    if targets != ["Linear"]:
        raise FP8ProbeError(f"{path}: only `targets: [Linear]` is supported, got {targets}")
    scheme = Scheme.from_name(m["scheme"])
    if not scheme.is_preset:
        raise FP8ProbeError(f"{path}: {scheme.name} is not a compressed-tensors preset; write it as a config group")
    return scheme
