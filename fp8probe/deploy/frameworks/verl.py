"""verl, with a vLLM or an SGLang rollout (Hydra overrides of `python3 -m verl.trainer.main_ppo`)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ...core.errors import FP8ProbeError
from ...core.settings import Settings, opt
from ...core.verl_lags import VerlAsync, VerlV1Async, VerlV1Colocate
from .base import (
    Applied,
    Target,
    every_linear,
    header,
    hydra,
    ignore_keywords,
    overrides,
    register,
    resolves,
    skipped_layers,
    verl_correction,
)


def vllm_rollout(name: str, title: str, source: str, how: str) -> Target:
    """A verl target whose rollout is verl's vLLM one: every Linear in FP8_BLOCK with quantization=fp8, the FP8 KV cache
    at scales 1.0, per-layer KV maps through engine_kwargs.vllm, Hydra overrides."""
    return Target(name, title, "all", "FP8_BLOCK", "fp8", "unit", "hydra", source, how, kv_skip=True)


VERL = vllm_rollout(
    "verl",
    "verl (vLLM rollout)",
    "verl==0.9.1 verl/workers/rollout/vllm_rollout/vllm_async_server.py (FP8_BLOCK_QUANT_KWARGS)",
    "with quantization=fp8, re-quantizes every Linear of the synced BF16 weights in 128x128 blocks; keeps only "
    "MoE routers (mlp.gate) in BF16; KV scales 1.0",
)
VERL_SGLANG = Target(
    "verl-sglang",
    "verl (SGLang rollout)",
    "free",
    "FP8_BLOCK",
    "fp8_e4m3",
    "unit",
    "hydra",
    "verl==0.9.1 verl/utils/sglang/sglang_fp8_utils.py (get_sglang_fp8_ignored_layers)",
    "128x128 blocks; honours an ignore list (SGLANG_FP8_IGNORED_LAYERS) at start-up and weight sync",
    kv_skip="its SGLang rollout takes one --kv-cache-dtype for every layer (SGLang's per-layer dtype, PR #17530, "
    "closed unmerged)",
)
MAIN = "python3 -m verl.trainer.main_ppo"
# verl 0.9.1 hands engine_kwargs.vllm to `vllm serve` whole (vllm_async_server.py: build_cli_args_from_config, a list
# as one flag and its items), so vLLM's own per-layer KV map reaches the rollout engine through it
SKIP_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype_skip_layers"


def _rollout(e) -> list[str]:
    """verl's vLLM rollout with the recipe's FP8 weights and KV cache (every verl target that rolls out in vLLM)."""
    lines = ["actor_rollout_ref.rollout.name=vllm"]
    if e.fp8:
        lines.append("actor_rollout_ref.rollout.quantization=fp8")
    if e.kv:
        lines.append(f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype={e.kv}")
    # a Hydra list, quoted for the shell; verl passes it on as `--kv_cache_dtype_skip_layers 1 16`
    if e.kv and e.kv_skip:
        lines.append(shlex.quote(f"+{SKIP_KEY}=[{','.join(map(str, e.kv_skip))}]"))
    return lines


@register(VERL)
def render_vllm(e, model_path, units) -> dict[str, str]:
    return {"verl.sh": header(e.target) + hydra(MAIN, _rollout(e) + verl_correction())}


@register(VERL_SGLANG)
def render_sglang(e, model_path, units) -> dict[str, str]:
    lines = ["actor_rollout_ref.rollout.name=sglang"]
    if e.fp8:
        lines.append("actor_rollout_ref.rollout.quantization=fp8")
        ignored = ignore_keywords(e.kept_units, units)
        if ignored:  # a quoted Hydra string: commas would otherwise make a sweep
            lines.append(
                shlex.quote(
                    f'+ray_kwargs.ray_init.runtime_env.env_vars.SGLANG_FP8_IGNORED_LAYERS="{",".join(ignored)}"'
                )
            )
    if e.kv:
        lines.append(f"+actor_rollout_ref.rollout.engine_kwargs.sglang.kv_cache_dtype={e.kv}")
    lines += verl_correction()
    return {"verl-sglang.sh": header(e.target) + hydra(MAIN, lines)}


@resolves(VERL, "verl.sh")
def read_vllm(files, units, n_blocks) -> Applied:
    """verl's vLLM rollout: quantization=fp8 re-quantizes every Linear; kv_cache_dtype through engine_kwargs."""
    return _read_rollout(files["verl.sh"], units)


