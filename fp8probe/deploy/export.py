"""Apply recipes where the rollouts run: a compressed-tensors checkpoint vLLM loads, and the config fragment
each RL framework reads.

    fp8probe export MODEL --recipe R.yaml [R2.yaml ...] --out OUT [--target vllm verl nemo-rl ... | all]

Before anything is written, every recipe is checked for what vLLM would refuse (a fused group split across
precisions, experts of one layer in different schemes, shapes the scheme cannot take) and every target
is matched with a recipe it can apply (frameworks.express: the one made for it with `fp8probe recipe
--target`, else the first it can express). A target that can apply none gets one line saying what it
would do instead; when no target can apply any recipe, nothing is written.

    OUT/                   with --target vllm: the checkpoint (llm-compressor's oneshot on a BF16 copy,
                           calibrated on --rollouts when the scheme has static input scales or the recipe
                           has a kv_cache_scheme: k/v scales are then stored in the checkpoint)
    OUT/vllm.yaml          arguments for `vllm serve OUT --config OUT/vllm.yaml`
    OUT/vllm_args.json     the same as keyword arguments for vllm.LLM(**args)
    OUT/frameworks/        one fragment per other target (Hydra overrides, YAML or CLI flags) and README.md:
                           per target, the recipe it applies (form, measured mismatch) or why it cannot
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from ..core.errors import FP8ProbeError, MissingExtra, one_line
from ..core.files import atomic_dir, atomic_write_json, atomic_write_text, check_writable
from ..core.records import RecipeRecord, StudentRecord
from ..core.results import Result
from ..model.identity import content_hash
from ..model.settings import ModelSource
from ..model.structure import list_units, meta_model
from ..model.student import check_finite_weights, config_kwargs, load_config, resolve_source
from ..recipe.recipe import Recipe, read_recipe
from .frameworks import Expression, Inexpressible, Target, express, render, resolve_targets

log = logging.getLogger(__name__)


def vllm_args(ckpt: Path, recipe: Recipe, max_model_len: int | None) -> dict:
    args = {
        "model": str(ckpt.resolve()),
        "quantization": "compressed-tensors",
        "dtype": "bfloat16",
        "kv_cache_dtype": "fp8" if recipe.kv_cache_scheme is not None else "auto",
    }
    if recipe.kv_cache_scheme is not None and recipe.kv_skip_layers:  # layer indices, as vLLM's flag takes them
        args["kv_cache_dtype_skip_layers"] = [str(i) for i in recipe.kv_skip_layers]
    if max_model_len:
        args["max_model_len"] = int(max_model_len)
    return args


@dataclass
class TargetPlan:
    target: Target
    recipe_path: Path | None = None
    recipe: Recipe | None = None
    expression: Expression | None = None
    reason: str | None = None  # why no recipe can be applied

    def summary(self) -> str:
        t = self.target
        if self.expression is None:
            return f"{t.name}: cannot apply: {self.reason}"
        r, e = self.recipe, self.expression
        what = (f"{len(e.fp8)} units in {r.scheme}" if e.fp8 else "BF16 weights") + (" + FP8 KV cache" if e.kv else "")
        m = f"; measured {r.metric} {r.measured:.4g}" if r.measured is not None else ""
        return f"{t.name}: {what} (form {r.form}{m}) from {self.recipe_path}"


def plan_targets(targets: list[Target], recipes: list[tuple[Path, Recipe]], units, n_blocks: int) -> list[TargetPlan]:
    """For each target, the recipe it applies: the one made for it first, else the first it can express."""
    plans = []
    for t in targets:
        ordered = sorted(recipes, key=lambda pr: pr[1].target != t.name)
        plan = TargetPlan(t)
        for path, r in ordered:
            try:
                e = express(t, r, units, n_blocks)
            except Inexpressible as err:
                plan.reason = plan.reason or str(err)
                continue
            plan.recipe_path, plan.recipe, plan.expression, plan.reason = path, r, e, None
            break
        plans.append(plan)
    return plans


@dataclass(frozen=True)
class Exported(Result):
    """What `export` made: `out` the output directory (with the vllm target: the checkpoint), a plan per target."""

    plans: list[TargetPlan]

    def warnings(self) -> list[str]:
        return [w for p in self.plans if p.expression for w in p.expression.warnings]

    def describe(self, seconds: float) -> str:
        """What `fp8probe export` prints: per target, what it applies (or why it cannot), then where it all is."""
        config = self.out / "vllm.yaml"
        serve = f" (vllm serve {self.out} --config {config})" if config.exists() else ""
        return "\n".join([p.summary() for p in self.plans] + [f"export: {seconds:.0f} s -> {self.out}{serve}"])


def export(
    source: ModelSource,
    recipe,
    out: str | Path,
    *,
    rollouts=None,
    max_model_len: int | None = None,
    num_calibration_samples: int = 64,
    targets=("vllm",),
    verl=None,
) -> Exported:
    """Write what each target needs to apply the recipe(s) (`recipe`: one path or several) into `out`, for the
    student `source` names (its model, and whether custom code and pickled weights may be loaded)."""
    model, trust_remote_code, allow_pickle = source.model, source.trust_remote_code, source.allow_pickle
    paths = [Path(recipe)] if isinstance(recipe, (str, Path)) else [Path(r) for r in recipe]
    if not paths:
        raise FP8ProbeError("give at least one `recipe`")
    targets = resolve_targets(targets)
    recipes = [(p, read_recipe(p)) for p in paths]
    out = check_writable(out)
    if out.exists() and any(out.iterdir()):
        raise FP8ProbeError(f"{out} exists and is not empty; choose another `out`")
    cfg = load_config(model, trust_remote_code, allow_pickle)
    units = list_units(meta_model(cfg))
    for p, r in recipes:
        r.check_model(units, str(p))
        r.check_vllm_loadable(units)
    plans = plan_targets(targets, recipes, units, int(cfg.num_hidden_layers))
    usable = [p for p in plans if p.expression is not None]
    if not usable:
        raise FP8ProbeError(
            plans[0].reason
            if len(plans) == 1
            else "no target can apply these recipes: " + "; ".join(p.reason for p in plans)
        )
    vllm = next((p for p in usable if p.target.name == "vllm"), None)
    if vllm is not None and vllm.recipe.needs_calibration and rollouts is None:
        raise FP8ProbeError(
            "this recipe needs calibration data (static input scales or a kv_cache_scheme): "
            "pass `rollouts` DIR (a sweep directory holds them)"
        )
    if vllm is not None and rollouts is not None:
        rollouts.check_fits(cfg, "the calibration rollouts")
    src, kwargs = resolve_source(model, allow_pickle)
    gguf = "gguf_file" in kwargs
    if vllm is not None and gguf:
        raise FP8ProbeError(
            "llm-compressor refuses GGUF-quantized models; convert to safetensors first "
            "(the embedded student is converted automatically)"
        )
    model_path = "MODEL_HF_DIR" if gguf else str(src)
    with atomic_dir(out) as tmp:
        final = out.resolve()
        (tmp / "frameworks").mkdir()
        if vllm is not None:
            _write_checkpoint(
                vllm.recipe_path,
                vllm.recipe,
                src,
                kwargs,
                tmp,
                final,
                rollouts,
                max_model_len,
                num_calibration_samples,
                trust_remote_code,
                model or src,
            )
        lines = [
            "# Rollout configs written by fp8probe export",
            "",
            f"Model (BF16, as the trainer holds it): {model_path}",
            "",
        ]
        for p in plans:
            lines.append(f"- {p.summary()}")
            if p.expression is None:
                continue
            lines += [f"  - warning: {w}" for w in p.expression.warnings]
            if p.target.name == "vllm":
                lines.append(f"  - files: the checkpoint in {final}, vllm.yaml, vllm_args.json")
                continue
            files = render(replace(p.expression, options=verl), model_path, units)
            for name, text in files.items():
                atomic_write_text(tmp / "frameworks" / name, text)
            lines.append(f"  - files: {', '.join('frameworks/' + n for n in files)}")
        lines += ["", "What each framework can apply, and where this was read:", ""]
        lines += [f"- {t.name} ({t.title}): form {t.form}; {t.how}. Source: {t.source}" for t in targets]
        atomic_write_text(tmp / "frameworks" / "README.md", "\n".join(lines) + "\n")
    return Exported(out, plans)


def _write_checkpoint(
    recipe_path: Path,
    spec: Recipe,
    src,
    kwargs,
    tmp: Path,
    final: Path,
    rollouts,
    max_model_len,
    num_calibration_samples: int,
    trust_remote_code: bool,
    name,
) -> None:
    """llm-compressor's oneshot on a BF16 copy, saved compressed into tmp, with vLLM's serving arguments."""
    try:
        from llmcompressor import oneshot
    except ImportError as e:
        raise MissingExtra("fp8probe export --target vllm (llm-compressor)", "export") from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("loading %s in bfloat16 for llm-compressor", name)
    tok = AutoTokenizer.from_pretrained(src, trust_remote_code=trust_remote_code, **config_kwargs(kwargs))
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, trust_remote_code=trust_remote_code, **kwargs)
    check_finite_weights(hf, str(name))
    student = StudentRecord(
        name=student_name(name), sha256=content_hash(hf), weights="bfloat16, as llm-compressor read them"
    )
    oneshot_kwargs = {}
    if spec.needs_calibration:
        from datasets import Dataset

        ids, am = rollouts.input_ids, rollouts.attention_mask
        rows = [
            {"input_ids": ids[i, : int(am[i].sum())].tolist(), "attention_mask": [1] * int(am[i].sum())}
            for i in range(ids.shape[0])
        ][:num_calibration_samples]
        oneshot_kwargs = {
            "dataset": Dataset.from_list(rows),
            "num_calibration_samples": len(rows),
            "max_seq_length": int(am.sum(1).max()),
        }
    log.info("llm-compressor oneshot: %s, %d ignored names", spec.scheme, len(spec.ignore))
    try:
        oneshot(model=hf, recipe=str(recipe_path), **oneshot_kwargs)
    except (ValueError, TypeError, KeyError) as e:  # llm-compressor refusing the recipe or the model
        raise FP8ProbeError(f"llm-compressor refused the recipe: {one_line(e)}") from e
    hf.save_pretrained(str(tmp), save_compressed=True)
    tok.save_pretrained(str(tmp))
    student.write(tmp / StudentRecord.KIND)
    shutil.copy(recipe_path, tmp / "recipe.yaml")
    spec.record().write(tmp / RecipeRecord.KIND)  # beside it, how it was chosen (its per-layer KV map: the audit's)
    args = vllm_args(final, spec, max_model_len)
    atomic_write_json(tmp / "vllm_args.json", args)
    serve = {k.replace("_", "-"): v for k, v in args.items() if k != "model"}
    atomic_write_text(
        tmp / "vllm.yaml",
        f"# vllm serve {final} --config {final / 'vllm.yaml'}\n" + yaml.safe_dump(serve, sort_keys=False),
    )


def student_name(name) -> str:
    """How student.json names the student an export was made from: a path made absolute (an audit elsewhere finds
    it), a model id or the embedded student's name as given."""
    p = Path(str(name)).expanduser()
    return str(p.resolve()) if p.exists() else str(name)


def read_checkpoint_fp8(ckpt: str | Path) -> dict:
    """name -> (fp8 weight, weight_scale) of every FP8 Linear in a compressed-tensors checkpoint."""
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(ckpt).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            keys = set(st.keys())
            for k in keys:
                if k.endswith(".weight_scale"):
                    base = k[: -len(".weight_scale")]
                    if f"{base}.weight" in keys:
                        out[base] = (st.get_tensor(f"{base}.weight"), st.get_tensor(k))
    return out
