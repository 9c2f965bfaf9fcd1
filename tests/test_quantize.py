import pytest
import torch

import humming_triton as ht
from humming_triton.formats.packing import unpack_codes
from humming_triton.formats.scheme import PRESETS
from humming_triton.testing import weight_error_bound

SHAPES = [(64, 256), (3, 48, 128), (33, 384)]  # 2-D, MoE 3-D, odd N


def _weights(shape, rng):
    w = torch.randn(*shape, generator=rng)
    # a few outliers, as real layers have
    w.view(-1)[torch.randint(0, w.numel(), (max(1, w.numel() // 500),), generator=rng)] *= 8
    return w


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_quantize_dequantize_error_bound(preset, shape, rng):
    w = _weights(shape, rng)
    qw = ht.quantize_weight(w, preset)
    assert qw.shape == tuple(shape)
    w_hat = ht.dequantize_weight(qw)
    assert w_hat.dtype == torch.float32 and w_hat.shape == w.shape
    err = (w.double() - w_hat.double()).abs()
    bound = weight_error_bound(w, qw)
    assert bool((err <= bound).all()), f"worst excess {(err - bound).max().item():.3g}"
    # round-to-nearest is idempotent: quantizing the dequantized weight again changes nothing
    assert torch.equal(ht.dequantize_weight(ht.quantize_weight(w_hat, preset)), w_hat) or preset in (
        "nvfp4", "w4a4-nvfp4", "w1a16", "w2a16", "w3a16", "w4a16-asym", "w8a16-asym")


# Relative Frobenius error on Gaussian weights: documented expectations (not tolerances of a kernel).
QUALITY = {"w8a16": 0.01, "w8a16-fp8": 0.04, "w4a16": 0.13, "w4a16-asym": 0.12, "mxfp4": 0.13, "nvfp4": 0.11,
           "w3a16": 0.24, "w2a16": 0.55, "w1a16": 0.65, "w6a16-fp6": 0.06}


@pytest.mark.parametrize("preset", sorted(QUALITY))
def test_quality_on_gaussian(preset, rng):
    w = torch.randn(256, 512, generator=rng)
    w_hat = ht.dequantize_weight(ht.quantize_weight(w, preset))
    assert ((w - w_hat).norm() / w.norm()).item() < QUALITY[preset]


def test_layout_shapes_documented():
    w = torch.randn(2, 100, 256)
    qw = ht.quantize_weight(w, "nvfp4")
    assert qw.data.shape == (2, 100, 256 * 4 // 32) and qw.data.dtype == torch.int32
    assert qw.scales.shape == (2, 100, 16) and qw.scales.dtype == torch.uint8
    assert qw.global_scale.shape == (2,)
    qb = ht.quantize_weight(torch.randn(300, 200), "w8a16-fp8-block")  # (w8a8: its g128 activations need 128 | K)
    assert qb.scales.shape == (3, 2) and qb.scales.dtype == torch.float32
    q3 = ht.quantize_weight(torch.randn(8, 256), "w3a16")
    assert q3.data.shape == (8, 24) and q3.zeros.dtype == torch.uint8


def test_int4_dequant_matches_gptq_formula(rng):
    w = torch.randn(16, 256, generator=rng)
    qw = ht.quantize_weight(w, "w4a16")
    q = unpack_codes(qw.data, 4, 256)
    q = torch.where(q >= 8, q - 16, q).float()  # two's complement int4
    manual = q * qw.scales.float().repeat_interleave(128, dim=1)
    assert torch.equal(manual, ht.dequantize_weight(qw))
    asym = ht.quantize_weight(w, "w4a16-asym")
    q = unpack_codes(asym.data, 4, 256).float()
    manual = (q - asym.zeros.float().repeat_interleave(128, 1)) * asym.scales.float().repeat_interleave(128, 1)
    assert torch.equal(manual, ht.dequantize_weight(asym))


def test_mx_scales_are_powers_of_two_and_never_clip(rng):
    w = torch.randn(32, 128, generator=rng) * 3
    qw = ht.quantize_weight(w, "mxfp4")
    s = 2.0 ** (qw.scales.float() - 127)
    blocks = w.reshape(32, 4, 32).abs().amax(-1)
    assert bool((blocks <= 6 * s).all()) and bool((blocks > 3 * s).all())


def test_nvfp4_global_scale_convention(rng):
    w = torch.randn(64, 64, generator=rng)
    qw = ht.quantize_weight(w, "nvfp4")
    assert torch.allclose(qw.global_scale, w.abs().amax() / (448 * 6))


def test_bias_and_input_scale_are_carried(rng):
    b = torch.randn(64, generator=rng)
    qw = ht.quantize_weight(torch.randn(64, 128, generator=rng), "w8a8-fp8", bias=b, input_scale=0.5)
    assert torch.equal(qw.bias, b) and qw.input_scale.item() == 0.5


def test_e8m0_scale_is_exact_ceil_log2():
    """2**ceil(log2(s)) from the float64 bits: exact just above a power of two (where a rounded log2 can land on
    the integer), clamped to the e8m0 range, inf saturating like the fused kernels."""
    from humming_triton.formats.dtypes import parse_scale_type
    from humming_triton.formats.quantize import round_scale
    s = torch.tensor([1.0, 1 + 2.0 ** -52, 0.75, 2.0 ** -130, 2.0 ** 130, float("inf")], dtype=torch.float64)
    codes, vals = round_scale(s, parse_scale_type("e8m0"))
    assert codes.tolist() == [127, 128, 127, 0, 254, 254]
    assert vals[:3].tolist() == [1.0, 2.0, 1.0]