def _read_rollout(text: str, units) -> Applied:
    """What the vLLM rollout of a verl script runs (the verl, verl-opd and verl-fully-async targets)."""
    o = overrides(text)
    return Applied(
        every_linear(units) if o.get("actor_rollout_ref.rollout.quantization") == "fp8" else set(),
        o.get("actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype"),
        skipped_layers(o.get(SKIP_KEY)),
    )


def _matches_ignored(name: str, entry: str) -> bool:
    """verl 0.9.1's _matches_ignored_layer (verl/utils/sglang/sglang_fp8_utils.py) on a module name: "re:" from the
    start, else a dot-bounded, case-insensitive part of the name."""
    entry = entry.strip()
    if not entry:
        return False
    if entry.startswith("re:"):
        return any(re.match(entry[3:], c) for c in (name + ".weight", name))
    entry = entry.lower().strip(".")
    return any(
        c == entry or c.startswith(entry + ".") or c.endswith("." + entry) or f".{entry}." in f".{c}."
        for c in (name.lower() + ".weight", name.lower())
    )


@resolves(VERL_SGLANG, "verl-sglang.sh")
def read_sglang(files, units, n_blocks) -> Applied:
    """verl's SGLang rollout: every Linear in FP8 but those SGLANG_FP8_IGNORED_LAYERS names (comma-separated)."""
    o = overrides(files["verl-sglang.sh"])
    if o.get("actor_rollout_ref.rollout.quantization") != "fp8":
        return Applied(set(), o.get("actor_rollout_ref.rollout.engine_kwargs.sglang.kv_cache_dtype"))
    env = next((v for k, v in o.items() if k.endswith("SGLANG_FP8_IGNORED_LAYERS")), "")
    ignored = [x for x in env.strip('"').split(",") if x]
    return Applied(
        {n for n in every_linear(units) if not any(_matches_ignored(n, x) for x in ignored)},
        o.get("actor_rollout_ref.rollout.engine_kwargs.sglang.kv_cache_dtype"),
    )


# ---------------------------------------------------------------------------------------------------
# on-policy distillation (distillation.*) and the fully-async policy (verl.experimental.fully_async_policy)

# verl 0.9.1's distillation losses (verl/trainer/distillation/losses.py, register_distillation_loss): the sampled-token
# estimators and the forward KL over the teacher's top-k
# verl 0.9.1's DistillationLossConfig dataclass defaults (verl/workers/config/distillation.py): the loss fp8probe's
# calibration trains (training/verl_losses.py) and the verl exports write, where a Hydra launch would otherwise take
# distillation.yaml's (topk 32, loss_max_clamp and log_prob_min_clamp null)
LOSS_MAX_CLAMP = 10.0
LOG_PROB_MIN_CLAMP = -10.0
TOPK = 128
OPD_LOSSES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "forward_kl_topk")
CHECKED_VERL = (0, 9, 1)  # the release whose config these targets were read from (the default when none is installed)
# the first release with each feature the verl targets write, read from the released wheels' own config files and code:
# 0.7.0 has no trainer/config/distillation/, no experimental/fully_async_policy/config/ and only token / sequence /
# geometric rejection; 0.8.0, 0.9.0 and 0.9.1 ship the same distillation.yaml and every fully-async key written
VERL_SINCE = {
    "distillation.* (distillation/distillation.yaml)": (0, 8, 0),
    "the fully-async policy's config (async_training.*, rollout.*)": (0, 8, 0),
    "rollout_rs=seq_mean_k3 (the K3 rejection screen, rollout_corr_helper.py)": (0, 8, 0),
}
# read the same way: 0.8.0 has no verl/trainer/ppo/v1/; 0.9.0 and 0.9.1 ship trainer.v1.separate_async and
# colocate_async with the same keys and start-up assertions (0.9.0's colocate_async takes whole warmup batches only)
V1_SINCE = {"the v1 trainer's async modes (trainer.v1.*)": (0, 9, 0)}
FRACTIONAL_WARMUP = (0, 9, 1)  # colocate_async's num_warmup_batches as a fraction (_add_async_warmup_batches)
# verl's own K3 rejection preset (verl/trainer/config/algorithm.py, bypass_ppo_clip_k3_rs: seq_mean_k3 at 0.01)
REJECTION = ("seq_mean_k3", 0.01)
FULLY_ASYNC = "python3 -m verl.experimental.fully_async_policy.fully_async_main"


