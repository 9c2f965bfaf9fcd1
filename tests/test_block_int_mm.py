"""The fp8 / int8 tensor-core paths of cuBLASLt on our codes (torch backend): ``scaled_mm_block`` (block-scaled
fp8: W8A8-FP8-block as stored, W4A8-FP8 widened to e4m3) and ``int_mm`` (W8A8-INT8, exact int32 sums + our
scale epilogue).

CPU: the families' reasons, the widened weight's exactness, the quantizer's column-major block layout (the
interpreter), and the epilogue kernel.  GPU (``-m gpu``): each family against the float64 reference over odd M,
every output / bias type, within the fp8 tensor cores' accumulation (``testing.FP8_MMA_ROUNDOFF``; cuBLASLt's own
fp8 sums *are* the standard) or, for int8, fp32 epilogue rounding only."""
import pytest
import torch

import humming_triton as ht
from humming_triton.calls import Call, KernelConfig
from humming_triton.kernels import families
from humming_triton.testing import assert_linear_close, poison_like


def _call(scheme, m=256, n=4096, k=4096, dev="cuda"):
    return Call("quant_linear", ht.QuantScheme.parse(scheme), torch.bfloat16, m, n, k, device_type=dev)


def test_block_family_reasons():
    fam = families.get("scaled_mm_block")
    assert fam.backend == "torch" and fam.mma(_call("w8a8-fp8-block")) == "fp8"
    for scheme in ("w8a8-fp8-block", "w4a8-fp8", "weight=e2m1,scale=bf16:g128,act=e4m3fn/fp32:token"):
        assert fam.reason(_call(scheme)) is None, scheme
    assert "CUDA" in fam.reason(_call("w8a8-fp8-block", dev="cpu"))
    assert "e4m3 activations" in fam.reason(_call("w4a8-int8"))
    assert "128x128" in fam.reason(_call("w8a8-fp8"))                      # per-channel: the row-wise family's
    assert "128x128" in fam.reason(_call("weight=int8,scale=fp32:g128,act=e4m3fn/fp32:token"))  # int8 > e4m3
    assert "128x128" in fam.reason(_call("weight=int4,scale=fp16:g64,act=e4m3fn/fp32:token"))
    assert "multiple of 512" in fam.reason(_call("w8a8-fp8-block", k=4224))


def test_int_mm_family_reasons():
    fam = families.get("int_mm")
    assert fam.mma(_call("w8a8-int8")) == "int8" and fam.reason(_call("w8a8-int8")) is None
    assert "M > 16" in fam.reason(_call("w8a8-int8", m=16))
    assert "per-channel" in fam.reason(_call("w4a8-int8"))
    assert "per-token int8" in fam.reason(_call("w8a8-fp8"))
    assert "multiples of 8" in fam.reason(_call("w8a8-int8", n=4100))


@pytest.mark.parametrize("scheme", ["w4a8-fp8", "weight=e2m1,scale=bf16:g128,act=e4m3fn/fp32:token"])
def test_widened_weight_is_exact(scheme, rng):
    from humming_triton.kernels.families.scaled_mm_block import block_weight
    qw = ht.quantize_weight(torch.randn(200, 512, generator=rng) * 0.05, scheme)
    w, scale_b = block_weight(qw)
    assert w.dtype == torch.float8_e4m3fn and w.shape == (200, 512) and scale_b.shape == (200, 4)
    assert scale_b.stride() == (1, 200)
    full = w.float() * scale_b.repeat_interleave(128, dim=1)
    assert torch.equal(full, ht.dequantize_weight(qw).float())
    assert block_weight(qw)[0] is w  # cached on the weight


def test_block_weight_is_stored_tensors():
    from humming_triton.kernels.families.scaled_mm_block import block_weight
    qw = ht.quantize_weight(torch.randn(256, 512) * 0.05, "w8a8-fp8-block")
    w, scale_b = block_weight(qw)
    assert w.data_ptr() == qw.data.data_ptr() and scale_b.data_ptr() == qw.scales.data_ptr()
    assert scale_b.shape == (4, 2) and scale_b.stride() == (1, 4)
    full = w.float() * qw.scales.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal(full, ht.dequantize_weight(qw).float())


