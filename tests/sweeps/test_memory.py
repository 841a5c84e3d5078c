"""The memory estimate refuses what would not fit, names the option that would, and the CLI refuses before loading."""

import json

import pytest
import transformers as tf

from fp8probe.core.errors import FP8ProbeError
from fp8probe.core.units import GiB
from fp8probe.sweeps.memory import check_fits, estimate

# Qwen3-32B's shape (config.json of Qwen/Qwen3-32B): 64 blocks, hidden 5120, 151,936-token vocabulary
QWEN3_32B = dict(
    vocab_size=151936,
    hidden_size=5120,
    intermediate_size=25600,
    num_hidden_layers=64,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
)


def test_weights_and_records_by_hand():
    cfg = tf.LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    # embed + lm_head 2*1000*64, per block q,o 64*64, k,v 64*32, gate/up/down 3*64*128, two norms 2*64; final norm
    params = 2 * 1000 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64
    e = estimate(cfg, 2, "exact", batch_size=4, num_sequences=8, seq_len=100, response_tokens=400)
    assert e.weights == params * 2
    assert e.recorded == 2 * 8 * 100 * 64 * 2  # blocks x tokens x hidden x bf16
    assert e.host == 400 * 1000 * 4  # fp32 reference log-probs
    assert estimate(cfg, 2, "fisher", 4, 8, 100, 400).recorded == 0


def test_32b_on_one_80gb_gpu():
    cfg = tf.Qwen3Config(**QWEN3_32B)
    exact = estimate(cfg, 2, "exact", batch_size=8, num_sequences=16, seq_len=560, response_tokens=16 * 512)
    assert 60 * GiB < exact.weights < 62 * GiB
    check_fits(exact, "cuda", free=80 * GiB, host_free=200 * GiB, where="H100")  # fits
    fisher = estimate(cfg, 2, "fisher", batch_size=8, num_sequences=16, seq_len=560, response_tokens=16 * 512)
    with pytest.raises(FP8ProbeError, match=r"use `batch_size` (\d+) or less") as e:
        check_fits(fisher, "cuda", free=80 * GiB, host_free=200 * GiB, where="H100")
    bs = int(e.value.args[0].split("`batch_size` ")[1].split()[0])
    smaller = estimate(cfg, 2, "fisher", batch_size=bs, num_sequences=16, seq_len=560, response_tokens=16 * 512)
    check_fits(smaller, "cuda", free=80 * GiB, host_free=200 * GiB, where="H100")
    with pytest.raises(FP8ProbeError, match="`device` auto"):
        check_fits(exact, "cuda", free=40 * GiB, host_free=200 * GiB, where="A100-40GB")
    # 16 x 512 response tokens x 151,936 x 4 B of log-probs would be 4.6 GiB: the reference keeps the hidden states
    assert exact.host == 16 * 512 * QWEN3_32B["hidden_size"] * 4  # 160 MiB
    with pytest.raises(FP8ProbeError, match="host memory"):
        check_fits(exact, "cuda", free=80 * GiB, host_free=100 * 2**20, where="H100")


def test_cli_refuses_before_loading(cli, tmp_path):
    d = tmp_path / "qwen3-32b"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **QWEN3_32B})
    )
    out = tmp_path / "out"
    res = cli("sweep", d, "--out", out)
    assert res.code == 2, res.err
    assert len(res.lines) == 1 and "the weights alone take" in res.err and "Traceback" not in res.err
    assert not out.exists()
