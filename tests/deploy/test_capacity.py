"""KV-cache capacity against hand-worked numbers for public configs, and weight bytes for the embedded student.

Every expected value below is worked out in the comments from vLLM's accounting (fp8probe/capacity.py):
page = block_size x kv_heads_per_rank x 2 x head_dim x dtype_bytes; bytes_per_block = layers_per_group x
page; num_blocks = kv_memory // bytes_per_block; blocks/request = ceil(L / block_size) (+ sliding groups);
concurrency = num_blocks / blocks per request; tokens = int(concurrency x L).
"""

import json

import pytest
from conftest import in_vllm

from fp8probe import FP8ProbeError
from fp8probe.deploy.capacity import capacity, kv_capacity, kv_layout, weight_bytes_per_gpu
from fp8probe.model.structure import list_units, meta_model
from fp8probe.model.student import load_config
from fp8probe.recipe.recipe import Recipe

GiB = 1 << 30

CONFIGS = {
    # the few fields that matter, from the public config.json files
    "llama-3.1-8b": dict(
        model_type="llama",
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        hidden_size=4096,
        intermediate_size=14336,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    ),
    "qwen3-8b": dict(
        model_type="qwen3",
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        hidden_size=4096,
        intermediate_size=12288,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    ),
    "qwen3-1.7b": dict(
        model_type="qwen3",
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        hidden_size=2048,
        intermediate_size=6144,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
    ),
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe",
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    ),
    "gemma-2-9b": dict(
        model_type="gemma2",
        num_hidden_layers=42,
        num_attention_heads=16,
        num_key_value_heads=8,
        hidden_size=3584,
        intermediate_size=14336,
        head_dim=256,
        vocab_size=256000,
        max_position_embeddings=8192,
        sliding_window=4096,
        tie_word_embeddings=True,
    ),
    "gemma3-270m": dict(
        model_type="gemma3_text",
        num_hidden_layers=18,
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=640,
        intermediate_size=2048,
        head_dim=256,
        vocab_size=262144,
        max_position_embeddings=32768,
        sliding_window=512,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
        tie_word_embeddings=True,
    ),
}


def cfg(name):
    from transformers import AutoConfig

    d = dict(CONFIGS[name])
    return AutoConfig.for_model(d.pop("model_type"), **d)


