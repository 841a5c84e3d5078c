"""From a sensitivity table to a mixed-precision FP8 recipe under a mismatch budget, and its files.

Selection works on whole fused groups (q/k/v together, gate/up together, all experts of a layer), the
only splits vLLM can load:

1. score each group from the sweep (the sum of its units' metric when the sweep was per unit), and rank
   groups by score per byte saved, cheapest first;
2. predict a recipe's mismatch as the sum of its groups' scores (per-unit scores do not add up exactly);
3. measure real combinations with the hooks and bisect over the ranked list for the longest prefix whose
   *measured* mismatch stays within the budget: a handful of measured passes, not one per group.

The recipe is written as llm-compressor's own YAML (a QuantizationModifier with `targets: [Linear]`, the
scheme, an explicit `ignore` list of module names and an optional `kv_cache_scheme`), parsed back by
llm-compressor's recipe parser in the tests, and described in recipe.json beside it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from .capacity import Precision
from .errors import FP8ProbeError
from .fp8 import Scheme

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
KV_CACHE_SCHEMES = {
    # what llm-compressor's QuantizationModifier takes as kv_cache_scheme (vLLM reads k_scale / v_scale)
    "fp8": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True},
}


@dataclass
class GroupScore:
    group: str
    units: list[str]
    block: int
    score: float
    bytes_saved: int

    @property
    def per_byte(self) -> float:
        return self.score / max(self.bytes_saved, 1)


@dataclass
class Recipe:
    model: str
    scheme: str
    quantized: list[str]  # fused groups in FP8
    kept: list[str]  # fused groups kept BF16
    group_units: dict[str, list[str]]
    kv_cache: str | None = None
    budget: float | None = None
    metric: str = "kl_q_p"
    predicted: float | None = None
    measured: float | None = None
    measured_metrics: dict = field(default_factory=dict)
    bytes_saved: int = 0
    kept_scores: list[dict] = field(default_factory=list)
    search: list[dict] = field(default_factory=list)
    sweep: str | None = None
    routers: bool = False  # the model has MoE routers, kept BF16 by a regex

    def ignore(self) -> list[str]:
        names = ["lm_head"]
        if self.routers:
            names.append("re:.*mlp.gate$")
        for g in self.kept:
            for u in self.group_units[g]:
                names.append(_ignore_name(u))
        return names

    def quantized_units(self) -> list[str]:
        return [u for g in self.quantized for u in self.group_units[g]]

    def to_yaml(self) -> str:
        import yaml

        mod = {"targets": ["Linear"], "ignore": self.ignore(), "scheme": self.scheme}
        if self.kv_cache:
            mod["kv_cache_scheme"] = dict(KV_CACHE_SCHEMES[self.kv_cache])
        doc = {"default_stage": {"default_modifiers": {"QuantizationModifier": mod}}}
        header = (f"# fp8probe recipe for {self.model}: {self.scheme}, {len(self.quantized)} fused groups in FP8, "
                  f"{len(self.kept)} kept BF16\n# budget {self.metric} <= {self.budget}; measured {self.measured}\n")
        return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)

    def to_json(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION, "model": self.model, "scheme": self.scheme,
            "kv_cache_scheme": self.kv_cache, "budget": self.budget, "metric": self.metric,
            "predicted": self.predicted, "measured": self.measured, "measured_metrics": self.measured_metrics,
            "bytes_saved": self.bytes_saved, "kept": self.kept, "quantized": self.quantized,
            "kept_scores": self.kept_scores, "group_units": self.group_units, "search": self.search,
            "sweep": self.sweep,
        }

    def write(self, out_dir: str | Path) -> None:
        from ._files import atomic_write_json, atomic_write_text

        out = Path(out_dir)
        atomic_write_text(out / "recipe.yaml", self.to_yaml())
        atomic_write_json(out / "recipe.json", self.to_json())


def _ignore_name(unit: str) -> str:
    if unit.endswith(".experts"):  # llm-compressor unpacks experts into Linears named experts.<i>.<proj>
        return "re:^" + re.escape(unit) + r"\..*"
    return unit


# ---------------------------------------------------------------------------------------------------
# selection


def group_scores(sensitivity, metric: str = "kl_q_p", members: dict[str, list[str]] | None = None) -> list[GroupScore]:
    """One score per fused group from a sensitivity table (per unit or per group).

    `members` maps each group to its unit names (Student.groups()); without it, a per-unit table's rows
    name the members.
    """
    import pandas as pd

    df = sensitivity if isinstance(sensitivity, pd.DataFrame) else pd.read_csv(sensitivity)
    if metric not in df.columns:
        raise FP8ProbeError(f"metric {metric!r} is not a column of the sensitivity table")
    df = df[~df["kind"].isin(["kv", "model"])]
    if df.empty:
        raise FP8ProbeError("the sensitivity table has no unit rows")
    out = []
    for g, rows in df.groupby("group", sort=False):
        score = rows[metric].clip(lower=0).sum() if metric != "top1_agree" else (1 - rows[metric]).sum()
        units = members[g] if members and g in members else list(rows["unit"])
        out.append(GroupScore(g, units, int(rows["block"].min()), float(score), int(rows["bytes_saved"].sum())))
    return out


def rank_groups(groups: list[GroupScore]) -> list[GroupScore]:
    """Least sensitive per byte saved first (ties: later blocks first, then name, for a stable order)."""
    return sorted(groups, key=lambda g: (g.per_byte, -g.block, g.group))


def make_recipe(sensitivity, budget: float, student, rollouts, scheme="FP8_DYNAMIC", metric: str = "kl_q_p",
                kv_cache: str | None = None, keep_first: int = 0, keep_last: int = 0, keep=(), force=(),
                reference=None, batch_size: int = 8, max_passes: int = 12, sweep_dir: str | None = None,
                progress: bool = False) -> Recipe:
    """The FP8 recipe that saves the most weight bytes while the measured `metric` stays <= budget."""
    from .measure import measure
    from .reference import Reference

    scheme = Scheme.from_name(scheme)
    if budget is None or budget < 0:
        raise FP8ProbeError("--budget must be a non-negative number")
    if kv_cache is not None and kv_cache not in KV_CACHE_SCHEMES:
        raise FP8ProbeError(f"unknown KV-cache scheme {kv_cache!r}; supported: {', '.join(KV_CACHE_SCHEMES)}")
    members = {g: [u.name for u in us] for g, us in student.groups().items()}
    groups = group_scores(sensitivity, metric, members)
    known = {g.group for g in groups}
    # units in a student's own groups, to map unit-level keep/force names to their group
    unit_group = {u.name: u.group for u in student.quantizable}
    for u in student.quantizable:
        unit_group.setdefault(u.group, u.group)
    missing = [g for g in known if g not in unit_group]
    if missing:
        raise FP8ProbeError(f"the sweep lists groups this model lacks ({missing[0]} ...): was it run on another model?")
    sizes = {u.name: u.params for u in student.quantizable}
    sizes.update({g: sum(u.params for u in us) for g, us in student.groups().items()})
    df = sensitivity if not isinstance(sensitivity, (str, Path)) else None
    if df is not None and "params" in df.columns:
        for unit, params in zip(df["unit"], df["params"]):
            if unit in sizes and int(params) != sizes[unit]:
                raise FP8ProbeError(f"the sweep gives {unit} {int(params):,} parameters, this model {sizes[unit]:,}: "
                                    "was it run on another model?")
    unscored = [g for g in members if g not in known]
    if unscored:
        raise FP8ProbeError(f"the sweep scores {len(known)} of this model's {len(members)} fused groups (none for "
                            f"{unscored[0]}): is it truncated? run the sweep again")

    def groups_of(names, what):
        out = set()
        for n in names:
            if n not in unit_group:
                raise FP8ProbeError(f"--{what} {n}: no such unit or group; see `fp8probe units`")
            out.add(unit_group[n])
        return out

    n_blocks = student.model.config.num_hidden_layers
    keep_set = groups_of(keep, "keep")
    keep_set |= {g.group for g in groups if g.block < keep_first or g.block >= n_blocks - keep_last}
    force_set = groups_of(force, "force")
    both = keep_set & force_set
    if both:
        raise FP8ProbeError(f"{sorted(both)[0]} is both kept and forced; choose one")
    by_name = {g.group: g for g in groups}
    forced = [by_name[g] for g in sorted(force_set)]
    ranked = rank_groups([g for g in groups if g.group not in keep_set and g.group not in force_set])

    if reference is None:
        reference = Reference(student, rollouts, batch_size)
    memo: dict[int, dict] = {}

    def chosen(k):
        return forced + ranked[:k]

    def predicted(k):
        return sum(g.score for g in chosen(k))

    def measured(k):
        if k not in memo:
            units = [u for g in chosen(k) for u in g.units]
            if not units and kv_cache is None:
                from .mismatch import METRICS

                memo[k] = {m: 1.0 if m in ("top1_agree", "token_mult_prob_error") else 0.0 for m in METRICS}
            else:
                memo[k] = measure(student, rollouts, scheme, units=units, kv=kv_cache, reference=reference)
            log.info("recipe search: %d of %d groups in FP8 -> %s = %.4g (predicted %.4g)", len(chosen(k)),
                     len(groups), metric, _value(memo[k], metric), predicted(k))
        return _value(memo[k], metric)

    n = len(ranked)
    if measured(0) > budget:
        raise FP8ProbeError(f"even with only the forced groups{' and the FP8 KV cache' if kv_cache else ''} in FP8 "
                            f"the measured {metric} is {measured(0):.3g} > budget {budget}; raise the budget")
    lo, hi = 0, n + 1  # measured(lo) <= budget; hi: first k known to exceed (n + 1: none known)
    if measured(n) <= budget:
        lo = n
    else:
        hi = n
        guess = max((k for k in range(n + 1) if predicted(k) <= budget), default=0)
        guess = min(max(guess, 1), n - 1) if n > 1 else 0
        if guess > 0:
            (lo, hi) = (guess, hi) if measured(guess) <= budget else (lo, guess)
        while hi - lo > 1 and len(memo) < max_passes:
            mid = (lo + hi) // 2
            if measured(mid) <= budget:
                lo = mid
            else:
                hi = mid
    k = lo
    if k == 0 and not forced and kv_cache is None and n:
        raise FP8ProbeError(f"no fused group fits the budget: the least sensitive one alone measures {metric} "
                            f"{measured(1):.3g} > {budget}; raise the budget")
    quantized = {g.group for g in chosen(k)}
    kept = [g.group for g in groups if g.group not in quantized]
    group_units = {g.group: g.units for g in groups}
    result = memo[k] if k in memo else {metric: measured(k)}
    return Recipe(
        model=student.name, scheme=scheme.name, quantized=[g.group for g in groups if g.group in quantized],
        kept=kept, group_units=group_units, kv_cache=kv_cache, budget=budget, metric=metric,
        predicted=predicted(k), measured=_value(result, metric), measured_metrics=result,
        bytes_saved=sum(by_name[g].bytes_saved for g in quantized),
        kept_scores=[{"group": g, "score": by_name[g].score, "bytes_saved": by_name[g].bytes_saved,
                      "reason": "keep" if g in keep_set else "budget"} for g in kept],
        search=[{"groups_fp8": len(chosen(kk)), "predicted": predicted(kk), "measured": _value(v, metric)}
                for kk, v in sorted(memo.items())],
        sweep=sweep_dir, routers=any(u.kind == "router" for u in student.units),
    )


def _value(metrics: dict, metric: str) -> float:
    v = metrics[metric]
    return 1 - v if metric == "top1_agree" else v  # a budget bounds disagreement, not agreement


# ---------------------------------------------------------------------------------------------------
# reading recipe.yaml back


@dataclass
class RecipeSpec:
    """What a recipe.yaml says: scheme, ignore list, KV-cache scheme."""

    scheme: Scheme
    ignore: list[str]
    targets: list[str]
    kv_cache: dict | None

    def is_ignored(self, name: str) -> bool:
        """compressed-tensors' rule for module names: "re:" patterns match from the start, others exactly."""
        return any(re.match(p[3:], name) if p.startswith("re:") else name == p for p in self.ignore)

    def quantized_units(self, model) -> list:
        from .student import list_units

        return [u for u in list_units(model) if u.quantizable and not self.is_ignored(u.name)
                and not (u.kind == "expert" and self.is_ignored(u.name + ".0.gate_proj"))]

    def check_model(self, model, where: str = "the recipe") -> None:
        """Refuse a recipe whose ignore list names modules this model lacks: it was made for another model."""
        names = {n for n, _ in model.named_modules()}
        foreign = [p for p in self.ignore if not p.startswith("re:") and p != "lm_head" and p not in names]
        if foreign:
            raise FP8ProbeError(f"{where} keeps {foreign[0]} in BF16, but this model has no such module"
                                f"{f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''}: it was made for "
                                "another model; make a recipe from a sweep of this one")

    def precision(self, model) -> Precision:
        return Precision(self.scheme, frozenset(u.name for u in self.quantized_units(model)), self.scheme.static_input)


