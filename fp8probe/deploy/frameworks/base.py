"""What a rollout framework is to fp8probe: a Target (what its engine can apply, read from its source), a renderer
(the config fragment it reads), both registered by one module per framework (frameworks/verl.py, ...).

Most RL frameworks do not load an FP8 checkpoint once: they re-quantize the trainer's BF16 weights at
every weight sync, with their own fixed scheme, and take only a few knobs. So a recipe reaches a rollout
only in the *form* its framework can express (recipe.FORMS):

    free        any set of fused groups in BF16 (an ignore list of module names)
    keywords    NeMo-RL: first/last N blocks in BF16 plus substring keywords; keywords that are whole
                module names select single groups, so any free recipe is expressible
    first-last  the first N and last M decoder blocks in BF16, the rest in FP8
    all         every Linear in FP8 (lm_head, embeddings and MoE routers stay BF16)
    none        no FP8 weights (BF16 rollouts); an FP8 KV cache only where the framework takes one

Each Target below was read from the framework's own source; `source` names the file and the released
version (PyPI) or the commit. tests/deploy/test_frameworks.py checks every key we write against those packages'
shipped configs and argument parsers (verl, OpenRLHF, TRL, SkyRL) or against the key lists read from the
repositories at a pinned commit (NeMo-RL, slime: no real PyPI release). `express` refuses, in one line
that says what the framework would do instead, a recipe the framework cannot apply; `render` writes the
config fragment in the framework's own format, with the renderer its module registered.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...core.errors import FP8ProbeError
from ...core.schemes import Scheme
from ...core.settings import Settings, opt
from ...recipe.forms import FORMS, narrower

if TYPE_CHECKING:  # kept light: `fp8probe --help` lists the targets without importing torch
    from ...model.structure import Unit
    from ...recipe.recipe import Recipe


# importance-sampling truncation every framework defaults to (token-level TIS, ratio clipped at 2)
IS_CLIP = 2.0


@dataclass(frozen=True)
class Target:
    name: str
    title: str
    form: str  # recipe.FORMS: what its rollout engine can express
    scheme: str | None  # the scheme its engine quantizes weights with; None: any (vllm) or no FP8 weights
    kv: str | None  # the FP8 KV-cache dtype name it takes, or None: it has no FP8 KV-cache setting
    kv_scale: str  # the k/v scales its engine uses: "calibrated" or "unit" (1.0)
    fmt: str  # the file it reads: "yaml", "hydra" (overrides), "cli" (flags), "checkpoint"
    source: str  # where this was read
    how: str  # how it applies FP8 (one line)
    # whether its vLLM takes kv_cache_dtype_skip_layers (a per-layer KV map), or why not (one line)
    kv_skip: bool | str = "fp8probe writes one KV-cache dtype for every layer for it"

    @property
    def weights(self) -> bool:
        return FORMS[self.form].weights


TARGETS: dict[str, Target] = {}  # name -> Target, in the order their modules register them
RENDERERS: dict[str, object] = {}  # name -> fn(expression, model_path, units) -> {file name: text}
# name -> (the files it reads, fn(files {name: text}, units, n_blocks) -> Applied): what its engine would run
RESOLVERS: dict[str, tuple] = {}


@dataclass
class Applied:
    """What a framework's engine runs, read back from the fragment it reads (`fp8probe audit`)."""

    fp8: set  # quantizable units in FP8
    kv: str | None  # the FP8 KV-cache dtype it sets, or None
    kv_skip: set = field(default_factory=set)  # layers whose KV cache it keeps in the model dtype (a per-layer map)


def resolves(target: "Target", *files: str):
    """Decorator of a framework's reader: the fragment's files, read as that framework reads them."""

    def deco(fn):
        RESOLVERS[target.name] = (files, fn)
        return fn

    return deco