@pytest.mark.parametrize(
    "name,kv_dtype,tp,mem,max_len,per_token,blocks,tokens,conc",
    [
        # Llama-3.1-8B BF16: 2 x 32 layers x 8 heads x 128 x 2 B = 131,072 B/token; page 16x8x256x2 = 65,536;
        # block 32 x 65,536 = 2 MiB; 10 GiB / 2 MiB = 5,120 blocks; L 8,192 -> 512 blocks/req -> 10.0x, 81,920 tokens
        ("llama-3.1-8b", "auto", 1, 10 * GiB, 8192, 131072, 5120, 81920, 10.0),
        # FP8 KV halves the page: 10,240 blocks, 20.0x, 163,840 tokens
        ("llama-3.1-8b", "fp8", 1, 10 * GiB, 8192, 65536, 10240, 163840, 20.0),
        # Qwen3-8B: 2 x 36 x 8 x 128 x 2 = 147,456 B/token; block 36 x 65,536 = 2,359,296 B;
        # 10 GiB // that = 4,551 blocks; L 40,960 -> 2,560 blocks/req -> 1.7777x, int(4,551/2,560 x 40,960) = 72,816
        ("qwen3-8b", "auto", 1, 10 * GiB, 40960, 147456, 4551, 72816, 4551 / 2560),
        # Qwen3-1.7B: 2 x 28 x 8 x 128 x 2 = 114,688 B/token; block 28 x 65,536 = 1,835,008; 4 GiB // = 2,340;
        # L 32,768 -> 2,048 blocks/req -> 1.142578x, 37,440 tokens
        ("qwen3-1.7b", "auto", 1, 4 * GiB, 32768, 114688, 2340, 37440, 2340 / 2048),
        # Qwen3-30B-A3B: 4 KV heads: 2 x 48 x 4 x 128 x 2 = 98,304 B/token; page 32,768; block 48 x 32,768 =
        # 1,572,864; 20 GiB // = 13,653 blocks; L 32,768 -> 2,048/req -> 6.6665x, 218,448 tokens
        ("qwen3-30b-a3b", "auto", 1, 20 * GiB, 32768, 98304, 13653, 218448, 13653 / 2048),
        # ... FP8 KV: block 786,432 -> 27,306 blocks -> 436,896 tokens
        ("qwen3-30b-a3b", "fp8", 1, 20 * GiB, 32768, 49152, 27306, 436896, 27306 / 2048),
        # ... TP 8 > 4 KV heads: each rank keeps 1 head (replicated): 2 x 48 x 1 x 128 x 2 = 24,576 B/token/rank;
        # block 48 x 8,192 = 393,216; 20 GiB // = 54,613 blocks -> 26.66650x, 873,808 tokens
        ("qwen3-30b-a3b", "auto", 8, 20 * GiB, 32768, 24576, 54613, 873808, 54613 / 2048),
        # Gemma-2-9B: 42 layers, 21 sliding (window 4,096) + 21 full: two groups of 21; page 16x8x512x2 = 131,072;
        # block 21 x 131,072 = 2,752,512; 10 GiB // = 3,900 blocks. Per request at L 8,192 (8,192 tokens in flight):
        # full 512 blocks + sliding ceil(min(4,095 + 8,192, 8,192)/16) + 1 = 513 -> 1,025;
        # 3,900/1,025 = 3.80488x; int(3.80488 x 8,192) = 31,169 tokens. Bytes per token: 2 x 42 x 8 x 256 x 2 = 344,064
        ("gemma-2-9b", "auto", 1, 10 * GiB, 8192, 344064, 3900, 31169, 3900 / 1025),
    ],
)
def test_table(name, kv_dtype, tp, mem, max_len, per_token, blocks, tokens, conc):
    layout = kv_layout(cfg(name), kv_dtype, tp=tp, block_size=16)
    assert layout["bytes_per_token"] == per_token
    cap = kv_capacity(layout, mem, max_len, max_in_flight_tokens=8192)
    assert cap["num_blocks"] == blocks
    assert cap["kv_tokens"] == tokens
    assert cap["max_concurrency"] == pytest.approx(conc, rel=1e-12)


def test_gemma2_in_flight_and_no_hybrid():
    layout = kv_layout(cfg("gemma-2-9b"), "auto", block_size=16)
    # 2,048 tokens in flight: sliding needs ceil(min(4,095 + 2,048, 8,192)/16) + 1 = 384 + 1 = 385 blocks;
    # 512 + 385 = 897 per request; 3,900/897 = 4.347826x -> int(x 8,192) = 35,617 tokens
    cap = kv_capacity(layout, 10 * GiB, 8192, max_in_flight_tokens=2048)
    assert cap["blocks_per_request"] == 897 and cap["kv_tokens"] == 35617
    # --disable-hybrid-kv-cache-manager: one group of 42 full layers: block 42 x 131,072 = 5,505,024;
    # 10 GiB // = 1,950 blocks; 512 per request -> 3.80859x -> 31,200 tokens
    flat = kv_capacity(kv_layout(cfg("gemma-2-9b"), "auto", block_size=16, hybrid=False), 10 * GiB, 8192)
    assert flat["num_blocks"] == 1950 and flat["kv_tokens"] == 31200