@dataclass(frozen=True)
class VerlSettings(Settings):
    """What verl's OPD and fully-async targets write beyond the rollout's FP8: the distillation loss (verl's
    `distillation.distillation_loss.*`), the teacher, the fully-async policy's staleness and pools, and the verl
    release they are written for."""

    opd_loss: str = opt("k3", "verl's distillation loss_mode (verl-opd, verl-fully-async)", choices=OPD_LOSSES)
    opd_topk: int | None = opt(None, "top-k of the teacher's distribution for forward_kl_topk (default: verl's)", low=1)
    opd_policy_gradient: bool = opt(
        False, "the k1 estimate as a per-token advantage in a PPO-clip loss (verl's use_policy_gradient)"
    )
    opd_no_task_rewards: bool = opt(False, "distillation alone: no task rewards (verl's use_task_rewards=False)")
    teacher: str | None = opt(None, "the teacher's model path (verl-opd; default: $TEACHER, required at launch)")
    teacher_tp: int = opt(
        2, "the teacher's tensor parallelism (verl's distillation...inference.tensor_model_parallel_size)", low=1
    )
    teacher_gpus: int | None = opt(
        None,
        "GPUs per node of the teacher pool (distillation.n_gpus_per_node; default: one replica, `teacher_tp`): a "
        "multiple of `teacher_tp`, each `teacher_tp` of them one replica",
        low=1,
    )
    teacher_nodes: int = opt(1, "nodes of the teacher pool (distillation.nnodes)", low=1)
    staleness_threshold: float = opt(0.1, "fully-async: verl's async_training.staleness_threshold", low=0.0)
    trigger_parameter_sync_step: int = opt(4, "fully-async: optimizer steps between weight syncs", low=1)
    no_partial_rollout: bool = opt(False, "fully-async: finish a response on the weights it began with")
    parameter_sync_step: int = opt(
        4, "separate-async: optimizer updates per step, the weights synced after each step", low=1
    )
    warmup_batches: float = opt(
        1.0, "separate-async, colocate-async: train batches queued before the first step", low=0.0
    )
    max_off_policy: int = opt(
        8, "separate-async, colocate-async: the most steps a prompt may span before verl drops it", low=1
    )
    rollout_gpus: int = opt(
        8, "fully-async, separate-async: GPUs per node of the rollout pool (its n_gpus_per_node)", low=1
    )
    trainer_gpus: int = opt(8, "fully-async: GPUs per node of the trainer pool (trainer.n_gpus_per_node)", low=1)
    rollout_nodes: int | None = opt(
        None,
        "fully-async, separate-async: nodes of the rollout pool (its nnodes; default: left to your config, or 1 for "
        "separate-async, whose rollout pool verl requires)",
        low=1,
    )
    trainer_nodes: int | None = opt(
        None, "fully-async: nodes of the trainer pool (trainer.nnodes; default: left to your config)", low=1
    )
    verl_version: str | None = opt(
        None, "the verl release the config is for (default: the installed verl's, else the checked 0.9.1)"
    )
    check: str | None = opt(
        None,
        "a check.json of the configuration the target runs (`fp8probe check`): the export says what the rejection "
        "screen it writes would mask of that configuration's own samples",
    )
    screen_keep: float | None = opt(
        None,
        "with `check`: write the rejection threshold that keeps this share of sequences (e.g. 0.9) instead of "
        "verl's preset 0.01",
        low=0.0,
        open_low=True,
        high=1.0,
    )

    def __post_init__(self):
        super().__post_init__()
        if self.teacher_gpus is not None and self.teacher_gpus % self.teacher_tp:
            raise FP8ProbeError(
                f"`teacher_gpus` {self.teacher_gpus} is not a multiple of `teacher_tp` {self.teacher_tp}: verl's "
                "DistillationConfig refuses a teacher pool its replicas do not fill"
            )
        if self.screen_keep is not None and not self.check:
            raise FP8ProbeError("`screen_keep` reads each sequence's statistic from `check`: give the check.json too")
        if self.check:
            _screened(self.check)  # unreadable, or no prediction: refused before any output
        v1 = VerlV1Async(self.parameter_sync_step, self.warmup_batches, self.max_off_policy)
        if v1.drops_warmup:
            raise FP8ProbeError(
                f"`warmup_batches` {self.warmup_batches:g} would queue prompts for {v1.waits} steps, over "
                f"`max_off_policy` {self.max_off_policy}: verl would drop every batch the warmup holds"
            )
        if self.opd_loss == "k1" and not self.opd_policy_gradient:
            raise FP8ProbeError(
                "`opd_loss` k1 needs `opd_policy_gradient`: verl refuses to backpropagate k1 directly (its gradient "
                "does not depend on the teacher)"
            )
        self.release  # an unreadable version fails here

    @property
    def release(self) -> tuple[int, ...]:
        """The verl release: `verl_version`, else the installed verl's, else the one the keys were read from."""
        text = self.verl_version
        if text is None:
            try:
                from importlib.metadata import PackageNotFoundError, version

                text = version("verl")
            except PackageNotFoundError:
                return CHECKED_VERL
        m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
        if not m:
            raise FP8ProbeError(f"`verl_version` {text!r} is not a release such as 0.9.1")
        return tuple(int(x or 0) for x in m.groups())