def read_recipe_yaml(path: str | Path) -> RecipeSpec:
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
    unknown = sorted(set(m) - _MODIFIER_KEYS)
    if unknown:
        raise FP8ProbeError(f"{path}: unsupported QuantizationModifier key {unknown[0]!r}; fp8probe reads "
                            f"{', '.join(sorted(_MODIFIER_KEYS))} (write recipes with `fp8probe recipe`)")
    if "scheme" not in m or not isinstance(m["scheme"], str):
        raise FP8ProbeError(f"{path}: the QuantizationModifier needs a preset `scheme` (FP8, FP8_DYNAMIC, FP8_BLOCK)")
    targets = m.get("targets", ["Linear"])
    if targets != ["Linear"]:
        raise FP8ProbeError(f"{path}: only `targets: [Linear]` is supported, got {targets}")
    ignore = m.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise FP8ProbeError(f"{path}: `ignore` must be a list of module names, got {ignore!r}")
    kv = m.get("kv_cache_scheme")
    if kv is not None and not isinstance(kv, dict):
        raise FP8ProbeError(f"{path}: `kv_cache_scheme` must be a mapping such as {KV_CACHE_SCHEMES['fp8']}")
    for p_ in ignore:
        if p_.startswith("re:"):
            try:
                re.compile(p_[3:])
            except re.error as e:
                raise FP8ProbeError(f"{path}: ignore pattern {p_!r} is not a valid regular expression ({e})") from e
    return RecipeSpec(Scheme.from_name(m["scheme"]), list(ignore), targets, kv)


# the QuantizationModifier keys fp8probe writes and reads
_MODIFIER_KEYS = {"targets", "ignore", "scheme", "kv_cache_scheme"}
