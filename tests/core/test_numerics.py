"""fake_quant against compressed-tensors' own quantizer and llm-compressor's own observers, bit for bit."""

import compressed_tensors.quantization.quant_scheme as ct_scheme
import pytest
import torch
from compressed_tensors.quantization import fake_quantize, quantize
from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp
from llmcompressor.observers import Observer

from fp8probe import fake_quant
from fp8probe.core.errors import FP8ProbeError
from fp8probe.core.numerics import compute_scale, quantize_weight, simulate_weight, sqnr_db
from fp8probe.core.schemes import KVCacheScheme, Scheme

DTYPES = [torch.float32, torch.bfloat16]


def _nasty(shape, dtype, seed=0):
    """Random values with outliers, exact zeros, a zero row and tiny values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 0.05
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)
    flat[idx[:20]] *= 300.0  # outliers
    flat[idx[20:60]] = 0.0  # exact zeros
    flat[idx[60:80]] *= 1e-6  # values far below the scale
    x = x.view(shape)
    x[..., 1, :] = 0.0 if x.ndim == 3 else x[..., 1, :]
    if x.ndim == 2:
        x[1] = 0.0  # an all-zero row: scale falls back to eps
    return x.to(dtype)


def _ct_args(name, role):
    preset = ct_scheme.PRESET_SCHEMES[name]
    return preset["weights" if role == "weight" else "input_activations"].model_copy(deep=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["FP8", "FP8_DYNAMIC", "FP8_BLOCK"])
@pytest.mark.parametrize("shape", [(256, 384), (200, 300)])  # 200x300: padded blocks
def test_weight_matches_compressed_tensors(name, dtype, shape):
    w = _nasty(shape, dtype)
    args = _ct_args(name, "weight")
    obs = Observer.load_from_registry("memoryless_minmax", base_name="weight", args=args)
    obs(w)
    qp = obs.get_qparams()
    expected = fake_quantize(w, qp["scale"], qp["zero_point"], args)
    ours = fake_quant(w, name, "weight")
    assert ours.dtype == expected.dtype
    assert torch.equal(ours, expected)
    assert torch.equal(compute_scale(w, Scheme.from_name(name).weight).reshape(qp["scale"].shape), qp["scale"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["FP8_DYNAMIC", "FP8_BLOCK", "FP8_TENSOR_DYNAMIC"])
def test_dynamic_input_matches_compressed_tensors(name, dtype):
    x = _nasty((3, 17, 512), dtype, seed=1)  # [batch, seq, hidden]
    if name in ct_scheme.PRESET_SCHEMES:
        args = _ct_args(name, "input")
    else:  # vLLM's online FP8 is no preset: its input spelled out as compressed-tensors arguments
        from compressed_tensors.quantization import QuantizationArgs

        args = QuantizationArgs(**Scheme.from_name(name).config_group()["input_activations"])
        assert (args.strategy, args.dynamic) == ("tensor", True)
    scale, zp = compute_dynamic_scales_and_zp(x, args, module=None)
    expected = fake_quantize(x, scale, zp, args)
    assert torch.equal(fake_quant(x, name, "input"), expected)


def test_per_tensor_dynamic_by_hand():
    """FP8_TENSOR_DYNAMIC (vLLM's quantization="fp8"): one scale for the whole input, amax / 448, recomputed for
    every input; weights one scale per tensor. amax 896 -> scale 2: 3.3 / 2 = 1.65 -> e4m3 1.625 (step 1/8 in
    [1, 2)) -> 3.25; 0.3 / 2 = 0.15 -> 0.15625 (step 1/64 in [1/8, 1/4)) -> 0.3125; the zero stays 0."""
    x = torch.tensor([[896.0, 1.0, -3.3], [0.3, 2.0, 0.0]])
    assert fake_quant(x, "FP8_TENSOR_DYNAMIC", "input").tolist() == [[896.0, 1.0, -3.25], [0.3125, 2.0, 0.0]]
    half = fake_quant(x / 2, "FP8_TENSOR_DYNAMIC", "input")  # a new input: a new scale (1), the same codes
    assert torch.equal(half, fake_quant(x, "FP8_TENSOR_DYNAMIC", "input") / 2)
    s = Scheme.from_name("FP8_TENSOR_DYNAMIC")
    assert (s.weight.strategy, s.input.strategy, s.input.dynamic, s.static_input) == ("tensor", "tensor", True, False)
    assert torch.equal(fake_quant(x, s, "weight"), fake_quant(x, "FP8", "weight"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_static_input_matches_compressed_tensors(dtype):
    calib = _nasty((4, 32, 256), dtype, seed=2)
    args = _ct_args("FP8", "input")
    obs = Observer.load_from_registry("static_minmax", base_name="input", args=args)
    for chunk in calib.split(1):
        obs(chunk)
    qp = obs.get_qparams()
    ours_scale = compute_scale(calib, Scheme.from_name("FP8").input)
    assert torch.equal(ours_scale, qp["scale"])
    x = _nasty((2, 9, 256), dtype, seed=3) * 3  # beyond the calibrated range: saturates at +-448 * scale
    expected = fake_quantize(x, qp["scale"], qp["zero_point"], args)
    ours = fake_quant(x, "fp8", "input", scale=ours_scale)
    assert torch.equal(ours, expected)
    assert ours.abs().max() <= 448 * ours_scale.float().item() * (1 + 1e-6)


def test_saturation_not_nan():
    x = torch.tensor([[1.0, -1.0, 1e4, -1e4, float(2**20)]])
    out = fake_quant(x, "FP8", "input", scale=torch.tensor([1.0]))
    assert torch.equal(out, torch.tensor([[1.0, -1.0, 448.0, -448.0, 448.0]]))
    kv = KVCacheScheme.from_name("fp8_e5m2")
    out = fake_quant(torch.tensor([1e9, -1e9]), kv.spec, scale=torch.tensor([1.0]))
    assert torch.equal(out, torch.tensor([57344.0, -57344.0]))


def test_hand_computed_per_channel():
    # row 0: amax 448 -> scale 1: 3.3 lies between e4m3 codes 3.25 and 3.5 -> 3.25
    # row 1: amax 8.96 -> scale 0.02 (fp32); 1.0/0.02 = 50 (code 48 or 52: ties to even -> 48) -> 0.96
    w = torch.tensor([[448.0, 3.3], [8.96, 1.0]])
    out = fake_quant(w, "FP8_DYNAMIC", "weight")
    assert out[0].tolist() == [448.0, 3.25]
    assert out[1, 1].item() == pytest.approx(48 * (8.96 / 448), rel=1e-6)


@pytest.mark.parametrize("name", ["FP8", "FP8_DYNAMIC", "FP8_BLOCK"])
def test_checkpoint_codes_match_compressed_tensors(name):
    """quantize_weight gives the codes and scales llm-compressor writes for a BF16 model."""
    w32 = _nasty((256, 384), torch.float32, seed=4)
    w = w32.to(torch.bfloat16)
    args = _ct_args(name, "weight")
    obs = Observer.load_from_registry("memoryless_minmax", base_name="weight", args=args)
    obs(w)
    qp = obs.get_qparams()
    ct_codes = quantize(w, qp["scale"], qp["zero_point"], args, dtype=torch.float8_e4m3fn)
    codes, scale = quantize_weight(w32, name)  # from fp32 analysis weights: cast to bf16 first
    assert scale.dtype == torch.bfloat16
    assert torch.equal(codes.view(torch.uint8), ct_codes.view(torch.uint8))
    assert torch.equal(scale.reshape(qp["scale"].shape), qp["scale"])
    sim = simulate_weight(w32, name)
    assert sim.dtype == torch.float32
    assert sqnr_db(w32, sim) > 25


def test_kv_per_head_and_tensor():
    k = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(0))
    k[:, 1] *= 1e5  # one loud head: with one scale per tensor the others fall into e4m3's subnormals
    per_head = compute_scale(k, KVCacheScheme(strategy="head").spec)
    assert per_head.shape == (1, 3, 1, 1)
    assert torch.allclose(per_head.flatten(), k.abs().amax(dim=(0, 2, 3)) / 448)
    assert compute_scale(k, KVCacheScheme().spec).item() == pytest.approx(k.abs().max().item() / 448)
    quiet = [0, 2]
    head, tensor = fake_quant(k, KVCacheScheme(strategy="head")), fake_quant(k, KVCacheScheme())
    assert sqnr_db(k[:, quiet], head[:, quiet]) > sqnr_db(k[:, quiet], tensor[:, quiet]) + 10


def test_unknown_scheme_is_clear():
    with pytest.raises(FP8ProbeError, match="supported: FP8, FP8_DYNAMIC, FP8_BLOCK, FP8_TENSOR_DYNAMIC"):
        fake_quant(torch.zeros(2, 2), "int4")
    assert Scheme.from_name("fp8_dynamic") is Scheme.from_name("FP8_DYNAMIC")