def _check_release(options: VerlSettings, what: str, since: dict = VERL_SINCE) -> None:
    missing = [feature for feature, first in since.items() if options.release < first]
    if missing:
        got = ".".join(map(str, options.release))
        first = ".".join(map(str, max(since[f] for f in missing)))
        raise FP8ProbeError(
            f"{what}: verl {got} has no {'; no '.join(missing)} (first in verl {first}): upgrade verl to {first} "
            "or later, or pass `verl_version`"
        )


def _v1_options(e) -> VerlSettings:
    """A v1 async target's options, refused where the release lacks the v1 trainer, or (verl 0.9.0, which queues
    whole warm-up batches: range(num_warmup_batches)) a fractional warm-up."""
    o = e.options or VerlSettings()
    _check_release(o, e.target.name, V1_SINCE)
    w = o.warmup_batches
    if w != int(w) and o.release < FRACTIONAL_WARMUP:
        raise FP8ProbeError(
            f"{e.target.name}: verl {'.'.join(map(str, o.release))} queues whole warmup batches "
            "(range(num_warmup_batches)); give a whole `warmup_batches` or write for verl 0.9.1"
        )
    return o


def _v1_script(e, lines: list[str], why: list[str]) -> dict[str, str]:
    """A v1 async target's launch script: the header, the lines on its lags, main_ppo with the rollout's FP8, the
    mode's keys and verl's token IS correction."""
    head = header(e.target) + "".join(f"# {x}.\n" for x in why)
    return {f"{e.target.name}.sh": head + hydra(MAIN, _rollout(e) + lines + verl_correction())}