@pytest.mark.parametrize("act", ["e4m3fn/fp32:g128", "e4m3fn/fp32:token"])
@pytest.mark.parametrize("m", [1, 6, 8])
def test_block_activation_layout(act, m, rng):
    """Codes and scales as the reference quantizer makes them, scales column-major [M4, K/128] (cuBLASLt's
    1x128 layout), pad rows zero codes with unit scales, per-token scales repeated over the blocks."""
    from humming_triton.kernels.families.scaled_mm_block import quantize_blocks
    spec = ht.QuantScheme.parse(f"weight=e4m3fn,scale=fp32:b128x128,act={act}").act
    x = torch.randn(m, 512, generator=rng).to(torch.bfloat16)
    codes, scales, rows = quantize_blocks(x, spec)
    m4 = -(-m // 4) * 4
    assert rows == m and codes.shape == (m4, 512) and scales.shape == (m4, 4) and scales.stride() == (1, m4)
    ref = ht.quantize_activation(x, spec)
    assert torch.equal(codes.view(torch.uint8)[:m], ref.codes)
    assert torch.equal(scales[:m], ref.scales.expand(m, 4))
    assert not codes.view(torch.uint8)[m:].any() and bool((scales[m:] == 1).all())


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_scale_epilogue(bias, out_dtype, rng):
    from humming_triton.kernels._scale_epilogue import scale_rows_cols_kernel
    m, n = 37, 200
    acc = torch.randint(-2 ** 20, 2 ** 20, (m, n), generator=rng, dtype=torch.int32)
    xs, ws = torch.rand(m, generator=rng) + 0.1, torch.rand(n, generator=rng) + 0.1
    b = torch.randn(n, generator=rng)
    y = poison_like(torch.empty(m, n, dtype=out_dtype))
    scale_rows_cols_kernel[(2, 2)](acc, xs, ws, b, y, m, n, acc.stride(0), y.stride(0), HAS_BIAS=bias,
                                   BLOCK_M=32, BLOCK_N=128)
    want = acc.float() * xs[:, None] * ws[None, :] + (b if bias else 0)
    assert torch.equal(y, want.to(out_dtype))


def _reference(qw, x, bias):
    """(float64 reference output, dequantized x, dequantized weight) of the quantized linear."""
    x_hat = ht.dequantize_activation(ht.quantize_activation(x, qw.scheme.act)).double()
    w_hat = ht.dequantize_weight(qw.to("cpu")).double()
    return x_hat @ w_hat.T + (0 if bias is None else bias.double()), x_hat, w_hat


def _run(family, qw, x, bias, out_dtype):
    m, n = x.shape[0], qw.N
    out = poison_like(torch.empty(m, n, dtype=out_dtype, device="cuda"))
    y = families.get(family).run(x, x, qw, bias, out_dtype, KernelConfig(family), out)
    assert y.data_ptr() == out.data_ptr()
    return y


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["w8a8-fp8-block", "w4a8-fp8"])
@pytest.mark.parametrize("m", [1, 17, 300])
@pytest.mark.parametrize("out_dtype,bias_dtype", [(torch.bfloat16, None), (torch.bfloat16, torch.float32),
                                                  (torch.float16, torch.float16), (torch.float32, None)], ids=str)
def test_block_family_matches_reference(scheme, m, out_dtype, bias_dtype, rng):
    n, k = 768, 2048
    qw = ht.quantize_weight(torch.randn(n, k, generator=rng) * 0.05, scheme).to("cuda")
    bias = None if bias_dtype is None else torch.randn(n, generator=rng).to(bias_dtype)
    x = torch.randn(m, k, generator=rng).to(torch.bfloat16)
    ref, x_hat, w_hat = _reference(qw, x, bias)
    y = _run("scaled_mm_block", qw, x.cuda(), None if bias is None else bias.cuda(), out_dtype)
    assert_linear_close(y.cpu(), ref, x_hat, w_hat, torch.float8_e4m3fn, f"{scheme} M={m} {out_dtype} {bias_dtype}")
    if out_dtype != torch.bfloat16:  # the fp8 tolerance cannot see a bf16 rounding: the values must not all be bf16's
        assert not bool((y.float() == y.to(torch.bfloat16).float()).all()), f"{out_dtype}: went through bf16"


@pytest.mark.gpu
@pytest.mark.parametrize("m", [17, 300])
@pytest.mark.parametrize("out_dtype,bias_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, None),
                                                  (torch.float32, torch.float32)], ids=str)
def test_int_mm_family_matches_reference(m, out_dtype, bias_dtype, rng):
    """int8 x int8 sums are exact: what remains is the fp32 epilogue (``acc * xs * ws``) and the output's rounding,
    inside the fp32-MMA tolerance."""
    n, k = 776, 2048
    qw = ht.quantize_weight(torch.randn(n, k, generator=rng) * 0.05, "w8a8-int8").to("cuda")
    bias = None if bias_dtype is None else torch.randn(n, generator=rng).to(bias_dtype)
    x = torch.randn(m, k, generator=rng).to(torch.bfloat16)
    ref, x_hat, w_hat = _reference(qw, x, bias)
    y = _run("int_mm", qw, x.cuda(), None if bias is None else bias.cuda(), out_dtype)
    assert_linear_close(y.cpu(), ref, x_hat, w_hat, torch.float32, f"int_mm M={m} {out_dtype} {bias_dtype}")
