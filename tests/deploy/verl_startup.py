"""verl's own start-up checks on a written config, run inside a virtual environment where the released verl wheel is
installed (tests/deploy/test_framework_startup.py makes it): everything `python3 -m verl.trainer.main_ppo` and
`python3 -m verl.experimental.fully_async_policy.fully_async_main` do with their config before they allocate a GPU.

    VENV/bin/python verl_startup.py < [{"entry": "main_ppo" | "fully_async", "overrides": [...]}, ...]

prints one JSON line, a list with one answer per job: {"ok": true, "checked": [...], "engine_kwargs_vllm": {...}} (the
composed rollout's engine_kwargs.vllm, which verl hands to `vllm serve`) or {"ok": false, "error": "...",
"checked": [...]}. The checks,
in verl 0.9.1's order, each verl's own code:

    main_ppo      Hydra composes verl/trainer/config/ppo_trainer.yaml with the overrides (hydra.main's parser);
                  verl.utils.config.validate_config(config, need_reference_policy, need_critic) (main());
                  the configs the workers build (omega_conf_to_dataclass of the rollout, the actor, distillation:
                  their __post_init__ checks, DistillationConfig's teacher pool among them); the resource pools the
                  v1 trainer sizes (PPOTrainer._init_resource_pool_mgr, verl/trainer/ppo/v1/trainer_base.py: the
                  teacher pool's nnodes > 0 among them), on a stand-in holding the config, before any Ray actor exists;
                  for an asynchronous trainer.v1.trainer_mode, that trainer's __init__ up to its first need of a job
    fully_async   Hydra composes verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml; main()'s
                  edits (the rollout pool copied into actor_rollout_ref.rollout; no validate_config there); the rollout
                  dataclass; the role mapping and the trainer's resource pools; FullyAsyncTrainer.__init__ and
                  FullyAsyncRollouter.__init__ (their assertions, the distillation dataclass) and _validate_config, run
                  on the undecorated classes (Ray's modified class), stopped where they first need a running job
"""

from __future__ import annotations

import json
import sys
import traceback


def _compose(config_dir: str, name: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name=name, overrides=overrides)


def _common(config, checked: list) -> None:
    from verl.trainer.distillation.losses import is_distillation_enabled
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    checked.append("verl.utils.config.validate_config")
    omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    checked.append("RolloutConfig (omega_conf_to_dataclass)")
    if is_distillation_enabled(config.get("distillation")):
        omega_conf_to_dataclass(config.distillation)
        checked.append("DistillationConfig (omega_conf_to_dataclass): the teacher pool")


def _pools(config, checked: list) -> None:
    """The resource pools the trainer sizes before it creates them: the v1 trainer's (trainer.use_v1, verl 0.9.1's
    default) PPOTrainer._init_resource_pool_mgr, else the legacy TaskRunner's init_resource_pool_mgr, each verl's own
    code on a stand-in holding only the config (the worker classes are wrapped with ray.remote, not started)."""
    from types import SimpleNamespace

    if config.trainer.get("use_v1", False):
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer

        PPOTrainer._init_resource_pool_mgr(SimpleNamespace(config=config))
        checked.append("PPOTrainer._init_resource_pool_mgr (v1: the resource pools)")
    else:
        from verl.trainer.main_ppo_v0 import TaskRunner

        cls = getattr(getattr(TaskRunner, "__ray_metadata__", None), "modified_class", TaskRunner)
        cls.init_resource_pool_mgr(SimpleNamespace(mapping={}, role_worker_mapping={}), config)
        checked.append("TaskRunner.init_resource_pool_mgr (v0: the resource pools)")


def main_ppo(overrides: list[str], checked: list) -> None:
    import os

    import verl

    config = _compose(os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), "ppo_trainer", overrides)
    checked.append("hydra compose ppo_trainer")
    _common(config, checked)
    _pools(config, checked)
    _v1_trainer(config, checked)
    return config


