"""The throughput model's accounting against hand-computed values (deploy/throughput.py), and the GPU table."""

from __future__ import annotations

import pytest
from conftest import tiny_config

from fp8probe.core.errors import FP8ProbeError
from fp8probe.deploy.capacity import KVGroup, kv_layout
from fp8probe.deploy.gpus import GPU_TABLE, gpu
from fp8probe.deploy.serving import GPUS
from fp8probe.deploy.throughput import Device, blocks_for, simulate, step_model
from fp8probe.model.structure import list_units, meta_model
from fp8probe.recipe.recipe import Recipe

# hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 KV heads, vocabulary 256 (a multiple of 64), untied
CFG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    tie_word_embeddings=False,
)
# per layer: q 64x64, k 64x32, v 64x32, o 64x64, gate/up 64x128, down 128x64 = 36,864 weights; lm_head 256x64
LINEAR = 2 * (4096 + 2048 + 2048 + 4096 + 3 * 8192)  # 73,728
LM_HEAD = 256 * 64  # 16,384 (the input embedding is a lookup: not read whole)
SCALES = 2 * (64 + 32 + 32 + 64 + 128 + 128 + 64) * 4  # FP8_DYNAMIC: one fp32 scale per output channel
KV_TOKEN_LAYER = {"auto": 2 * 2 * 16 * 2, "fp8": 2 * 2 * 16 * 1}  # K and V, 2 heads of 16
UNIT = Device(
    "unit",
    bytes_per_s=1e9,
    bf16_flops=1e12,
    fp8_flops=2e12,
    bandwidth_efficiency=1.0,
    compute_efficiency=1.0,
    step_overhead_s=0.0,
    seq_overhead_s=0.0,
)


def _model(kv="auto", fp8=False, device=UNIT):
    cfg = tiny_config("llama", **CFG)
    rec = Recipe.whole_model(list_units(meta_model(cfg)), "FP8_DYNAMIC") if fp8 else None
    return step_model(cfg, rec, kv, device)


def test_bytes_and_flops_by_hand():
    m = _model()
    assert m.dense_bytes == 2 * (LINEAR + LM_HEAD) and m.expert_bytes == 0
    assert m.bf16_params == LINEAR + LM_HEAD and m.fp8_params == 0
    assert m.kv_bytes_per_token_layer == KV_TOKEN_LAYER["auto"] and m.full_layers == 2 and m.sliding_layers == 0
    # memory-bound: 4 sequences holding 400 tokens
    mem = (2 * (LINEAR + LM_HEAD) + KV_TOKEN_LAYER["auto"] * 2 * 400) / 1e9
    assert float(m.step_s(4, 400, 400)) == pytest.approx(mem, rel=1e-12)
    # compute-bound once the FLOP/s are scarce: 2 x B x weights + 4 x T x heads x head_dim x layers
    slow = _model(
        device=Device(
            "slow",
            1e15,
            1e6,
            2e6,
            bandwidth_efficiency=1.0,
            compute_efficiency=1.0,
            step_overhead_s=0.0,
            seq_overhead_s=0.0,
        )
    )
    flops = 2 * 4 * (LINEAR + LM_HEAD) + 4 * 400 * 64 * 2
    assert float(slow.step_s(4, 400, 400)) == pytest.approx(flops / 1e6, rel=1e-9)


def test_fp8_weights_and_kv_by_hand():
    m = _model(kv="fp8", fp8=True)
    assert m.dense_bytes == LINEAR + SCALES + 2 * LM_HEAD  # the lm_head stays BF16
    assert m.fp8_params == LINEAR and m.bf16_params == LM_HEAD
    assert m.kv_bytes_per_token_layer == KV_TOKEN_LAYER["fp8"]
    slow = _model(
        kv="fp8",
        fp8=True,
        device=Device(
            "slow",
            1e15,
            1e6,
            2e6,
            bandwidth_efficiency=1.0,
            compute_efficiency=1.0,
            step_overhead_s=0.0,
            seq_overhead_s=0.0,
        ),
    )
    # FP8 weights at the FP8 peak (2e6), the rest and attention at BF16's (1e6)
    want = 2 * 4 * LINEAR / 2e6 + (2 * 4 * LM_HEAD + 4 * 400 * 64 * 2) / 1e6
    assert float(slow.step_s(4, 400, 400)) == pytest.approx(want, rel=1e-9)


def test_overheads_and_tensor_parallel():
    d = Device("o", 1e18, 1e18, None, step_overhead_s=0.002, seq_overhead_s=1e-5)
    m = _model(device=d)
    assert float(m.step_s(8, 100, 100)) == pytest.approx(0.002 + 8e-5, rel=1e-6)
    cfg = tiny_config("llama", **CFG)
    m2 = step_model(cfg, None, "auto", d, tp=2)
    assert m2.bf16_params == pytest.approx((LINEAR + LM_HEAD) / 2)  # every Linear split over 2 ranks
    # two all-reduces per layer: latency + 8 x hidden x 2 bytes x 2 x (tp-1)/tp over the link (PCIe: 32 GB/s)
    comm = 2 * 2 * (8e-6 + 8 * 64 * 2 * 2 * 0.5 / 32e9)
    assert float(m2.step_s(8, 100, 100)) == pytest.approx(0.002 + 8e-5 + comm, rel=1e-6)


def test_experts_touched():
    cfg = tiny_config("qwen3_moe")  # 4 experts, 2 per token, layer 0 dense
    m = step_model(cfg, None, "auto", UNIT)
    assert m.experts == 4 and m.experts_per_token == 2
    assert m.expert_share(1) == pytest.approx(0.5) and m.expert_share(2) == pytest.approx(0.75)
    assert m.expert_bytes > 0