def _distillation(o: VerlSettings, bypass: bool = False) -> tuple[list[str], list[str]]:
    """(the distillation.* overrides, the comment lines on which loss the rollouts' screens act on for this loss: in
    the decoupled mode (main_ppo) verl screens the batch before any loss, in bypass mode (fully-async) inside the task
    PPO loss only)."""
    loss = "distillation.distillation_loss"
    teacher = shlex.quote(o.teacher) if o.teacher else '"${TEACHER:?set TEACHER to the teacher model path}"'
    lines = [
        "distillation.enabled=True",
        f"{loss}.loss_mode={o.opd_loss}",
        f"{loss}.use_policy_gradient={o.opd_policy_gradient}",
        f"{loss}.use_task_rewards={not o.opd_no_task_rewards}",
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        # the teacher's own pool: verl's trainers refuse distillation without one (nnodes > 0), and DistillationConfig
        # makes its replicas from the pool's GPUs, `teacher_tp` each
        f"distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size={o.teacher_tp}",
        f"distillation.n_gpus_per_node={o.teacher_gpus or o.teacher_tp}",
        f"distillation.nnodes={o.teacher_nodes}",
    ]
    # the loss fp8probe calibrates (training/verl_losses.py): DistillationLossConfig's dataclass defaults, which a
    # Hydra launch would otherwise replace with distillation.yaml's (top-k 32, no clamps)
    lines += [f"{loss}.loss_max_clamp={LOSS_MAX_CLAMP}", f"{loss}.log_prob_min_clamp={LOG_PROB_MIN_CLAMP}"]
    if o.opd_loss == "forward_kl_topk":
        lines.append(f"{loss}.topk={o.opd_topk or TOPK}")
    kind = (
        f"policy-gradient distillation ({o.opd_loss} as the advantage)"
        if o.opd_policy_gradient
        else f"supervised distillation ({o.opd_loss})"
    )
    if bypass:
        tail = (
            "there is no task loss (use_task_rewards=False), so the screen written acts on no loss"
            if o.opd_no_task_rewards
            else "they act on the task-reward PPO loss alone"
        )
        why = [
            f"{kind} in bypass mode: verl computes the IS weights and the rejection mask inside the task PPO loss "
            "(core_algos.compute_policy_loss_bypass_mode) and leaves the batch's response_mask alone, so the "
            f"distillation loss is neither masked nor weighted; {tail}"
        ]
    elif o.opd_policy_gradient:
        why = [
            f"{kind}: verl's rejection mask (rollout_rs) removes the masked tokens from the batch before every loss "
            "(rollout_corr_helper.compute_rollout_correction_and_add_to_batch), and the rollout IS weights "
            "(rollout_is) reach the distillation's PPO-clip loss (verl/trainer/distillation/losses.py) and the "
            "task loss"
        ]
    else:
        why = [
            f"{kind}: verl's rejection mask (rollout_rs) removes the masked tokens from the batch before every loss, "
            "the distillation loss included (rollout_corr_helper.compute_rollout_correction_and_add_to_batch); verl "
            "passes no IS weight to a supervised distillation loss (verl/trainer/distillation/losses.py), so TIS would "
            + ("act on no loss (use_task_rewards=False)" if o.opd_no_task_rewards else "act on the task loss alone")
        ]
    return lines, why


