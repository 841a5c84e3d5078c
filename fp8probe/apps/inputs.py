"""What every command that runs a student does first: check its inputs before any output exists (bad input
fails in seconds and leaves nothing behind), then load the student and sample or reuse its rollouts."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.files import check_writable, output_dir
from ..core.results import Result
from ..core.schemes import Scheme
from ..model.settings import ModelSource, RolloutSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inputs:
    """What check_inputs read: the model's config and the saved rollouts (None: they will be sampled), read once
    and handed on (rollouts_for, the memory check) instead of read again."""

    config: object
    rollouts: object | None


def check_inputs(
    model: ModelSource,
    rollouts: RolloutSettings,
    out=None,
    scheme: Scheme | None = None,
    partial: bool = False,
    others=(),
) -> Inputs:
    """Device, dtype, the model's config (supported, the scheme's shapes: `partial` allows groups it cannot take),
    the prompts file, saved rollouts (they fit the model), the output directory, and `others` (more model
    sources: a teacher, stale checkpoints) supported too. Returns what it read (Inputs)."""
    from ..model.rollouts import load_rollouts, read_prompts
    from ..model.structure import check_scheme

    cfg = model.check()
    for other in others:
        other.check()
    if rollouts.prompts:
        read_prompts(rollouts.prompts, rollouts.prompt_key)
    saved = load_rollouts(rollouts.rollouts) if rollouts.rollouts else None
    if out is not None:
        check_writable(out)
    if scheme is not None:
        check_scheme(cfg, scheme, partial=partial)
    if saved is not None:
        saved.check_fits(cfg, rollouts.rollouts)
    return Inputs(cfg, saved)


def load(model: ModelSource):
    """The student, and the seconds it took to load."""
    t = time.perf_counter()
    log.info("loading %s", model.label)
    return model.load(), time.perf_counter() - t


def rollouts_for(
    student, settings: RolloutSettings, out: Path, reuse_from: Path | None = None, progress: bool = False, saved=None
):
    """The rollouts (`settings.rollouts`: `saved` when check_inputs read them already; the ones a resumed command saved
    in `reuse_from`; or new ones), saved into `out`; and the seconds it took."""
    from ..model.rollouts import load_rollouts, make_rollouts, read_prompts, save_rollouts

    t = time.perf_counter()
    src = settings.rollouts or (reuse_from if reuse_from and (reuse_from / "rollouts.json").exists() else None)
    if src:
        r = saved if saved is not None and settings.rollouts else load_rollouts(src)
        log.info("reusing %d rollouts (%d response tokens) from %s", r.num_sequences, r.num_response_tokens, src)
    else:
        prompts = read_prompts(settings.prompts, settings.prompt_key) if settings.prompts else None
        r = make_rollouts(student, prompts, settings.sampling(), progress=progress)
        log.info("sampled %d rollouts, %d response tokens", r.num_sequences, r.num_response_tokens)
    if Path(src or "") != Path(out):
        save_rollouts(r, out)
    return r, time.perf_counter() - t


def run_rollouts(model: ModelSource, settings: RolloutSettings, out, progress: bool = False) -> RolloutsResult:
    """`fp8probe rollouts`: sample (or copy) the student's rollouts into `out`."""
    check_inputs(model, settings, out)
    with output_dir(out) as d:
        student, _ = load(model)
        return RolloutsResult(Path(out), *rollouts_for(student, settings, d, progress=progress))


@dataclass(frozen=True)
class RolloutsResult(Result):
    rollouts: object  # model.rollouts.Rollouts: rollouts.json, rollouts.safetensors
    sampling_seconds: float

    def describe(self, seconds: float) -> str:
        r = self.rollouts
        return (
            f"rollouts: {r.num_sequences} sequences, {r.num_response_tokens} response tokens in "
            f"{self.sampling_seconds:.0f} s -> {self.out}"
        )


@dataclass(frozen=True)
class UnitsResult(Result):
    units: list  # model.structure.Unit, in model order

    def describe(self, seconds: float) -> str:
        """What `fp8probe units` prints: every unit, its kind, block, size and fused group."""
        from ..model.structure import fused_groups

        units = self.units
        lines = [
            f"{u.name:<48} {u.kind:<8} block {u.block:>3}  {u.params:>12,}  group {u.group}"
            f"{'' if u.quantizable else '  (kept BF16)'}"
            for u in units
        ]
        q = [u for u in units if u.quantizable]
        return "\n".join(
            lines
            + [
                f"units: {len(q)} quantizable in {len(fused_groups(units))} fused groups, "
                f"{sum(u.params for u in q):,} parameters"
            ]
        )


def run_units(model: ModelSource) -> UnitsResult:
    """Every unit of the model, its kind, block, size and fused group, from its config alone."""
    from ..model.structure import list_units, meta_model

    # the config alone: shapes on the meta device, no weights read
    return UnitsResult(None, list_units(meta_model(model.check())))