@pytest.mark.slow  # the embedded student's config (fetched and converted once)
def test_embedded_student_cpu_block_size():
    # SmolLM2-135M: 30 layers, 3 KV heads x 64, bf16; vLLM CPU block 128: page 128 x 3 x 128 x 2 = 98,304;
    # block 30 x 98,304 = 2,949,120; 1 GiB // = 364 blocks; L 8,192 -> 64 per request -> 5.6875x, 46,592 tokens
    rep = capacity(None, kv_cache_dtype="auto", kv_cache_memory=GiB, block_size=128, max_model_len=8192)
    for side in ("baseline", "candidate"):
        assert getattr(rep, side)["num_blocks"] == 364 and getattr(rep, side)["kv_tokens"] == 46592
        assert getattr(rep, side)["max_concurrency"] == 5.6875
    assert rep.ratio_kv_tokens == 1.0


@pytest.mark.slow  # the real embedded student
def test_embedded_weight_bytes(embedded):
    meta = meta_model(load_config(None))  # the checkpoint's config (bf16), not the fp32-loaded copy
    # BF16: 134,515,008 parameters (tied embeddings once) x 2 bytes
    assert weight_bytes_per_gpu(meta) == 2 * 134_515_008
    # FP8_DYNAMIC on all 210 Linears: 30 x 3,538,944 weights at 1 byte + 30 x 5,184 per-channel fp32 scales;
    # the rest (embeddings 49,152 x 576 + 61 norms x 576) stays 2 bytes:
    # 106,168,320 + 622,080 + 2 x 28,346,688 = 163,483,776
    fp8 = Recipe.whole_model(embedded.units, "FP8_DYNAMIC")
    assert len(fp8.fp8_units(list_units(meta))) == 210
    assert weight_bytes_per_gpu(meta, fp8) == 163_483_776


def test_ratio_fp8_weights_and_kv_qwen3_8b_h100():
    """The GPU-memory path by hand. Qwen3-8B: embeddings and lm_head 151,936 x 4,096 = 622,329,856 each (untied; the
    vocabulary is a multiple of 64), per block q 16,777,216 + k 4,194,304 + v 4,194,304 + o 16,777,216 + gate, up,
    down 50,331,648 each = 192,937,984 Linear weights and 8,448 norm weights; final norm 4,096: 8,190,735,360 in all.
    BF16: 16,381,470,720 bytes. FP8_DYNAMIC: 36 x 192,937,984 at 1 byte + 36 x 38,912 fp32 per-channel scales
    (5,603,328 bytes) + the rest in BF16 (2,489,935,872): 9,441,306,624. Reserve: activations 8,192 x (2 x 12,288 +
    4 x 4,096) x 2 = 671,088,640, sampler 256 x 151,936 x 8 = 311,164,928, non-torch 0.5 GiB: 1,519,124,480.
    H100: 81,559 MiB x 0.9 = 76,968,729,395.2 bytes. KV memory: int(that - weights - reserve) = 59,068,133,785 (BF16)
    and 66,008,297,881 (FP8). A block of all 36 layers: 16 tokens x 8 KV heads x 2 x 128 x 2 bytes x 36 = 2,359,296
    (BF16 KV), 1,179,648 (FP8 KV): 25,036 and 55,955 blocks; 2,048 blocks per 32,768-token request: 12.2246x and
    27.3218x, 400,576 and 895,280 tokens (x2.2350)."""
    rep = capacity(cfg("qwen3-8b"), kv_cache_dtype="fp8", gpu="H100", max_model_len=32768)
    b, c = rep.baseline, rep.candidate
    assert (b["weight_bytes"], c["weight_bytes"]) == (16_381_470_720, 9_441_306_624)
    assert (b["kv_memory_bytes"], c["kv_memory_bytes"]) == (59_068_133_785, 66_008_297_881)
    assert (b["bytes_per_block"], c["bytes_per_block"]) == (2_359_296, 1_179_648)
    assert (b["num_blocks"], c["num_blocks"]) == (25_036, 55_955)
    assert (b["kv_tokens"], c["kv_tokens"]) == (400_576, 895_280)
    assert (b["max_concurrency"], c["max_concurrency"]) == (25_036 / 2048, 55_955 / 2048)
    assert rep.ratio_kv_tokens == pytest.approx(895_280 / 400_576, rel=1e-12)
    assert c["kv_bytes_per_token"] * 2 == b["kv_bytes_per_token"] == 36 * 8 * 2 * 128 * 2


