"""W4A8-MXFP4 as an exact e4m3 weight on cuBLASLt's fp8 GEMM (family ``scaled_mm_mx``, torch backend).

CPU: the converted weight holds exactly the MXFP4 values (bit for bit after the row scale), rows too wide for
e4m3 are named, NaN block scales stay NaN in their row.  GPU (``-m gpu``): the family against the reference, and
the fallback of a too-wide weight."""
import warnings

import pytest
import torch

import humming_triton as ht
from humming_triton.kernels.families.scaled_mm_mx import MAX_SPAN, as_e4m3_rows
from humming_triton.testing import assert_linear_close, poison_like


def _weight(n, k, rng, spread=0):
    """An MXFP4 weight; ``spread``: blocks' magnitudes ramp over that many binades along K."""
    w = torch.randn(n, k, generator=rng) * 0.05
    if spread:
        ramp = torch.exp2(torch.linspace(0, spread, k // 32)).repeat_interleave(32)
        w = w * ramp
    return ht.quantize_weight(w, "w4a8-mxfp4", bias=torch.randn(n, generator=rng))


@pytest.mark.parametrize("shape,spread", [((48, 256), 0), ((100, 1024), 6), ((16, 64), 0)], ids=str)
def test_conversion_is_exact(shape, spread, rng):
    qw = _weight(*shape, rng, spread)
    view = as_e4m3_rows(qw)
    assert not isinstance(view, str), view
    w, s = view
    assert w.dtype == torch.float8_e4m3fn and w.shape == shape and s.shape == (shape[0],)
    assert torch.equal(w.float() * s[:, None], ht.dequantize_weight(qw).float())


def test_a_row_too_wide_for_e4m3_is_named(rng):
    qw = _weight(32, 1024, rng, spread=MAX_SPAN + 4)
    why = as_e4m3_rows(qw)
    assert isinstance(why, str) and "binades" in why


def test_zero_blocks_and_nan_scales(rng):
    qw = _weight(32, 256, rng)
    qw.data[1] = 0          # row 1 all zero codes: no live block, any exponent
    qw.scales[1, 0] = 250   # a huge exponent on a zero block must not count (nor overflow)
    qw.scales[2, 3] = 255   # a NaN block scale: row 2 is NaN, as the reference's output column
    w, s = as_e4m3_rows(qw)
    ref = ht.dequantize_weight(qw).float()
    assert s[2].isnan() and ref[2].isnan().any()
    keep = torch.arange(32) != 2
    assert torch.equal(w.float()[keep] * s[keep, None], ref[keep])
    assert torch.isfinite(w.float()).all()


def test_family_reasons():
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    fam = families.get("scaled_mm_mx")

    def call(scheme, n=4096, k=4096, dev="cuda"):
        return Call("quant_linear", ht.QuantScheme.parse(scheme), torch.bfloat16, 256, n, k, device_type=dev)

    assert fam.backend == "torch" and fam.mma(call("w4a8-mxfp4")) == "fp8"
    assert fam.reason(call("w4a8-mxfp4")) is None
    assert "CUDA" in fam.reason(call("w4a8-mxfp4", dev="cpu"))
    assert "MXFP4" in fam.reason(call("w8a8-fp8"))
    assert "per-token e4m3" in fam.reason(call("w4a8-mx"))
    assert "multiple of 16" in fam.reason(call("w4a8-mxfp4", n=4100))


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["scaled_mm_mx", "scaled_mm"])
@pytest.mark.parametrize("m", [1, 16, 300])
@pytest.mark.parametrize("out_dtype,bias_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                  (torch.float16, torch.float16), (torch.float32, None)], ids=str)
def test_family_matches_reference(family, m, out_dtype, bias_dtype, rng):
    """Both row-wise fp8 families, every output / bias type: the bf16 epilogue where it is exact (bf16 out, bf16
    bias), fp32 sums scaled afterwards otherwise -- within the fp8 tensor cores' accumulation (cuBLASLt's sums are
    not fp32-exact: ``testing.FP8_MMA_ROUNDOFF``) and one rounding to the output type, never a bf16 rounding of an
    fp16 / fp32 output or of an fp32 bias."""
    from humming_triton.kernels import families
    from humming_triton.calls import KernelConfig
    fam = families.get(family)
    if family == "scaled_mm_mx":
        qw = _weight(1040, 2048, rng, spread=5)
    else:
        qw = ht.quantize_weight(torch.randn(1040, 2048, generator=rng) * 0.05, "w8a8-fp8")
    bias = None if bias_dtype is None else torch.randn(1040, generator=rng).to(bias_dtype)
    qw = qw.to("cuda")
    x = torch.randn(m, 2048, generator=rng).to(torch.bfloat16)
    q = ht.quantize_activation(x, qw.scheme.act)
    x_hat = ht.dequantize_activation(q).double()
    w_hat = ht.dequantize_weight(qw.to("cpu")).double()
    ref = x_hat @ w_hat.T + (0 if bias is None else bias.double())
    out = poison_like(torch.empty(m, 1040, dtype=out_dtype, device="cuda"))
    y = fam.run(x.cuda(), x.cuda(), qw, None if bias is None else bias.cuda(), out_dtype, KernelConfig(family), out)
    assert y.data_ptr() == out.data_ptr()
    assert_linear_close(y.cpu(), ref, x_hat, w_hat, torch.float8_e4m3fn, f"{family} M={m} {out_dtype} bias {bias_dtype}")
    if out_dtype != torch.bfloat16:  # the fp8 tolerance cannot see a bf16 rounding: the values must not all be bf16's
        on_bf16_grid = y.float() == y.to(torch.bfloat16).float()
        assert not bool(on_bf16_grid.all()), f"{family} {out_dtype}: the output went through bf16"


@pytest.mark.gpu
def test_too_wide_weight_falls_back_with_a_warning(rng):
    from humming_triton.kernels import families
    from humming_triton.calls import KernelConfig
    fam = families.get("scaled_mm_mx")
    qw = _weight(64, 1024, rng, spread=MAX_SPAN + 4).to("cuda")
    x = torch.randn(5, 1024, generator=rng).to(torch.bfloat16).cuda()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        y = fam.run(x, x, qw, None, torch.bfloat16, KernelConfig("scaled_mm_mx"), None)
        fam.run(x, x, qw, None, torch.bfloat16, KernelConfig("scaled_mm_mx"), None)
    assert sum("dequant_mm" in str(r.message) for r in rec) == 1  # once per weight
    ref = ht.reference_linear(x.cpu(), qw.to("cpu"), out_dtype=torch.float32)
    assert float((y.cpu().float() - ref).norm() / ref.norm()) < 1e-2