def test_blocks_full_and_sliding():
    groups = [KVGroup(None, [0, 1], 16), KVGroup(8, [2], 16)]
    # 40 tokens in blocks of 16: 3 for the full group; the window of 8: ceil(8/16) + 1 = 2
    assert int(blocks_for(40, groups)) == 3 + 2
    assert int(blocks_for(5, groups)) == 1 + 2
    # each group counts in its own block size (a mixed cache's sliding groups: 16 beside a full group's 32)
    assert int(blocks_for(40, [KVGroup(None, [0], 32), KVGroup(24, [1], 16)])) == 2 + (2 + 1)
    cfg = tiny_config("gemma3_text")
    layout = kv_layout(cfg, "auto")
    assert {g.window for g in layout["groups"]} == {None, 8}


def _const(step=1e-3):
    return _model(device=Device("c", 1e30, 1e30, None, step_overhead_s=step, seq_overhead_s=0.0))


def test_the_newest_request_is_preempted_as_vllm_v1_does():
    """Three unequal requests (prompts of 16; responses 48, 32, 32) in 7 blocks of 16, chunks of 16 steps, by hand:
    all three start (2 blocks each, 6 <= 7) and decode 16 steps. At 48 tokens each would hold 3 blocks (9 > 7): vLLM
    V1 preempts the newest, request 2 (vllm/v1/core/sched/scheduler.py: `self.running.pop()`); 0 and 1 decode 16 more
    (request 1 ends at 32). Then 0 needs 4 blocks and the readmitted 2 needs 3 (its prompt and 16 outputs prefilled
    again): 7 <= 7, and both end after 16 more. Steps 16 + 16 + 16 = 48, 1 preemption, prefilled 3 x 16 + 32 = 80.
    Preempting the oldest instead (request 0) would leave it to finish alone afterwards: 64 steps."""
    r = simulate(_const(), [16, 16, 16], [48, 32, 32], num_blocks=7, groups=[KVGroup(None, [0, 1], 16)], max_num_seqs=8)
    assert (r.steps, r.preemptions, r.tokens, r.prefill_tokens, r.max_running) == (48, 1, 112, 80, 3)
    assert r.seconds == pytest.approx(0.048, rel=1e-6)


def test_simulate_by_hand():
    groups = [KVGroup(None, [0, 1], 16)]
    m = _const()
    r = simulate(m, [16, 16], [32, 32], num_blocks=100, groups=groups, max_num_seqs=8)
    assert (r.steps, r.tokens, r.mean_running, r.max_running, r.preemptions) == (32, 64, 2.0, 2, 0)
    assert r.seconds == pytest.approx(0.032, rel=1e-6)  # prefill is free on this device
    one = simulate(m, [16, 16], [32, 32], num_blocks=100, groups=groups, max_num_seqs=1)
    assert (one.steps, one.mean_running) == (64, 1.0)
    assert r.prefill_tokens == 32
    # vLLM V1's preemption (vllm/v1/core/sched/scheduler.py, `_preempt_request`): the victim's blocks are freed and
    # its num_computed_tokens reset to 0, but it keeps its output tokens; resumed, it prefills prompt + outputs
    # (num_tokens - num_computed_tokens) and decodes on from there. 5 blocks of 16: both start (2 blocks each for
    # their first 16 steps) and grow; at 48 tokens each needs 3 (6 > 5): the newest (request 1, 16 tokens generated)
    # is preempted; request 0 finishes its last 16 steps alone; request 1 is readmitted, prefills 16 + 16 tokens and
    # decodes its last 16. Steps 16 + 16 + 16 = 48; prefilled 16 + 16 + 32 = 64; no token generated twice.
    tight = simulate(m, [16, 16], [32, 32], num_blocks=5, groups=groups, max_num_seqs=8)
    assert (tight.preemptions, tight.steps, tight.tokens, tight.prefill_tokens) == (1, 32 + 16, 64, 64)
    assert tight.seconds == pytest.approx(0.048, rel=1e-6)
    assert tight.mean_running == pytest.approx((16 * 2 + 16 + 16) / 48)
    # prefill is charged: on a device whose FLOP/s are finite, the readmission's 32 tokens cost 2 x 32 x weights
    slow = Device(
        "p", 1e30, 1e9, None, bandwidth_efficiency=1.0, compute_efficiency=1.0, step_overhead_s=0.0, seq_overhead_s=0.0
    )
    mp = _model(device=slow)
    tight_p = simulate(mp, [16, 16], [32, 32], num_blocks=5, groups=groups, max_num_seqs=8)
    roomy_p = simulate(mp, [16, 16], [32, 32], num_blocks=100, groups=groups, max_num_seqs=8)
    # compute-bound, bandwidth free: every sequence-step costs 2 x weights + attention over its own context in both
    # runs (the same contexts, in another order), so the tight run costs exactly one more prefill of 32 tokens
    assert tight_p.seconds - roomy_p.seconds == pytest.approx(2 * 32 * (LINEAR + LM_HEAD) / 1e9, rel=1e-6)
    with pytest.raises(ValueError, match="cannot hold even one"):
        simulate(m, [16], [64], num_blocks=2, groups=groups)


def test_gpu_table_is_capacitys():
    assert GPUS["H100"] == GPU_TABLE["H100"].memory_mib and gpu("h100_80gb").name == "H100"
    assert gpu("a100").fp8_tflops is None  # weight-only FP8 on Ampere
    assert all(g.source and g.bandwidth_gbs > 0 and g.bf16_tflops > 0 for g in GPU_TABLE.values())
    with pytest.raises(FP8ProbeError, match="unknown GPU 'X1'; presets:"):
        gpu("X1")
