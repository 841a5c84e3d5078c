"""The rollout engine's arithmetic, step by step: profiles of what vLLM 0.32.0 computes for an FP8 recipe (the
Engines vllm-cuda and vllm-cpu of engines.py compute their candidates with `engine_model`).

fp8probe's sweep simulates FP8 units inside an fp32 model (the trainer's reference dtype). A rollout engine
runs the whole model in its own dtype (bf16) and quantizes activations, K/V and even the query its own way.
A profile follows the engine's steps, read from vLLM 0.32.0's source and the FlashAttention 3 kernels it
ships (the README's table names every file):

    model        every op in the engine dtype (bf16): embeddings, norms, rotary, attention, SiLU, residuals
    weights      the checkpoint's codes and scales (bf16-stored, as llm-compressor writes them; per-tensor
                 scales of a fused group requantized to the largest: hooks.checkpoint_codes)
    activations  FP8_DYNAMIC: per-token amax of the bf16 input in fp32, scale = max(amax / 448, 1 / (448 * 512)),
                 codes = e4m3(clamp(x.float() * scale.reciprocal()))                (QuantFP8 / CUDA kernel)
                 FP8 (static): the checkpoint's input scale (bf16-stored), the same reciprocal-multiply
                 FP8_BLOCK: per 128-group of each token, scale = max(amax, 1e-10) / 448, codes = x / scale
                 (per_token_group_quant_fp8)
    GEMM         codes x codes accumulated in fp32, then * x_scale * w_scale in fp32 (per 128-block of the
                 reduction for FP8_BLOCK), + bias, cast to bf16
    FP8 KV       (vllm-cuda: FlashAttention 3 on Hopper) K and V after RoPE stored as e4m3(sat(x / k_scale));
                 the query quantized too, codes = e4m3(clamp(q.float() * (1 / q_scale))), q_scale = k_scale if the
                 checkpoint has none (llm-compressor writes none); S = q.k in fp32 * softmax_scale * q_scale *
                 k_scale; P = exp2(S log2 e - (rowmax - 8)) in [0, 256] (Max_offset 8), row sums from fp32 P;
                 P cast to e4m3 for P.V in fp32; out * v_scale / rowsum, bf16

    vllm-cpu     this machine's vLLM-CPU (no AMX): ChannelWiseTorchFP8ScaledMMLinearKernel, FP8_DYNAMIC Linears.
                 What it cannot run here is not profiled: per-tensor weights (its CPU build leaves
                 _C::static_scaled_fp8_quant, which requantizes them at load, unimplemented), block kernels and FP8
                 MoE (AMX), the FP8 KV cache (AVX-512 C++ attention)
    vllm-cuda    Hopper (H100/H200): CUTLASS / FlashInfer scaled-mm, DeepGEMM / CUTLASS block-scaled mm,
                 FlashAttention 3 with the FP8 KV cache (fp8 = e4m3). FP8_DYNAMIC, FP8, FP8_BLOCK

Where a profile is not exact: the fp32 summation order of every GEMM (CUTLASS, FA3 and Hopper's FP8 tensor-core
accumulator, which keeps fewer bits than fp32 over long reductions); FA3's online softmax takes each row's
running maximum per 128-key tile where the profile takes the whole row's (the same value on the last tile;
P's e4m3 rounding is relative, so only probabilities below e4m3's subnormal range can land differently);
FP8_TENSOR_DYNAMIC's per-tensor scale spans whatever tokens vLLM batches together, here a batch of rollouts;
and every non-FP8 op is transformers' bf16 implementation, not vLLM's kernels (their difference is the BF16
noise floor, measured by benchmarks/engine_fidelity.py). MoE experts follow fused_moe.py's Triton kernel (FP8_DYNAMIC,
FP8: the routing weight multiplies in fp32 before the bf16 cast); the CUTLASS MoE that vLLM may prefer on Hopper
applies it in the top-k reduction instead, after its bf16 output. Not covered: block-scaled experts, fp8_e5m2 and
per-head KV scales on CUDA.
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch

from ..core.errors import FP8ProbeError
from ..core.numerics import quantize
from ..core.schemes import FP8_FORMATS, KVCacheScheme, QuantSpec, Scheme

_PER_TENSOR = QuantSpec("tensor")

FP8_MAX = FP8_FORMATS["e4m3"][1]  # 448
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # vLLM's _FP8_MIN_SCALING_FACTOR
GROUP_EPS = 1e-10  # per_token_group_quant_fp8's eps
MAX_OFFSET = 8  # FlashAttention 3's Max_offset for FP8: P = exp2(s - max + 8), in [0, 256]


# ---------------------------------------------------------------------------------------------------
# Linear


def _codes(x32: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    return (x32 * inv).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def quantize_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's dynamic per-token activation quantization: (e4m3 codes, fp32 scale [..., 1])."""
    amax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    return _codes(x.to(torch.float32), scale.reciprocal()), scale


