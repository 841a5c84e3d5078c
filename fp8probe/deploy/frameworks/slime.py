"""slime: a block-FP8 checkpoint (its own converter) and SGLang flags on the training command."""

import shlex

from .base import IS_CLIP, Applied, Target, cli, every_linear, flags, header, register, resolves

SLIME = Target(
    "slime",
    "slime (SGLang rollout)",
    "all",
    "FP8_BLOCK",
    "fp8_e4m3",
    "unit",
    "cli",
    "THUDM/slime@002fa9d6bac4 slime/utils/arguments.py, tools/convert_hf_to_fp8.py",
    "serves a block-FP8 checkpoint; its weight sync re-quantizes a fixed list of Linear layers and never "
    "reads modules_to_not_convert",
    kv_skip="its SGLang rollout takes one --kv-cache-dtype for every layer (SGLang's per-layer dtype, PR #17530, "
    "closed unmerged)",
)


@register(SLIME)
def render(e, model_path, units) -> dict[str, str]:
    flags = ["--hf-checkpoint", "MODEL_FP8" if e.fp8 else model_path]
    if e.kv:
        flags += ["--sglang-kv-cache-dtype", e.kv]
    flags += [
        "--use-tis",
        "--tis-clip",
        str(IS_CLIP),
        "--get-mismatch-metrics",
        "--use-opd",
        "--opd-type",
        "sglang",
        "--opd-kl-coef",
        "1.0",
    ]
    pre = ""
    if e.fp8:
        pre = (
            "# 1. the block-FP8 checkpoint slime serves (run in slime's repository):\n"
            f"python tools/convert_hf_to_fp8.py --model-dir {shlex.quote(model_path)} --save-dir MODEL_FP8 "
            "--strategy block --block-size 128 128\n# 2. the training command's rollout flags:\n"
        )
    return {"slime.sh": header(e.target) + pre + cli("python3 train.py", flags)}


@resolves(SLIME, "slime.sh")
def read(files, units, n_blocks) -> Applied:
    """slime serves the checkpoint --hf-checkpoint names: the block-FP8 one its converter writes (every Linear) or
    the BF16 model."""
    f = flags(files["slime.sh"])
    return Applied(
        every_linear(units) if f.get("--hf-checkpoint") == "MODEL_FP8" else set(), f.get("--sglang-kv-cache-dtype")
    )