def test_cli_config_only_and_json(cli, tmp_path):
    d = dict(CONFIGS["qwen3-8b"])
    (tmp_path / "config.json").write_text(json.dumps(d))
    r = cli(
        "capacity",
        tmp_path / "config.json",
        "--gpu",
        "H100",
        "--max-model-len",
        "32768",
        "--out",
        tmp_path / "cap",
        "--plot",
    )
    assert r.code == 0, r.err
    rep = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    for side in ("baseline", "candidate"):
        assert {
            "weight_bytes",
            "kv_bytes_per_token",
            "kv_memory_bytes",
            "num_blocks",
            "kv_tokens",
            "max_concurrency",
        } <= set(rep[side])
    assert rep["ratio_kv_tokens"] > 2 and (tmp_path / "cap" / "capacity.png").stat().st_size > 1000
    assert "KV tokens" in r.out
    r = cli("capacity", tmp_path, "--gpu", "X999")
    assert r.code == 2 and "unknown GPU" in r.err


def test_bad_tp():
    with pytest.raises(FP8ProbeError, match="do not split"):
        capacity(cfg("qwen3-8b"), tensor_parallel_size=3)


def test_per_token_head_kv_dtypes_hand_worked():
    """fp8/int8_per_token_head: 1 byte per element plus a 4-byte fp32 scale per token, KV head and side.
    qwen3-1.7b (head_dim 128, 8 KV heads, 28 layers): per token 28 x 8 x (2 x 128 + 8) = 59,136 bytes vs
    BF16 28 x 8 x 512 = 114,688: 2d/(d+4) = 256/132 = 1.939x the tokens; int4: 28 x 8 x (128 + 8) = 30,464."""
    c = cfg("qwen3-1.7b")
    assert kv_layout(c, "fp8_per_token_head")["bytes_per_token"] == 59_136
    assert kv_layout(c, "int8_per_token_head")["bytes_per_token"] == 59_136
    assert kv_layout(c, "int4_per_token_head")["bytes_per_token"] == 30_464
    assert kv_layout(c, "auto")["bytes_per_token"] == 114_688
    rep = capacity(c, kv_cache_dtype="fp8_per_token_head", kv_cache_memory=8 * GiB, max_model_len=4096)
    # page 16 x 8 x 264 = 33,792; x 28 layers = 946,176 per block; 8 GiB // that = 9,078 blocks (BF16: 4,681)
    assert rep.candidate["num_blocks"] == 9_078 and rep.baseline["num_blocks"] == 4_681
    assert rep.vllm_version == "0.32.0"


