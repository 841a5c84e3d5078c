"""What a sweep will need in memory, known from the config before anything is loaded, and a refusal when it
would not fit (naming the option that would).

    weights     parameters x dtype bytes, on the device (spread over the GPUs with --device auto)
    recorded    exact / auto: the reference keeps every block's input for every rollout token, so that a row
                starts at its own block (reference.py): blocks x tokens x hidden x dtype bytes, on the device
    working     one batch: exact: one block's activations (~ 4 h + 3 i per token, attention by SDPA) and one
                chunk of logits (CHUNK_ROWS x vocab x 4 B, three copies); fisher: what backward keeps for every
                block (~ 10 h + 4 i per token) and the same chunk; FP8 weights kept up to
                hooks.DEQUANTIZED_CACHE_BYTES (fisher) / LAZY_CODES_BYTES codes (whole-model rows)
    host        on the CPU: the reference log-probabilities (response tokens x vocab x 4 B: exact / auto; x hidden x 4 B
                when they would exceed 1 GiB: measurement/reference.py keeps the hidden states then), K/V and
                their gradients waiting for the KV scales (fisher: 4 x blocks x tokens x kv width x dtype bytes)

Estimates are upper bounds of the terms that grow with the model and the rollouts; framework overhead
(CUDA context, allocator slack) is the 10 % margin `check_fits` keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import FP8ProbeError
from ..core.units import GiB
from .methods import METHODS

MARGIN = 0.9  # use at most this share of what the device (or the host) has free


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    recorded: int
    working: int
    host: int
    method: str
    batch_tokens: int  # tokens in one batch (batch size x sequence length)
    seq_len: int

    @property
    def device(self) -> int:
        return self.weights + self.recorded + self.working

    def describe(self) -> str:
        return (
            f"weights {self.weights / GiB:.1f} GiB + recorded block inputs {self.recorded / GiB:.1f} GiB + one "
            f"batch {self.working / GiB:.1f} GiB = {self.device / GiB:.1f} GiB on the device; "
            f"{self.host / GiB:.1f} GiB on the host"
        )


def estimate(
    config, dtype_bytes: int, method: str, batch_size: int, num_sequences: int, seq_len: int, response_tokens: int
) -> MemoryEstimate:
    """The memory a sweep of this model and these rollouts needs (see the module docstring)."""
    from ..measurement.mismatch import CHUNK_ROWS
    from ..measurement.quantize import DEQUANTIZED_CACHE_BYTES, LAZY_CODES_BYTES
    from ..measurement.reference import reference_storage
    from ..model.structure import kv_geometry, meta_model, text_config

    cfg = text_config(config)
    model = meta_model(config)
    params = sum(p.numel() for p in model.parameters())
    h = cfg.hidden_size
    inter = getattr(cfg, "intermediate_size", 4 * h) or 4 * h
    if getattr(cfg, "num_experts_per_tok", None):  # MoE: the routed experts' intermediate width per token
        inter = (getattr(cfg, "moe_intermediate_size", None) or inter) * cfg.num_experts_per_tok
    layers = cfg.num_hidden_layers
    vocab = cfg.vocab_size
    tokens = num_sequences * seq_len
    batch_tokens = min(batch_size, num_sequences) * seq_len
    chunk = CHUNK_ROWS * vocab * 4 * 3
    weights = params * dtype_bytes
    quantizable = params - 2 * vocab * h  # about: embeddings and lm_head stay BF16
    kind = METHODS[method]
    if not kind.reference:  # the estimate alone
        recorded = 0
        working = batch_tokens * layers * (10 * h + 4 * inter) * dtype_bytes + chunk
        working += quantizable * dtype_bytes if quantizable * dtype_bytes <= DEQUANTIZED_CACHE_BYTES else 0
        kv = kv_geometry(config).elements_per_token_layer
        host = 4 * layers * tokens * kv * dtype_bytes
    else:
        recorded = layers * tokens * h * dtype_bytes
        working = batch_tokens * (4 * h + 3 * inter) * dtype_bytes + chunk
        working += quantizable if quantizable <= LAZY_CODES_BYTES else 0  # whole-model rows' FP8 codes
        # the reference: fp32 log-probs, or the hidden states they are recomputed from (reference_storage's rule)
        stored = vocab if reference_storage("auto", config, response_tokens) == "logp" else h
        host = response_tokens * stored * 4
    if kind.reference and kind.estimate:  # the estimate's pass and the exact rows do not run at the same time
        fisher = estimate(config, dtype_bytes, "fisher", batch_size, num_sequences, seq_len, response_tokens)
        working = max(working, fisher.working)
        host += fisher.host
    return MemoryEstimate(weights, recorded, working, host, method, batch_tokens, seq_len)


def available(device: str) -> tuple[int, str]:
    """(bytes free, what that is) on the device: one GPU's free memory, all GPUs' for "auto", the host's for cpu."""
    import torch

    if device == "auto":
        free = sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
        return free, f"{torch.cuda.device_count()} GPUs"
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev.index or 0)
        return free, f"{torch.cuda.get_device_name(dev.index or 0)} ({device})"
    return host_available(), "this machine's free memory"