def _screen(policy_gradient: bool, o: VerlSettings | None = None) -> tuple[list[str], list[str]]:
    """(the correction that acts: token TIS where verl weights the loss, else verl's K3 rejection preset, or with
    `screen_keep` the threshold keeping that share of the checked configuration's sequences; the comment lines on
    what it would mask, from `check`)."""
    if policy_gradient:
        return verl_correction(), []
    mode, threshold = REJECTION
    why = []
    if o is not None and o.check:
        threshold, why = predicted_screen(o, mode, threshold)
    lines = [
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"algorithm.rollout_correction.rollout_rs={mode}",
        f"algorithm.rollout_correction.rollout_rs_threshold={threshold:.6g}",
    ]
    return lines, why


def _screened(path: str, mode: str = REJECTION[0]):
    """(the check.json at `path`, its prediction of the `mode` rejection screen), or one line saying what to do."""
    from ...core.records import CheckRecord

    rep = CheckRecord.read(path, "run `fp8probe check` on the configuration this target runs")
    sc = next((s for s in rep.verl_screens or [] if s.get("screen", "").startswith(f"rollout_rs {mode} ")), None)
    if sc is None or not sc.get("per_sequence"):
        raise FP8ProbeError(
            f"`check` {path} holds no prediction of the {mode} screen (check.json 3 from a check with a prefix "
            "shift has one): run `fp8probe check` again"
        )
    return rep, sc


MASKED_WARNING = 0.5  # a screen predicted to mask more than this share of sequences is said to discard most of a batch


def predicted_screen(o: VerlSettings, mode: str, preset: float) -> tuple[float, list[str]]:
    """(the threshold to write, what the check's own samples say the screen does): verl's preset, or the share
    `screen_keep` asks for (the quantile of each checked sequence's statistic)."""
    import numpy as np

    rep, sc = _screened(o.check, mode)
    stat = np.asarray(sc["per_sequence"])
    threshold = preset if o.screen_keep is None else float(np.quantile(stat, o.screen_keep))
    masked = float(np.mean(stat > threshold))
    lo, hi = sc["seq_masked_interval"] if o.screen_keep is None else (masked, masked)
    why = [
        f"predicted on {rep.configuration}'s own samples ({o.check}: {len(stat)} sequences, {rep.engine}): "
        f"{mode} <= {threshold:.4g} masks {masked:.0%}"
        + (f" [{lo:.0%}, {hi:.0%}]" if o.screen_keep is None else "")
        + " of the sequences"
        + (f" (threshold chosen to keep {o.screen_keep:.0%}: screen_keep)" if o.screen_keep is not None else "")
    ]
    if masked > MASKED_WARNING and o.screen_keep is None:
        keep = float(np.quantile(stat, 0.9))
        why.append(
            f"WARNING: verl's preset would discard {masked:.0%} of each batch's sequences; "
            f"rollout_rs_threshold={keep:.4g} keeps 90 % (`screen_keep 0.9`), or choose a recipe that measures less"
        )
    return threshold, why


VERL_OPD = vllm_rollout(
    "verl-opd",
    "verl on-policy distillation (vLLM rollout)",
    "verl==0.9.1 verl/trainer/config/distillation/distillation.yaml, verl/trainer/distillation/losses.py",
    "with quantization=fp8 the vLLM rollout re-quantizes every Linear in 128x128 blocks (as `verl`); the teacher "
    "scores every batch (distillation.*)",
)
VERL_FULLY_ASYNC = vllm_rollout(
    "verl-fully-async",
    "verl fully-async policy (vLLM rollout)",
    "verl==0.9.1 verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml",
    "rollouter and trainer on their own pools, the rollout's log-probs the PPO ratio's denominator (bypass mode); "
    "FP8 as `verl`",
)


@register(VERL_OPD)
def render_opd(e, model_path, units) -> dict[str, str]:
    o = e.options or VerlSettings()
    _check_release(o, "verl-opd")
    # policy-gradient OPD as calibrate's opd-pg trains it: the PPO ratio's denominator the rollout's own log-probs
    # (verl's bypass mode), where verl's decoupled default would recompute it with the trainer (another loss)
    lines, why = _distillation(o, bypass=o.opd_policy_gradient)
    if o.opd_policy_gradient:
        lines.append("algorithm.rollout_correction.bypass_mode=True")
    screen, predicted = _screen(False, o)
    head = header(e.target) + "".join(f"# {w}.\n" for w in why + predicted)
    return {"verl-opd.sh": head + hydra(MAIN, _rollout(e) + lines + screen)}


