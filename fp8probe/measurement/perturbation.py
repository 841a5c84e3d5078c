"""What the rollout engine does differently from the trainer, as one value (torch-free: the sources, the CLI's
settings and the recipes name it without loading torch).

A `Perturbation` is stale weights (another checkpoint of the student), weight noise, units in FP8, an FP8 KV
cache, or several of these at once, applied in that order (the rollout engine quantizes the weights it
holds). The student under it, and its measurement against the reference, are perturbed.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.schemes import KVCacheScheme, Scheme


@dataclass(frozen=True)
class Perturbation:
    """What differs from the reference: `units` in `scheme`, the KV cache of `kv_layers` in `kv`, Gaussian
    noise of `noise` x each tensor's std on `noise_units` (seeded), every weight from `stale` (name -> tensor
    of another checkpoint of the same model)."""

    units: tuple[str, ...] = ()
    scheme: Scheme = Scheme.from_name("FP8_DYNAMIC")
    kv_layers: tuple[int, ...] = ()
    kv: KVCacheScheme = KVCacheScheme()
    noise: float = 0.0
    noise_units: tuple[str, ...] = ()
    noise_seed: int = 0
    stale: dict | None = field(default=None, compare=False, repr=False)

    def kinds(self) -> tuple[str, ...]:
        """The kinds of mismatch source it holds (fp8, kv, stale, noise): what a budget's evidence is read for."""
        return tuple(
            k
            for k, on in (
                ("fp8", bool(self.units)),
                ("kv", bool(self.kv_layers)),
                ("stale", self.stale is not None),
                ("noise", bool(self.noise)),
            )
            if on
        )

    def start_block(self, student) -> int:
        """The first decoder block whose output changes: the candidate pass starts there (-1: embeddings)."""
        if self.stale is not None:
            return -1
        noised = self.noise_units if self.noise else ()
        blocks = [student.unit(n).block for n in (*self.units, *noised)] + list(self.kv_layers)
        return min(blocks) if blocks else student.model.config.num_hidden_layers - 1
