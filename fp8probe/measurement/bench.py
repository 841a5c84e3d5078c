"""The measurement bench: what every measurement is taken on, named once.

A `Bench` is the student, its own rollouts, the batch size every pass runs in, the seed that draws anything random
(the estimate's labels, auto's controls, the prefix shift's continuations) and the response length those
continuations run to. It owns the reference passes made on it (reference.py), each made once, when first asked:

    bench = Bench.of(student, rollouts, sampling)        # sampling: a RolloutSettings (or None: batches of 8, seed 0)
    measure(bench, p)                                    # measure.py
    sweep(bench, settings)                               # sweeps/sweep.py
    make_recipe(table, bench, settings)                  # recipe/selection.py
    check(bench, config, budget)                         # budget/admission.py

A reference records the KV cache's amax per tensor or per head (`kv_strategy`: one reference per strategy) and, made
first by a sweep, each sequence's amax too (`per_sequence`). A bench `around` a given reference hands that one to
every request (a reference whose calibration was replaced, or one made without calibration).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

ANY = "*"  # the key of a reference handed to every request (Bench.around)


@dataclass(frozen=True)
class Bench:
    """The student, its rollouts, the batch size, the seed and the continuations' length (None: the rollouts' own,
    32 where unrecorded); the references made on it (`reference`)."""

    student: object  # model.load.Student
    rollouts: object  # model.rollouts.Rollouts
    batch_size: int = 8
    seed: int = 0
    max_new_tokens: int | None = None
    _references: dict = field(default_factory=dict, compare=False, repr=False)  # KV strategy (or ANY) -> reference

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"Bench: batch_size is at least 1, got {self.batch_size}")

    @classmethod
    def of(cls, student, rollouts, sampling=None) -> Bench:
        """The bench of `rollouts` as `sampling` (a model.settings.RolloutSettings) sampled them: its batch size,
        seed and response length; None: batches of 8, seed 0, the rollouts' own length."""
        if sampling is None:
            return cls(student, rollouts)
        return cls(student, rollouts, sampling.batch_size, sampling.seed, sampling.max_new_tokens)

    @classmethod
    def around(cls, reference, student, rollouts, batch_size: int = 8) -> Bench:
        """A bench whose every measurement uses `reference` (made on these rollouts)."""
        return cls(student, rollouts, batch_size, _references={ANY: reference})

    def on(self, rollouts) -> Bench:
        """The same bench on other rollouts (a held-out split), with none of this one's references."""
        return replace(self, rollouts=rollouts, _references={})

    @property
    def response_tokens(self) -> int:
        """How long the prefix shift's continuations run: the bench's `max_new_tokens`, else the rollouts' own
        sampling length, 32 where unrecorded."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        meta = getattr(self.rollouts, "meta", None)
        sampled = (meta.sampling if meta else None) or {}
        return int(sampled.get("max_new_tokens", 32))

    def reference(self, kv_strategy: str | None = None, per_sequence: bool = False):
        """The reference pass over the rollouts, made once per KV strategy: the KV cache's amax per `kv_strategy`
        ("tensor" or "head"; None: whichever this bench holds, else "tensor"); made with each sequence's amax too
        when `per_sequence` (a reference already held for the strategy serves either way)."""
        from .reference import Reference

        refs = self._references
        if ANY in refs:
            return refs[ANY]
        if kv_strategy is None:
            kv_strategy = "tensor" if "tensor" in refs or not refs else next(iter(refs))
        if kv_strategy not in refs:
            refs[kv_strategy] = Reference(
                self.student, self.rollouts, self.batch_size, kv_strategy=kv_strategy, per_sequence=per_sequence
            )
        return refs[kv_strategy]

    def holds_reference(self) -> bool:
        """Whether a reference pass was made (or given) already."""
        return bool(self._references)