def host_available() -> int:
    """MemAvailable from /proc/meminfo (Linux); a large number where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def check_fits(
    est: MemoryEstimate, device: str, free: int | None = None, host_free: int | None = None, where: str | None = None
) -> None:
    """Refuse, with the option that would fit, a sweep that would run out of memory."""
    if free is None:
        free, where = available(device)
    where = where or device
    on_host = device == "cpu"
    need = est.device + (est.host if on_host else 0)
    budget = free * MARGIN
    if need > budget:
        fix = _what_fits(est, budget, on_host)
        raise FP8ProbeError(
            f"this sweep needs about {need / GiB:.1f} GiB ({est.describe()}), more than "
            f"{where} has free ({free / GiB:.1f} GiB); {fix}"
        )
    if not on_host:
        host_free = host_available() if host_free is None else host_free
        if est.host > host_free * MARGIN:
            raise FP8ProbeError(
                f"this sweep needs about {est.host / GiB:.1f} GiB of host memory for the reference "
                f"log-probabilities, more than is free ({host_free / GiB:.1f} GiB); use fewer "
                "`num_prompts` or `max_new_tokens`"
            )


def _what_fits(est: MemoryEstimate, budget: float, on_host: bool) -> str:
    rest = budget - est.weights - (est.host if on_host else 0)
    if est.weights > budget:
        gpus = "" if on_host else "use `device` auto to spread it over this machine's GPUs, or "
        return f"the weights alone take {est.weights / GiB:.1f} GiB: {gpus}a device with more memory"
    if METHODS[est.method].reference and est.recorded > rest:
        return (
            "the reference's per-block records do not fit: use `method` fisher (no records), or fewer "
            "`num_prompts` / `max_new_tokens`"
        )
    per_token = est.working / max(est.batch_tokens, 1)
    fits = int((rest - est.recorded) // max(per_token, 1)) // max(est.seq_len, 1) if rest > est.recorded else 0
    if fits >= 1:
        return f"one batch does not fit: use `batch_size` {fits} or less"
    return "use fewer `num_prompts` / `max_new_tokens`, `method` fisher, or a device with more memory"


def check_sweep_fits(model, rollouts, method: str, saved) -> None:
    """Refuse a sweep of `model` (a ModelSource) that would not fit in memory: before loading, sized from the
    rollout settings (prompts of up to 256 tokens) or the `saved` rollouts (read once by the caller), and again
    once the rollouts are known."""
    from ..model.devices import parse_dtype

    if saved is not None:
        n, t, m = saved.num_sequences, saved.input_ids.shape[1], saved.num_response_tokens
    else:
        n, t = rollouts.num_prompts * rollouts.samples_per_prompt, 256 + rollouts.max_new_tokens
        m = n * rollouts.max_new_tokens
    nbytes = parse_dtype(model.dtype).itemsize
    check_fits(estimate(model.config(), nbytes, method, rollouts.batch_size, n, t, m), model.device)