@register(VERL_FULLY_ASYNC)
def render_fully_async(e, model_path, units) -> dict[str, str]:
    o = e.options or VerlSettings()
    _check_release(o, "verl-fully-async")
    lines = [
        f"async_training.staleness_threshold={o.staleness_threshold}",
        f"async_training.trigger_parameter_sync_step={o.trigger_parameter_sync_step}",
        f"async_training.partial_rollout={not o.no_partial_rollout}",
        # what FullyAsyncRollouter asserts at start-up (verl's own fully-async scripts set them): separate pools, no
        # hybrid engine, the trainer's batch built from the message queue (train_batch_size 0), one prompt per draw
        "actor_rollout_ref.hybrid_engine=False",
        "data.train_batch_size=0",
        "data.gen_batch_size=1",
        f"rollout.n_gpus_per_node={o.rollout_gpus}",
        f"trainer.n_gpus_per_node={o.trainer_gpus}",
    ]
    lines += [f"rollout.nnodes={o.rollout_nodes}"] if o.rollout_nodes else []
    lines += [f"trainer.nnodes={o.trainer_nodes}"] if o.trainer_nodes else []
    lags = VerlAsync(o.trigger_parameter_sync_step, o.staleness_threshold, not o.no_partial_rollout)
    full, waits = lags.lags("trainer-bound"), lags.lags("rollout-bound")
    why = [
        "bypass mode (verl's default here): the rollout's log-probs are the PPO ratio's denominator, so the ratio "
        "itself carries the mismatch and TIS weights would count it twice; verl's K3 rejection preset screens it "
        "inside the task PPO loss",
        f"samples lag {min(full)} .. {max(full)} trainer steps when the rollouter keeps its allowance full "
        f"({min(waits)} .. {max(waits)} when the trainer waits; each step require_batches x ppo_epochs optimizer "
        f"updates): `fp8probe check --verl-async {lags.key()}` judges them"
        + ("; with partial rollouts a response's prefix comes from older weights" if not o.no_partial_rollout else ""),
    ]
    if o.teacher is not None:
        opd, opd_why = _distillation(o, bypass=True)
        lines += opd
        why += opd_why
    screen, predicted = _screen(False, o)
    head = header(e.target) + "".join(f"# {w}.\n" for w in why + predicted)
    return {"verl-fully-async.sh": head + hydra(FULLY_ASYNC, _rollout(e) + lines + screen)}


@resolves(VERL_OPD, "verl-opd.sh")
def read_opd(files, units, n_blocks) -> Applied:
    """verl-opd runs the `verl` vLLM rollout: quantization=fp8 re-quantizes every Linear."""
    return _read_rollout(files["verl-opd.sh"], units)


@resolves(VERL_FULLY_ASYNC, "verl-fully-async.sh")
def read_fully_async(files, units, n_blocks) -> Applied:
    return _read_rollout(files["verl-fully-async.sh"], units)


# ---------------------------------------------------------------------------------------------------
# verl's own default trainer (v1) in its separate_async mode (verl/trainer/ppo/v1/trainer_separate_async.py)

VERL_SEPARATE_ASYNC = vllm_rollout(
    "verl-separate-async",
    "verl v1 separate_async (vLLM rollout)",
    "verl==0.9.1 verl/trainer/ppo/v1/trainer_separate_async.py, verl/trainer/config/ppo_trainer.yaml (trainer.v1)",
    "main_ppo's v1 trainer with a rollout pool of its own, weights synced every parameter_sync_step updates; FP8 as "
    "`verl`",
)