@pytest.mark.slow
@pytest.mark.vllm
def test_page_sizes_match_vllms_own_arithmetic():
    """vLLM's FullAttentionSpec (+ the Triton backend's per-token-head scale packing) computes the same page."""
    import subprocess

    from fp8probe.deploy.vllm_check import vllm_venv

    code = """
import json, torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
out = {}
for d in ["fp8", "fp8_per_token_head", "int8_per_token_head", "int4_per_token_head", "bfloat16"]:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=STR_DTYPE_TO_TORCH_DTYPE[d],
                             kv_quant_mode=get_kv_quant_mode(d))
    out[d] = TritonAttentionBackend.customize_spec(spec).page_size_bytes
print(json.dumps(out))
"""
    res = subprocess.run([str(vllm_venv()), "-c", code], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    pages = json.loads(res.stdout.strip().splitlines()[-1])
    c = cfg("qwen3-1.7b")  # 8 KV heads of 128, block size 16
    for d, page in pages.items():
        assert kv_layout(c, d, block_size=16)["page_bytes"] == page, d


MIXED_SKIP = (0, 5, 27)  # a per-layer KV map on qwen3-1.7b's 28 layers


def test_mixed_kv_cache_hand_worked():
    """qwen3-1.7b (8 KV heads of 128), FP8 KV but layers 0, 5, 27 BF16, block size 16, 8 GiB: P1 = 8 x 256 = 2,048
    bytes per token and layer in FP8, P2 = 4,096 in BF16; the block grows to 16 x ceil(16 x 4096 / (16 x 2048)) = 32;
    per token 25 x 2,048 + 3 x 4,096 = 63,488; a block 32 x 63,488 = 2,031,616 bytes; 8 GiB // that = 4,228 blocks;
    a request of 8,192 tokens needs 256 blocks: concurrency 16.52, 135,296 tokens."""
    lay = kv_layout(cfg("qwen3-1.7b"), "fp8", block_size=16, skip=MIXED_SKIP)
    assert (lay["block_size"], lay["bytes_per_token"], lay["bytes_per_block"]) == (32, 63_488, 2_031_616)
    cap = kv_capacity(lay, 8 * GiB, 8192)
    assert (cap["num_blocks"], cap["blocks_per_request"], cap["kv_tokens"]) == (4_228, 256, 135_296)
    # through capacity() with a recipe that carries the map: the candidate between all-FP8 and all-BF16 KV
    rec = Recipe.whole_model(list_units(meta_model(cfg("qwen3-1.7b"))), kv_cache_dtype="fp8")
    rec.kv_skip_layers = list(MIXED_SKIP)
    rep = capacity(cfg("qwen3-1.7b"), recipe=rec, kv_cache_memory=8 * GiB, max_model_len=8192)
    assert rep.candidate["kv_tokens"] == 135_296 and rep.candidate["kv_skip_layers"] == list(MIXED_SKIP)
    with pytest.raises(FP8ProbeError, match="skips layer 28, but the model has 28 layers"):
        kv_layout(cfg("qwen3-1.7b"), "fp8", skip=(28,))


@pytest.mark.slow
@pytest.mark.vllm
def test_mixed_kv_cache_matches_vllms_own_accounting(tmp_path):
    """The same mixed cache through vLLM 0.32's own code (#75): EngineArgs -> create_engine_config with the map, the
    CUDA platforms' block-size alignment (Platform._align_heterogeneous_kv_block_size, the Triton backend's kernel
    blocks), each layer's spec as its Attention layer builds it (FP8, or the model dtype where skipped), then
    get_kv_cache_configs and get_kv_cache_capacity: the same block size, blocks, tokens and concurrency as
    kv_layout + kv_capacity, at three block sizes (measured: 16 -> 32 tokens, 4,228 blocks, 135,296 tokens; 32 -> the
    same; 64 -> 64 tokens, 2,114 blocks, 135,296 tokens)."""
    c = cfg("qwen3-1.7b")
    c.architectures = ["Qwen3ForCausalLM"]  # a decoder (vLLM resolves a config without one to a pooling runner)
    c.save_pretrained(tmp_path)
    code = f"""
import json, torch
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity, get_kv_cache_configs
from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode
skip = {[str(i) for i in MIXED_SKIP]!r}
out = {{}}
for bs in (16, 32, 64):
    ea = EngineArgs(model={str(tmp_path)!r}, skip_tokenizer_init=True, dtype="bfloat16", kv_cache_dtype="fp8",
                    kv_cache_dtype_skip_layers=skip, block_size=bs, max_model_len=8192)
    vc = ea.create_engine_config()
    vc.cache_config.block_size = bs  # as given (the CPU platform does not align; the CUDA platforms do, below)
    Platform._align_heterogeneous_kv_block_size(vc, TritonAttentionBackend)
    b = vc.cache_config.block_size
    specs = {{}}
    for i in range(28):
        d = "auto" if str(i) in skip else "fp8"
        specs[f"model.layers.{{i}}.self_attn.attn"] = FullAttentionSpec(
            block_size=b, num_kv_heads=8, head_size=128,
            dtype=torch.bfloat16 if d == "auto" else torch.float8_e4m3fn, kv_quant_mode=get_kv_quant_mode(d))
    # the layout the engine core resolves from its backends' (resolve_kv_cache_layout), then the sizing
    names = [m.name for m in get_supported_kv_cache_layouts([TritonAttentionBackend])]
    resolve_kv_cache_layout(vc, [names], specs.values())
    kcc = get_kv_cache_configs(vc, [specs], [8 << 30])[0]
    tokens, conc = get_kv_cache_capacity(vc, kcc)
    out[bs] = [b, kcc.num_blocks, tokens, conc]
print("RESULT", json.dumps(out))
"""
    got = in_vllm(code)
    print(got)
    for bs, (block, blocks, tokens, conc) in got.items():
        lay = kv_layout(cfg("qwen3-1.7b"), "fp8", block_size=int(bs), skip=MIXED_SKIP)
        cap = kv_capacity(lay, 8 * GiB, 8192)
        assert (lay["block_size"], cap["num_blocks"], cap["kv_tokens"]) == (block, blocks, tokens), bs
        assert cap["max_concurrency"] == pytest.approx(conc, rel=1e-12)


GEMMA_MAPS = [(0,), (0, 1, 16), (3, 9), tuple(i for i in range(18) if i % 6 != 5)]  # sliding-window layers only


def test_mixed_kv_cache_with_sliding_layers_hand_worked():
    """Gemma 3 270M (18 layers, 15 sliding-window of 512 and 3 full, 1 KV head of 256), FP8 KV but layers 0, 1, 16 BF16,
    block 16, 1 GiB, max_model_len 8,192, 2,048 tokens in flight. P1 = 2 x 256 = 512 bytes per token in FP8, P2 =
    1,024: the block grows to 32 and the shared page is 32 x 512 = 16,384. The FP8 sliding layers fit 16,384 / 512 =
    32 tokens a page, the BF16 ones 16; the full layers 32; every page 16,384. Buckets: BF16 sliding (3), FP8 sliding
    (12), full (3): groups of 3 (12 >= 1.5 x 3), 1 + 4 + 1 = 6 groups; a block 3 x 16,384 = 49,152 bytes: 1 GiB // that
    = 21,845 blocks. A request: full ceil(8,192 / 32) = 256; each FP8 sliding group ceil((511 + 2,048) / 32) + 1 = 81,
    x 4 = 324; the BF16 sliding group ceil(2,559 / 16) + 1 = 161: 741 blocks; 21,845 / 741 = 29.48x, 241,503 tokens."""
    lay = kv_layout(cfg("gemma3-270m"), "fp8", block_size=16, skip=(0, 1, 16))
    assert (lay["block_size"], lay["page_bytes"], lay["bytes_per_block"]) == (32, 16_384, 49_152)
    assert (
        sorted((g.window, g.block_size, len(g.layers)) for g in lay["groups"] if g.window)
        == [(512, 16, 3)] + [(512, 32, 3)] * 4
    )
    cap = kv_capacity(lay, GiB, 8192, max_in_flight_tokens=2048)
    assert (cap["num_blocks"], cap["blocks_per_request"], cap["kv_tokens"]) == (21_845, 741, 241_503)
    # a skipped full-attention layer: its unpadded page (32 x 1,024) is twice the sliding layers' padded one, which
    # vLLM 0.32 cannot unify (an assertion; the vLLM test below sees it): refused in one line
    with pytest.raises(FP8ProbeError, match="keep every full-attention layer's KV cache in FP8"):
        kv_layout(cfg("gemma3-270m"), "fp8", skip=(5,))
    with pytest.raises(FP8ProbeError, match="hybrid KV-cache manager"):
        kv_layout(cfg("gemma3-270m"), "fp8", skip=(0,), hybrid=False)


@pytest.mark.slow
@pytest.mark.vllm
def test_mixed_kv_cache_with_sliding_layers_matches_vllm(tmp_path):
    """Gemma 3 270M's mixed caches through vLLM 0.32's own code (#75): create_engine_config with the map, the CUDA
    platforms' block alignment, each layer's spec as its Attention layer builds it (a sliding layer's block from
    vLLM's own _largest_kernel_block_within under the shared padded page), get_kv_cache_configs and
    get_kv_cache_capacity: the same block size, blocks, tokens and concurrency as kv_layout + kv_capacity for four
    maps at three block sizes (measured at 16: 260,237, 241,503, 216,480 and 168,665 tokens); and a skipped
    full-attention layer fails vLLM's own assertion, as kv_layout refuses it."""
    c = cfg("gemma3-270m")
    c.architectures = ["Gemma3ForCausalLM"]
    c.save_pretrained(tmp_path)
    code = f"""
import json, torch
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.attention.attention import _largest_kernel_block_within
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend as B
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity, get_kv_cache_configs
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, get_kv_quant_mode
types = {c.layer_types!r}
def run(skip, bs):
    ea = EngineArgs(model={str(tmp_path)!r}, skip_tokenizer_init=True, dtype="bfloat16", kv_cache_dtype="fp8",
                    kv_cache_dtype_skip_layers=[str(i) for i in skip], block_size=bs, max_model_len=8192)
    vc = ea.create_engine_config()
    vc.cache_config.block_size = bs
    Platform._align_heterogeneous_kv_block_size(vc, B)
    b, shared = vc.cache_config.block_size, vc.cache_config.skip_page_size_padded
    specs = {{}}
    for i, t in enumerate(types):
        d = "auto" if i in skip else "fp8"
        dt, q = torch.bfloat16 if i in skip else torch.float8_e4m3fn, get_kv_quant_mode(d)
        if t == "sliding_attention":
            one = B.customize_spec(SlidingWindowSpec(block_size=1, num_kv_heads=1, head_size=256, dtype=dt,
                                                     kv_quant_mode=q, sliding_window=512))
            per = one.real_page_size_bytes
            sb = _largest_kernel_block_within(B, per, shared or per * b, b, one)
            spec = SlidingWindowSpec(block_size=sb, num_kv_heads=1, head_size=256, dtype=dt, kv_quant_mode=q,
                                     sliding_window=512, page_size_padded=shared)
        else:
            spec = FullAttentionSpec(block_size=b, num_kv_heads=1, head_size=256, dtype=dt, kv_quant_mode=q)
        specs[f"model.layers.{{i}}.self_attn.attn"] = spec
    names = [m.name for m in get_supported_kv_cache_layouts([B])]
    resolve_kv_cache_layout(vc, [names], specs.values())
    kcc = get_kv_cache_configs(vc, [specs], [1 << 30])[0]
    tokens, conc = get_kv_cache_capacity(vc, kcc)
    return [b, kcc.num_blocks, tokens, conc, vc.scheduler_config.max_num_batched_tokens]
out = {{"maps": [[run(skip, bs) for bs in (16, 32, 64)] for skip in {GEMMA_MAPS!r}]}}
try:
    run((5,), 16)
    out["full"] = "ran"
except AssertionError:
    out["full"] = "AssertionError"
print("RESULT", json.dumps(out))
"""
    got = in_vllm(code)
    print(got)
    assert got["full"] == "AssertionError"
    for skip, per_bs in zip(GEMMA_MAPS, got["maps"]):
        for bs, (block, blocks, tokens, conc, in_flight) in zip((16, 32, 64), per_bs):
            lay = kv_layout(cfg("gemma3-270m"), "fp8", block_size=bs, skip=skip)
            cap = kv_capacity(lay, GiB, 8192, max_in_flight_tokens=in_flight)
            assert (lay["block_size"], cap["num_blocks"], cap["kv_tokens"]) == (block, blocks, tokens), (skip, bs)
            assert cap["max_concurrency"] == pytest.approx(conc, rel=1e-12)