def quantize_activation_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """A static per-tensor input scale (FP8, and the query of an FP8 KV cache): reciprocal-multiply, clamp."""
    return _codes(x.to(torch.float32), scale.to(torch.float32).reciprocal())


def quantize_activation_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor: one scale over every token of the call."""
    scale = (x.abs().amax().to(torch.float32) / FP8_MAX).clamp(min=MIN_SCALE).reshape(1, 1)
    return _codes(x.to(torch.float32), scale.reciprocal()), scale


def quantize_activation_groups(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_group_quant_fp8: scale per 128 values of a token = max(amax, 1e-10) / 448, codes = x / scale.
    Returns codes [T, K] and scales [T, K / group]."""
    t, k = x.shape
    if k % group:
        raise FP8ProbeError(f"block FP8 needs input width divisible by {group}, got {k}")
    x32 = x.to(torch.float32)
    scale = x32.reshape(t, k // group, group).abs().amax(dim=-1).clamp(min=GROUP_EPS) / FP8_MAX
    return quantize(x32, scale, QuantSpec("group", group_size=group)), scale


def _block_gemm(xc, xs, wc, ws, block: int = 128) -> torch.Tensor:
    """Block-scaled GEMM: per 128-wide slice of the reduction, codes x codes in fp32 times the token group's
    scale and the weight block's scale, summed in fp32. xc [T, K], xs [T, K/128], wc [N, K], ws [N/128, K/128]."""
    n = wc.shape[0]
    out = torch.zeros(xc.shape[0], n, dtype=torch.float32, device=xc.device)
    wsn = ws.to(torch.float32).repeat_interleave(block, dim=0)[:n]  # [N, K/128]
    for kb in range(xs.shape[1]):
        sl = slice(kb * block, (kb + 1) * block)
        out += (xc[:, sl].to(torch.float32) @ wc[:, sl].to(torch.float32).t()) * xs[:, kb : kb + 1] * wsn[:, kb]
    return out


def _fp8_linear(w_codes, w_scale, bias, out_dtype, scheme, input_scale=None):
    b = bias.to(torch.float32) if bias is not None else None
    strategy = scheme.input.strategy
    if strategy == "group":
        wc, ws = w_codes, w_scale.to(torch.float32)
    else:
        wt = w_codes.to(torch.float32).t().contiguous()  # [in, out], exact
        ws = w_scale.to(torch.float32).reshape(1, -1)  # per output channel, or one

    def forward(x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if strategy == "group":
            codes, xs = quantize_activation_groups(x2)
            out = _block_gemm(codes, xs, wc, ws)
        else:
            if strategy == "token":
                codes, xs = quantize_activation(x2)
            elif scheme.static_input:
                codes, xs = quantize_activation_static(x2, input_scale), input_scale.to(torch.float32)
            else:
                codes, xs = quantize_activation_tensor(x2)
            out = (codes.to(torch.float32) @ wt) * xs * ws
        if b is not None:
            out = out + b
        return out.to(out_dtype).reshape(*shape[:-1], out.shape[-1])

    return forward


def _fp8_experts(mod, scheme, out_dtype, calibration=None, name=""):
    """Fused experts as vLLM's FP8 MoE runs them (fused_moe.py): per expert, the routed tokens quantized (per
    token, or the static scale), codes x codes in fp32 * scales; w13 out in bf16; SiLU(gate) * up computed in
    fp32 from the bf16 halves (silu_and_mul), bf16, quantized again; w2 in fp32 * scales * the routing weight,
    bf16; the top-k contributions summed in fp32 (the reduction's order and dtype are the backend's own)."""
    from ..core.numerics import quantize_weight

    if getattr(mod, "gate_up_proj_bias", None) is not None or not hasattr(mod, "gate_up_proj"):
        raise FP8ProbeError(f"{name}: engine profiles cover bias-free gate_up/down experts only; use `engine` sim")
    strategy = scheme.input.strategy
    if strategy not in ("token", "tensor") or (strategy == "tensor" and not scheme.static_input):
        raise FP8ProbeError(f"{name}: engine profiles cover experts in FP8_DYNAMIC and FP8; use `engine` sim")

    def expert_codes(p):
        cs = [quantize_weight(p[e], scheme) for e in range(p.shape[0])]
        return (
            [c.to(torch.float32).t().contiguous() for c, _ in cs],
            [s.to(torch.float32).reshape(1, -1) for _, s in cs],
        )

    (w13, s13), (w2, s2) = expert_codes(mod.gate_up_proj), expert_codes(mod.down_proj)
    static = (
        {w: calibration.input_scale(f"{name}:experts_{w}", scheme.input).to(torch.float32) for w in ("in", "mid")}
        if scheme.static_input
        else None
    )

    def quant(x, which):
        if static is None:
            return quantize_activation(x)
        return quantize_activation_static(x, static[which]), static[which]

    def forward(hidden_states, top_k_index, top_k_weights):
        out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=mod.num_experts).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()[:, 0].tolist():
            pos, tok = torch.where(mask[e])
            c, xs = quant(hidden_states[tok], "in")
            gate, up = ((c.to(torch.float32) @ w13[e]) * xs * s13[e]).to(out_dtype).chunk(2, dim=-1)
            g = gate.to(torch.float32)
            h = (g * torch.sigmoid(g) * up.to(torch.float32)).to(out_dtype)
            c, xs = quant(h, "mid")
            y = (c.to(torch.float32) @ w2[e]) * xs * s2[e] * top_k_weights[tok, pos, None].to(torch.float32)
            out.index_add_(0, tok, y.to(out_dtype).to(torch.float32))
        return out.to(out_dtype)

    return forward


# ---------------------------------------------------------------------------------------------------
# attention with an FP8 KV cache (FlashAttention 3, Hopper)


def _keep_mask(attention_mask, tq: int, tk: int, device) -> torch.Tensor:
    """The model's mask as booleans [B or 1, H or 1, Tq, Tk] (True: attend). None is what transformers' SDPA
    path makes of it: causal (upper-left) for several queries, every key for one (a decoding step)."""
    if attention_mask is None:
        return (
            torch.ones(tq, tk, dtype=torch.bool, device=device).tril()[None, None]
            if tq > 1
            else torch.ones(1, 1, tq, tk, dtype=torch.bool, device=device)
        )
    if attention_mask.dtype == torch.bool:
        return attention_mask[..., :tk]
    return attention_mask[..., :tk] > torch.finfo(attention_mask.dtype).min / 2  # additive: 0 or the dtype's min


def fp8_kv_attention(
    query, key, value, attention_mask, scaling: float, scales, fp8_query: bool = True, fp8_probs: bool = True
):
    """Attention over an FP8 KV cache as FlashAttention 3 computes it (see the module docstring). query
    [B, H, Tq, D], key/value [B, Hkv, Tk, D] in the engine dtype; `scales` (q_scale, k_scale, v_scale), 0-d
    tensors; returns [B, Tq, H, D] in that dtype. fp8_query / fp8_probs False leave the query / P unrounded (what
    each step costs: benchmarks/kv_steps.py)."""
    q_scale, k_scale, v_scale = scales
    f32 = torch.float32
    if not fp8_query:
        query, q_scale = query.to(f32), torch.ones((), dtype=f32)
    qc = quantize_activation_static(query, q_scale).to(f32) if fp8_query else query
    # reshape_and_cache: x / scale, saturated to e4m3 (fp8.quantize, per tensor)
    kc = quantize(key.to(f32), k_scale.to(f32), _PER_TENSOR).to(f32)
    vc = quantize(value.to(f32), v_scale.to(f32), _PER_TENSOR).to(f32)
    groups = query.shape[1] // key.shape[1]
    kc, vc = kc.repeat_interleave(groups, dim=1), vc.repeat_interleave(groups, dim=1)
    tq, tk = query.shape[2], key.shape[2]
    if attention_mask is None and tk > tq > 1:  # transformers' SDPA path crops the keys the same way
        kc, vc, tk = kc[:, :, :tq], vc[:, :, :tq], tq
    s = qc @ kc.transpose(-1, -2)  # fp32 accumulation of exact e4m3 products
    s = s.masked_fill(~_keep_mask(attention_mask, tq, tk, s.device), float("-inf"))
    c = torch.tensor(float(scaling * math.log2(math.e)), dtype=f32) * (q_scale.to(f32) * k_scale.to(f32))
    m = s.amax(dim=-1, keepdim=True)
    m_scaled = torch.where(m == float("-inf"), torch.zeros_like(m), m * c - MAX_OFFSET)
    p = torch.exp2(s * c - m_scaled)  # in [0, 256]; masked keys give 0
    row_sum = p.sum(dim=-1, keepdim=True)
    o = (p.to(torch.float8_e4m3fn).to(f32) if fp8_probs else p) @ vc
    inv = torch.where(row_sum == 0, torch.zeros_like(row_sum), row_sum.reciprocal())
    return (o * (inv * v_scale.to(f32))).to(value.dtype).transpose(1, 2).contiguous()


@contextlib.contextmanager
def _fp8_kv_attention(model, kv, calibration, layers=None):
    from .attention import attention_modules, attention_override, kv_scales

    if getattr(model.config, "attn_logit_softcapping", None):
        raise FP8ProbeError("the FP8 KV-cache profile does not cover attention logit soft-capping; use `engine` sim")
    scales = {}
    for i, mod in attention_modules(model).items():
        if layers is not None and i not in layers:
            continue
        ks, vs = (s.reshape(()).to(torch.float32) for s in kv_scales(kv, i, calibration))
        scales[id(mod)] = (ks, ks, vs)  # vLLM: q_scale = k_scale when the checkpoint stores none

    def attention(module, query, key, value, attention_mask, scaling=None, **_):
        scaling = module.scaling if scaling is None else scaling
        return fp8_kv_attention(query, key, value, attention_mask, scaling, scales[id(module)]), None

    with attention_override(model, attention, layers):
        yield


# ---------------------------------------------------------------------------------------------------
# the model as the engine runs it


@contextlib.contextmanager
def engine_model(
    student, units, scheme: Scheme, profile, kv: KVCacheScheme | None = None, calibration=None, kv_layers=None
):
    """A copy of the student as the engine runs it: the engine dtype everywhere, `units` as vLLM's FP8 Linears
    (codes and scales from the student's own weights, as the exported checkpoint holds them; static input
    scales from `calibration`), and with `kv` the FP8 KV cache of `kv_layers` (all when None; k/v scales from
    `calibration` or 1.0)."""
    from .quantize import checkpoint_codes

    units = list(units)
    linear = [n for n in units if isinstance(student.model.get_submodule(n), torch.nn.Linear)]
    experts = [n for n in units if n not in linear]
    profile.check(scheme, kv, experts=bool(experts))
    if (scheme.static_input and units) or (kv is not None and kv.scale == "calibrated"):
        if calibration is None:
            raise FP8ProbeError("static input scales and a calibrated KV cache need a Calibration from the rollouts")
    codes = checkpoint_codes(student.model, linear, scheme)
    dtype = getattr(torch, profile.dtype)
    model = copy.deepcopy(student.model).to(dtype)
    for name, (c, s) in codes.items():
        mod = model.get_submodule(name)
        x_scale = calibration.input_scale(name, scheme.input) if scheme.static_input else None
        mod.forward = _fp8_linear(c, s, mod.bias, dtype, scheme, x_scale)
    for name in experts:
        mod = model.get_submodule(name)
        mod.forward = _fp8_experts(mod, scheme, dtype, calibration, name)
    try:
        with _fp8_kv_attention(model, kv, calibration, kv_layers) if kv is not None else contextlib.nullcontext():
            yield model
    finally:
        del model


def response_logp(model, rollouts, batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-probabilities [M, V] at the positions that predict the response tokens, and those tokens [M]."""
    from .mismatch import log_softmax32
    from .reference import response_rows

    rows, toks = response_rows(model, rollouts, batch_size)
    return log_softmax32(rows, getattr(model.config, "final_logit_softcapping", None)), toks