def skipped_layers(listed) -> set[int]:
    """The layer indices of a per-layer KV map as an engine reads it: a list (vllm.yaml's), or the text of one an
    override writes ("[0,3]", '["0","3"]'), read as YAML as Hydra and OmegaConf read it; names (`sliding_window`) are
    not indices."""
    import yaml

    items = yaml.safe_load(listed) if isinstance(listed, str) else listed
    return {int(x) for x in items or [] if str(x).isdigit()}


def every_linear(units) -> set:
    """The units a framework that quantizes every Linear puts in FP8 (MoE routers are not quantizable units)."""
    return {u.name for u in units if u.quantizable}


def overrides(text: str) -> dict[str, str]:
    """key -> value of the Hydra/OmegaConf overrides (or key -> "" of bare flags) in a rendered shell fragment, its
    command and comments left out."""
    body = [ln.rstrip("\\ ").strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    out = {}
    for tok in shlex.split(" ".join(body[1:])):
        key, _, value = tok.partition("=")
        out[key.lstrip("+")] = value
    return out


def flags(text: str) -> dict[str, str]:
    """--flag -> value ("" for a bare flag) of the last command in a rendered shell fragment."""
    lines = [ln.rstrip("\\ ").strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    start = max(i for i, ln in enumerate(lines) if not ln.startswith("--"))
    toks = shlex.split(" ".join(lines[start:]))
    out, i = {}, 0
    while i < len(toks):
        if toks[i].startswith("--"):
            has_value = i + 1 < len(toks) and not toks[i + 1].startswith("--")
            out[toks[i]] = toks[i + 1] if has_value else ""
            i += 2 if has_value else 1
        else:
            i += 1
    return out


def register(target: Target):
    """Decorator of a framework's renderer: registers the target and how its config fragment is written."""

    def deco(fn):
        if target.name in TARGETS:
            raise ValueError(f"framework target {target.name!r} registered twice")
        TARGETS[target.name] = target
        RENDERERS[target.name] = fn
        return fn

    return deco


def render(e: "Expression", model_path: str, units: list["Unit"]) -> dict[str, str]:
    """File name -> text: the fragment the framework reads, with its mismatch-correction keys."""
    if e.target.name not in RENDERERS:
        raise FP8ProbeError(f"internal: no renderer for target {e.target.name}")
    return RENDERERS[e.target.name](e, model_path, units)


def header(t: Target) -> str:
    return f"# fp8probe: {t.title}. {t.how}.\n# Read from {t.source}.\n"


def resolve_targets(names) -> list[Target]:
    """`--target` values: names, or "all" for every target."""
    names = list(names) or ["vllm"]
    if "all" in names:
        return list(TARGETS.values())
    out = []
    for n in names:
        if n not in TARGETS:
            raise FP8ProbeError(f"unknown `target` {n!r}; choose from {', '.join(TARGETS)} or all")
        if TARGETS[n] not in out:
            out.append(TARGETS[n])
    return out


@dataclass(frozen=True)
class TargetSettings(Settings):
    """The rollout framework a recipe is made for (`fp8probe recipe --target`): its form, FP8 scheme and KV-cache
    scales (recipe_form), which the recipe layer below cannot know."""

    target: str | None = opt(
        None,
        "a rollout framework: its form, FP8 scheme and KV-cache scales (see `fp8probe export`)",
        choices=lambda: TARGETS,
    )

    @property
    def chosen(self) -> Target | None:
        return TARGETS[self.target] if self.target else None


def recipe_form(
    target: Target | None, form: str | None, kv_cache_dtype: str | None, sweep_scheme: str, sweep_dir="SWEEP"
) -> tuple[str, str, str]:
    """(form, scheme, kv_scale) of the recipe search for `target`, refusing what it or the sweep cannot give."""
    form = form or (target.form if target else "free")
    if target is None:
        return form, sweep_scheme, "calibrated"
    if form not in narrower(target.form):
        raise FP8ProbeError(
            f"{target.title} cannot apply `form` {form} recipes (it takes {target.form}); "
            f"use one of: {', '.join(narrower(target.form))}"
        )
    if kv_cache_dtype and target.kv is None:
        raise FP8ProbeError(f"{target.title} has no FP8 KV-cache setting; drop `kv_cache_dtype`")
    scheme = target.scheme or sweep_scheme
    if not FORMS[form].fixed and scheme != sweep_scheme:  # its groups are chosen on the sweep's scores
        raise FP8ProbeError(
            f"{target.title} quantizes with {scheme}, but {sweep_dir} was swept with {sweep_scheme}: "
            f"run `fp8probe sweep --rollouts {sweep_dir} --scheme {scheme} --out DIR` and make the "
            "recipe from DIR"
        )
    return form, scheme, target.kv_scale


# ----------------------------------------------------------------------------------------------------
# what a recipe looks like to a framework


@dataclass
class Expression:
    """A recipe in a framework's terms."""

    target: Target
    fp8: list[str]  # quantizable units in FP8
    kept_groups: list[str]  # fused groups kept BF16
    kept_units: list[str]  # their modules
    first: int = 0  # leading blocks entirely BF16
    last: int = 0  # trailing blocks entirely BF16
    keywords: list[str] = field(default_factory=list)  # kept modules outside those blocks
    kv: str | None = None  # the framework's FP8 KV dtype, when the recipe has an FP8 KV cache
    kv_skip: list[int] = field(default_factory=list)  # layers whose KV cache stays BF16 (kv_cache_dtype_skip_layers)
    warnings: list[str] = field(default_factory=list)
    options: object = None  # the framework's own settings where a target reads some (verl.VerlSettings)


class Inexpressible(FP8ProbeError):
    """The framework cannot apply the recipe; the message says what it would do instead."""


def _edge_blocks(kept_blocks: set[int], n_blocks: int) -> tuple[int, int]:
    first = 0
    while first < n_blocks and first in kept_blocks:
        first += 1
    last = 0
    while last < n_blocks - first and (n_blocks - 1 - last) in kept_blocks:
        last += 1
    return first, last


def express(target: Target, recipe: Recipe, units: list[Unit], n_blocks: int) -> Expression:
    """The recipe as `target` can apply it, or Inexpressible with what the framework would do instead."""
    from ...model.structure import fused_groups

    groups = fused_groups(units)
    fp8 = [u.name for u in recipe.fp8_units(units)]
    fp8_set = set(fp8)
    kept = [g for g, us in groups.items() if us[0].name not in fp8_set]
    t, form = target.title, FORMS[target.form]
    if fp8 and not target.weights:
        raise Inexpressible(f"{t}: {target.how}; it would run the recipe's {len(fp8)} FP8 units in BF16")
    if fp8 and form.every:
        from ...model.structure import scheme_blockers

        blocked = scheme_blockers([u for u in units if u.quantizable], Scheme.from_name(target.scheme))
        if blocked:
            g, why = next(iter(blocked.items()))
            raise Inexpressible(
                f"{t} puts every Linear in {target.scheme}, which cannot take {len(blocked)} of this "
                f"model's {len(groups)} fused groups ({g}: {why}): its block-FP8 kernels would "
                "refuse the model"
            )
    if fp8 and target.scheme and Scheme.from_name(recipe.scheme).name != target.scheme:
        raise Inexpressible(
            f"{t} quantizes with {target.scheme}, this recipe is {recipe.scheme}: make one with "
            f"`fp8probe recipe SWEEP --target {target.name}` (a sweep run with --scheme "
            f"{target.scheme})"
        )
    if fp8 and form.every and kept:
        raise Inexpressible(
            f"{t} cannot keep layers in BF16 ({target.how}): it would quantize the recipe's "
            f"{len(kept)} kept groups too; make one with "
            f"`fp8probe recipe SWEEP --target {target.name}`"
        )
    if not fp8 and form.every and recipe.kv_cache_dtype is None:
        raise Inexpressible(f"{t}: the recipe has no FP8 units; run BF16 rollouts (nothing to configure)")
    kept_blocks = {u.block for g in kept for u in groups[g]}
    full = {b for b in kept_blocks if all(u.name not in fp8_set for u in units if u.quantizable and u.block == b)}
    first, last = _edge_blocks(full, n_blocks) if fp8 else (0, 0)
    edge = set(range(first)) | set(range(n_blocks - last, n_blocks))
    rest = [g for g in kept if groups[g][0].block not in edge]
    if fp8 and form.edges and rest:
        raise Inexpressible(
            f"{t} keeps only whole leading/trailing blocks in BF16; this recipe also keeps "
            f"{rest[0]} (and {len(rest) - 1} more): make one with `--form first-last`"
        )
    kv = None
    if recipe.kv_cache_dtype is not None:
        if target.kv is None:
            raise Inexpressible(f"{t} has no FP8 KV-cache setting ({target.how}); it would keep the KV cache BF16")
        kv = target.kv
        if recipe.kv_skip_layers and target.kv_skip is not True:
            raise Inexpressible(
                f"{t} cannot keep some layers' KV cache in BF16 ({target.kv_skip}); it would put every layer's "
                "KV cache in FP8: remake the recipe without `kv_tokens`"
            )
    e = Expression(
        target,
        fp8,
        kept,
        [u.name for g in kept for u in groups[g]],
        first,
        last,
        [u.name for g in rest for u in groups[g]],
        kv,
        list(recipe.kv_skip_layers) if kv else [],
    )
    if kv and recipe.kv_scale == "calibrated" and target.kv_scale == "unit":
        e.warnings.append(
            f"{t} runs the FP8 KV cache with k/v scales 1.0 (it drops calibrated scales); this "
            f"recipe's KV mismatch was measured with calibrated scales: remake it with `target` "
            f"{target.name} to measure what the engine does"
        )
    if target.name == "nemo-rl" and kv and not fp8:
        raise Inexpressible(
            f"{t} takes kv_cache_dtype fp8 only together with precision fp8 (init_fp8 refuses "
            "an FP8 KV cache over BF16 weights)"
        )
    return e


# ----------------------------------------------------------------------------------------------------
# the config fragments


def ignore_keywords(kept: list[str], units: list[Unit], bf16: set[str] | None = None) -> list[str]:
    """Short ignore entries for the kept modules: NeMo-RL's quantization_ignored_layer_kws (a module stays BF16
    when a keyword is a substring of its name) and verl's SGLang ignore list (a dot-bounded part of it). A
    per-block suffix ("mlp.down_proj") stands for every module it matches when all of them are BF16 anyway
    (`bf16`: kept here or in the first/last blocks); the rest are named in full. The matches cover the kept
    set and stay inside `bf16` (checked)."""
    names = [u.name for u in units]
    want, out, covered = set(kept), [], set()
    allowed = set(bf16 or ()) | want
    for n in kept:
        m = re.match(r"^.*\.layers\.\d+\.(.+)$", n)
        suffix = m.group(1) if m else None
        hits = {x for x in names if suffix and suffix in x}
        if suffix and suffix not in out and hits <= allowed and n not in covered:
            out.append(suffix)
            covered |= hits
    for n in kept:
        if n not in covered:
            out.append(n)
            covered |= {x for x in names if n in x}
    if not want <= covered <= allowed:
        raise FP8ProbeError(f"internal: keywords would also keep {sorted(covered - allowed)[:2]} in BF16")
    return out


def verl_correction() -> list[str]:
    return [
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "algorithm.rollout_correction.rollout_is=token",
        f"algorithm.rollout_correction.rollout_is_threshold={IS_CLIP}",
    ]


def hydra(cmd: str, lines: list[str]) -> str:
    return cmd + " \\\n" + " \\\n".join(f"    {x}" for x in lines) + "\n"


def cli(cmd: str, flags: list[str]) -> str:
    parts, i = [], 0
    while i < len(flags):
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            parts.append(f"{flags[i]} {shlex.quote(flags[i + 1])}")
            i += 2
        else:
            parts.append(flags[i])
            i += 1
    return cmd + " \\\n" + " \\\n".join(f"    {p}" for p in parts) + "\n"


def yaml_text(doc: dict) -> str:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)
