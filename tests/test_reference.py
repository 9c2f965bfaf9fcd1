"""The reference ops against independent float64 computations."""
import pytest
import torch

import humming_triton as ht
from humming_triton.formats.scheme import PRESETS
from humming_triton.testing import assert_linear_close


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("m", [1, 7])
def test_quant_linear_reference_vs_float64(preset, m, rng):
    n, k = 48, 256
    w = torch.randn(n, k, generator=rng)
    bias = torch.randn(n, generator=rng)
    qw = ht.quantize_weight(w, preset)
    x = torch.randn(2, m, k, generator=rng)
    y = ht.quant_linear(x, qw, bias=bias, backend="reference", out_dtype=torch.float32)
    assert ht.last_backend() == "reference" and y.shape == (2, m, n)
    # float64 oracle, written independently of reference_linear
    w64 = ht.dequantize_weight(qw).double()
    x64 = x.double()
    if qw.scheme.act is not None:
        x64 = ht.dequantize_activation(ht.quantize_activation(x, qw.scheme)).double()
    y64 = x64 @ w64.T + bias.double()
    assert_linear_close(y, y64, x64, w64, torch.float32, preset)


def test_output_dtype_follows_input(rng):
    qw = ht.quantize_weight(torch.randn(32, 128, generator=rng), "w4a16")
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        assert ht.quant_linear(torch.randn(3, 128, generator=rng).to(dt), qw).dtype == dt


def test_empty_batch():
    qw = ht.quantize_weight(torch.randn(32, 128), "w4a16")
    assert ht.quant_linear(torch.randn(0, 128), qw).shape == (0, 32)


@pytest.mark.parametrize("spec,torch_dtype,qmax", [("w8a8-fp8", torch.float8_e4m3fn, 448.0)])
def test_per_token_fp8_activation_matches_torch_cast(spec, torch_dtype, qmax, rng):
    x = torch.randn(5, 256, generator=rng) * 3
    q = ht.quantize_activation(x, spec)
    s = x.abs().amax(-1, keepdim=True) / qmax
    assert torch.allclose(q.scales, s)
    ref = (x.double() / q.scales.double()).to(torch_dtype)
    assert torch.equal(q.as_torch().float(), ref.float())


def test_int8_block_and_mx_activation_quantization(rng):
    x = torch.randn(4, 256, generator=rng)
    q = ht.quantize_activation(x, "w8a8-int8")
    assert torch.equal(q.as_torch().float(), torch.round(x.double() / q.scales.double()).clamp(-128, 127).float())
    qb = ht.quantize_activation(x, "w8a8-fp8-block")
    assert qb.scales.shape == (4, 2)
    qm = ht.quantize_activation(x, "w4a4-mxfp4")
    assert qm.scales.shape == (4, 8) and qm.scales.dtype == torch.uint8
    for qq in (q, qb, qm):
        err = (ht.dequantize_activation(qq) - x).abs()
        assert err.max() < x.abs().max() * 0.35


def test_static_activation_scale(rng):
    x = torch.randn(4, 128, generator=rng)
    s = ht.QuantScheme.parse("weight=int8,scale=fp32:channel,act=int8/fp32:tensor:static")
    q = ht.quantize_activation(x, s, input_scale=0.05)
    assert torch.allclose(q.scales, torch.full_like(q.scales, 0.05))
    with pytest.raises(ValueError, match="input_scale"):
        ht.quantize_activation(x, s)


@pytest.mark.parametrize("preset", ["w4a16", "nvfp4", "w8a8-fp8"])
def test_grouped_linear_matches_per_expert(preset, rng):
    e, n, k = 4, 32, 128
    qw = ht.quantize_weight(torch.randn(e, n, k, generator=rng), preset)
    counts = [3, 0, 5, 1]
    offsets = torch.tensor([0, 3, 3, 8, 9])
    x = torch.randn(sum(counts), k, generator=rng)
    # the reference backend on both sides (under the test session's interpreter, auto would pick two different
    # Triton kernels, whose fp32 summation orders differ by more than this test's 1e-5)
    y = ht.grouped_linear(x, qw, offsets, out_dtype=torch.float32, backend="reference")
    for i in range(e):
        rows = slice(int(offsets[i]), int(offsets[i + 1]))
        if counts[i]:
            want = ht.quant_linear(x[rows], qw.expert(i), out_dtype=torch.float32, backend="reference")
            assert torch.allclose(y[rows], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fused_moe_reference_vs_naive(activation, rng):
    t, h, inter, e, topk = 6, 128, 128, 5, 2
    w13 = ht.quantize_weight(torch.randn(e, 2 * inter, h, generator=rng) / 8, "w4a16", bias=torch.randn(e, 2 * inter))
    w2 = ht.quantize_weight(torch.randn(e, h, inter, generator=rng) / 8, "w4a16")
    x = torch.randn(t, h, generator=rng)
    logits = torch.randn(t, e, generator=rng)
    wts, ids = torch.topk(torch.softmax(logits, -1), topk)
    y = ht.fused_moe(x, w13, w2, wts, ids, activation=activation)
    W13, W2 = ht.dequantize_weight(w13).double(), ht.dequantize_weight(w2).double()
    want = torch.zeros(t, h, dtype=torch.float64)
    for ti in range(t):
        for j in range(topk):
            ex = int(ids[ti, j])
            hh = W13[ex] @ x[ti].double() + w13.bias[ex].double()
            if activation == "silu":
                g, u = hh[:inter], hh[inter:]
                a = torch.nn.functional.silu(g) * u
            else:
                g, u = hh[0::2].clamp(max=7), hh[1::2].clamp(-7, 7)
                a = (u + 1) * g * torch.sigmoid(1.702 * g)
            want[ti] += wts[ti, j].double() * (W2[ex] @ a)
    assert torch.allclose(y.double(), want, rtol=1e-4, atol=1e-4)