@register(VERL_SEPARATE_ASYNC)
def render_separate_async(e, model_path, units) -> dict[str, str]:
    o = _v1_options(e)
    s, w, m = o.parameter_sync_step, o.warmup_batches, o.max_off_policy
    lines = [
        "trainer.v1.trainer_mode=separate_async",
        f"trainer.v1.separate_async.parameter_sync_step={s}",
        f"trainer.v1.separate_async.num_warmup_batches={w:g}",
        f"trainer.v1.sampler.max_off_policy_threshold={m}",
        # what SeparateAsyncPPOTrainer asserts at start-up: a rollout pool of its own, a real weight-sync backend
        f"actor_rollout_ref.rollout.nnodes={o.rollout_nodes or 1}",
        f"actor_rollout_ref.rollout.n_gpus_per_node={o.rollout_gpus}",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    ]
    bypass, held = VerlV1Async(s, w, m), VerlV1Async(s, w, m, decoupled=True)
    full, waits = bypass.lags("trainer-bound"), bypass.lags("rollout-bound")
    why = [
        f"keep data.train_batch_size = {s} x actor_rollout_ref.actor.ppo_mini_batch_size (verl asserts it): each "
        f"step is {s} updates of one mini-batch",
        f"samples lag {min(full)} .. {max(full)} optimizer updates when the rollout keeps up ({min(waits)} .. "
        f"{max(waits)} when the trainer waits); the decoupled loss's old log-probs lag "
        f"{' or '.join(map(str, held.lags()))}: "
        f"`fp8probe check --verl-async {held.key()}` judges them",
    ]
    return _v1_script(e, lines, why)


@resolves(VERL_SEPARATE_ASYNC, "verl-separate-async.sh")
def read_separate_async(files, units, n_blocks) -> Applied:
    return _read_rollout(files["verl-separate-async.sh"], units)


# ---------------------------------------------------------------------------------------------------
# verl's own default trainer (v1) in its colocate_async mode (verl/trainer/ppo/v1/trainer_colocate_async.py)

VERL_COLOCATE_ASYNC = vllm_rollout(
    "verl-colocate-async",
    "verl v1 colocate_async (vLLM rollout)",
    "verl==0.9.1 verl/trainer/ppo/v1/trainer_colocate_async.py, verl/trainer/config/ppo_trainer.yaml (trainer.v1)",
    "main_ppo's v1 trainer with the rollout and the trainer taking turns on the same GPUs, the weights synced after "
    "every step and the requests in flight resumed; FP8 as `verl`",
)


@register(VERL_COLOCATE_ASYNC)
def render_colocate_async(e, model_path, units) -> dict[str, str]:
    o = _v1_options(e)
    w, m = o.warmup_batches, o.max_off_policy
    lines = [
        "trainer.v1.trainer_mode=colocate_async",
        f"trainer.v1.colocate_async.num_warmup_batches={w:g}",
        f"trainer.v1.sampler.max_off_policy_threshold={m}",
    ]
    alike = VerlV1Colocate(w, m)
    shares = ", ".join(f"{k}: {v:.0%}" for k, v in alike.lags().items())
    why = [
        "each step is one update and one weight sync; the rollout samples with the weights of the step's start until "
        "a batch of prompt groups is finished, the requests still in flight resume after the sync (their earlier "
        "tokens a step older for each sync they span) and finished groups not taken wait a step",
        f"with every response alike the tokens lag ({shares}) trainer steps; longer responses lag more: "
        f"`fp8probe check --verl-async {alike.key()}` (batch: your data.train_batch_size) schedules the student's "
        "own rollouts and judges the lags",
    ]
    return _v1_script(e, lines, why)


@resolves(VERL_COLOCATE_ASYNC, "verl-colocate-async.sh")
def read_colocate_async(files, units, n_blocks) -> Applied:
    return _read_rollout(files["verl-colocate-async.sh"], units)