def _v1_trainer(config, checked: list) -> None:
    """The v1 trainer main_ppo builds for an asynchronous trainer_mode (TaskRunner.run: get_trainer_cls, then
    trainer_cls(config)): its __init__'s assertions (separate_async: train_batch_size = parameter_sync_step x
    ppo_mini_batch_size, a rollout pool, a weight-sync backend other than naive) on the resolved config, stopped where
    it first needs a running job."""
    from omegaconf import OmegaConf

    mode = config.trainer.get("v1", {}).get("trainer_mode", "sync")
    if not config.trainer.get("use_v1", False) or mode == "sync":
        return
    from verl.trainer.ppo.v1 import get_trainer_cls

    cls = get_trainer_cls(mode)
    resolved = config.copy()
    OmegaConf.resolve(resolved)
    try:
        cls.__init__(cls.__new__(cls), resolved)
    except (AssertionError, ValueError, TypeError):
        raise
    except Exception:  # past its checks: it builds the transfer queue, Ray's pools and the workers
        pass
    checked.append(f"{cls.__name__}.__init__ ({mode})")


def fully_async(overrides: list[str], checked: list) -> None:
    """fully_async_main.main and FullyAsyncTaskRunner._initialize_components up to the first Ray actor: the config's
    edits, the role mapping and the trainer's resource pools (verl.experimental.separation.utils), then the bodies of
    FullyAsyncTrainer.__init__ and FullyAsyncRollouter.__init__ (their assertions, the distillation dataclass) on the
    undecorated classes, stopped where they first need a running job."""
    import os

    import verl
    from verl.experimental.fully_async_policy import fully_async_rollouter, fully_async_trainer
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.experimental.separation.utils import create_resource_pool_manager, create_role_worker_mapping
    from verl.utils.config import omega_conf_to_dataclass

    root = os.path.join(os.path.dirname(verl.__file__), "experimental", "fully_async_policy", "config")
    config = _compose(root, "fully_async_ppo_trainer", overrides)
    checked.append("hydra compose fully_async_ppo_trainer")
    if not hasattr(config, "async_training"):
        raise RuntimeError("must set async_training config")
    config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes  # fully_async_main.main's edits
    config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    config = migrate_legacy_reward_impl(config)
    omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    checked.append("RolloutConfig (omega_conf_to_dataclass)")
    mapping, _ = create_role_worker_mapping(config)
    create_resource_pool_manager(config, roles=list(mapping))
    checked.append("create_resource_pool_manager (the trainer's pools)")
    for module, name in ((fully_async_trainer, "FullyAsyncTrainer"), (fully_async_rollouter, "FullyAsyncRollouter")):
        actor = getattr(module, name)
        cls = getattr(getattr(actor, "__ray_metadata__", None), "modified_class", actor)
        obj = cls.__new__(cls)
        try:
            if name == "FullyAsyncTrainer":
                cls.__init__(obj, config, None, mapping, None)
            else:
                cls.__init__(obj, config, tokenizer=None)
        except (AssertionError, ValueError):
            raise
        except Exception:  # past its checks: it builds loggers, samplers and executors, which need a running job
            pass
        checked.append(f"{name}.__init__")
    cls._validate_config(obj)
    checked.append("FullyAsyncRollouter._validate_config")
    return config


def run(job: dict) -> dict:
    """One job ({"entry": main_ppo | fully_async, "overrides": [...]}) through verl's start-up: ok, or the error."""
    from omegaconf import OmegaConf

    checked: list[str] = []
    try:
        config = {"main_ppo": main_ppo, "fully_async": fully_async}[job["entry"]](job["overrides"], checked)
        engine = config.actor_rollout_ref.rollout.get("engine_kwargs", {}).get("vllm", None)
        # what the vLLM rollout server hands to `vllm serve` beside its own arguments (vllm_async_server.py)
        engine = OmegaConf.to_container(engine, resolve=True) if engine else {}
        return {"ok": True, "checked": checked, "engine_kwargs_vllm": engine}
    except BaseException as e:  # noqa: BLE001 - every failure is the answer
        tb = traceback.format_exc().strip().splitlines()
        msg = f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__} at {tb[-2].strip() if len(tb) > 1 else ''}"
        return {"ok": False, "error": msg, "checked": checked, "where": tb[-4:]}


def main() -> None:
    """Jobs on stdin (a JSON list), one answer per job on stdout (a JSON list, in order): one process imports verl
    once for them all (its import is most of a job's time), each job composing its own config from scratch."""
    print(json.dumps([run(job) for job in json.loads(sys.stdin.read())]))


if __name__ == "__main__":
    main()
