"""W4A8-MXFP4 as an exact e4m3 weight on cuBLASLt's fp8 GEMM (family ``scaled_mm_mx``, torch backend), and
W4A4-MXFP4 with its activations as e4m3 rows too (``scaled_mm_w4a4``).

CPU: the converted weight holds exactly the MXFP4 values (bit for bit after the row scale), rows too wide for
e4m3 are named, NaN block scales stay NaN in their row; the activation row quantizer (interpreter) is its torch
twin byte for byte, exact within 14 binades and within its stated bound beyond.  GPU (``-m gpu``): the families
against the reference, the quantizer on the GPU against its twin, and the fallback of a too-wide weight."""
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import humming_triton as ht
from humming_triton.kernels.families.scaled_mm_mx import MAX_SPAN, as_e4m3_rows
from humming_triton.testing import assert_linear_close, examples, poison_like


def _ramp(k, spread):
    """Per-column factors whose 32-wide blocks ramp over ``spread`` binades along K."""
    return torch.exp2(torch.linspace(0, spread, k // 32)).repeat_interleave(32)


def _weight(n, k, rng, spread=0, scheme="w4a8-mxfp4"):
    """An MXFP4 weight; ``spread``: blocks' magnitudes ramp over that many binades along K."""
    w = torch.randn(n, k, generator=rng) * 0.05
    if spread:
        w = w * _ramp(k, spread)
    return ht.quantize_weight(w, scheme, bias=torch.randn(n, generator=rng))


def _mx_activations(m, k, rng):
    """bf16 activations with the cases the row form must get right: a row whose blocks span more than 14
    binades, an all-zero row, a partly zero block, a NaN, an Inf, a tiny row, an outlier column."""
    x = torch.randn(m, k, generator=rng)
    x[1] *= _ramp(k, -24)
    x[2] = 0
    x[3, 40:64] = 0
    x[4, 5] = float("nan")
    x[5, k - 1] = float("-inf")
    x[6] *= 1e-30
    x[:, 7] *= 300.0
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("shape,spread", [((48, 256), 0), ((100, 1024), 6), ((16, 64), 0), ((40, 2048), 11)], ids=str)
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


@pytest.mark.parametrize("cvt", [False, True], ids=["bits", "cvt"])
def test_mx_rows_quantizer_is_its_torch_twin(cvt, monkeypatch, rng):
    """The Triton quantizer (interpreter here) writes the torch twin's bytes and scales exactly -- its e4m3 bytes
    by bit operations, or by the hardware conversion (``dense.CVT_E4M3``)."""
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import mx_rows_reference, triton_quantize_mx_rows
    monkeypatch.setattr(dense, "CVT_E4M3", cvt)
    spec = ht.QuantScheme.parse("w4a4-mxfp4").act
    for m, k in ((9, 320), (1, 32), (8, 2080), (8, 16416), (260, 2080)):  # K = 16416: two passes
        x = _mx_activations(max(m, 8), k, rng)[:m]
        codes, scales = triton_quantize_mx_rows(x, spec)
        ref_codes, ref_scales = mx_rows_reference(x, spec)
        assert codes.shape == (m, k) and scales.shape == (m, 1)
        assert torch.equal(codes, ref_codes), f"{m}x{k}: {(codes != ref_codes).nonzero()[:5].tolist()}"
        assert torch.equal(scales.isnan(), ref_scales.isnan())
        assert torch.equal(scales.nan_to_num(), ref_scales.nan_to_num())


@settings(max_examples=examples(25))
@given(m=st.integers(1, 5), blocks=st.integers(1, 40), span=st.integers(0, 40), seed=st.integers(0, 2**31 - 1),
       special=st.sampled_from(["none", "nan", "inf", "zero_block", "zero_row", "subnormal"]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), cvt=st.booleans())
def test_mx_rows_quantizer_is_its_twin_on_any_row(m, blocks, span, seed, special, dtype, cvt):
    """Property: for any rows (block magnitudes spread over 0-40 binades, any float input type, special values),
    the quantizer's bytes and scales are its torch twin's (e4m3 bytes by bit operations or ``dense.CVT_E4M3``)."""
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import mx_rows_reference, triton_quantize_mx_rows
    dense_cvt, dense.CVT_E4M3 = dense.CVT_E4M3, cvt
    g = torch.Generator().manual_seed(seed)
    k = 32 * blocks
    x = torch.randn(m, k, generator=g) * torch.exp2(-span * torch.rand(m, blocks, generator=g)).repeat_interleave(32, 1)
    if special == "nan":
        x[0, k // 2] = float("nan")
    elif special == "inf":
        x[m - 1, 0] = float("inf")
    elif special == "zero_block":
        x[:, :32] = 0
    elif special == "zero_row":
        x[0] = 0
    elif special == "subnormal":
        x[0] *= 1e-40 if dtype == torch.float32 else 1e-6
    x = x.to(dtype)
    spec = ht.QuantScheme.parse("w4a4-mxfp4").act
    try:
        codes, scales = triton_quantize_mx_rows(x, spec)
    finally:
        dense.CVT_E4M3 = dense_cvt
    ref_codes, ref_scales = mx_rows_reference(x, spec)
    assert torch.equal(codes, ref_codes), (codes != ref_codes).nonzero()[:5].tolist()
    assert torch.equal(scales.isnan(), ref_scales.isnan())
    assert torch.equal(scales.nan_to_num(), ref_scales.nan_to_num())


def test_mx_rows_hold_the_reference_activation(rng):
    """Codes times row scale are the reference's dequantized MXFP4 activation: exactly for rows whose live
    blocks span at most 14 binades, within 2**-16 of the row's largest block scale beyond; a row holding a NaN
    or an Inf has a NaN scale (its GEMM row is NaN, as the reference's)."""
    from humming_triton.kernels.dense import MX_ROW_SPAN, mx_rows_reference
    spec = ht.QuantScheme.parse("w4a4-mxfp4").act
    x = _mx_activations(12, 1024, rng)
    # the widest exact span: each block's largest magnitude is its ramp factor, 1 .. 2**14 (e8m0 -2 .. 12)
    row = torch.rand(1024, generator=rng) * 2 - 1
    row[::32] = 1.0
    x[8] = (row * _ramp(1024, MX_ROW_SPAN)).bfloat16()
    codes, scales = mx_rows_reference(x, spec)
    q = ht.quantize_activation(x, spec)
    ref = ht.dequantize_activation(q).double()
    got = codes.view(torch.float8_e4m3fn).double() * scales.double()
    live_e = torch.where(q.values().reshape(12, -1, 32).ne(0).any(-1), q.scales.double() - 127, -torch.inf)
    span = (live_e.amax(-1) - live_e.amin(-1)).nan_to_num(0.0)  # an all-zero row has no live block
    assert scales[4].isnan() and scales[5].isnan() and ref[4].isnan().any() and ref[5].isnan().any()
    for i in range(12):
        if i in (4, 5):
            continue
        if span[i] <= MX_ROW_SPAN:
            assert torch.equal(got[i], ref[i]), f"row {i} (span {span[i]})"
        else:
            bound = 2.0 ** (float(live_e[i].max()) - 16)
            assert float((got[i] - ref[i]).abs().max()) <= bound, f"row {i}"
    assert not torch.equal(got[1], ref[1])  # the 24-binade row does exercise the rounding
    assert span[8] == MX_ROW_SPAN and span[1] > MX_ROW_SPAN


def test_w4a4_family_reasons():
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    fam = families.get("scaled_mm_w4a4")

    def call(scheme, dev="cuda"):
        return Call("quant_linear", ht.QuantScheme.parse(scheme), torch.bfloat16, 256, 4096, 4096, device_type=dev)

    assert fam.backend == "torch" and fam.mma(call("w4a4-mxfp4")) == "fp8"
    assert fam.reason(call("w4a4-mxfp4")) is None
    assert "CUDA" in fam.reason(call("w4a4-mxfp4", dev="cpu"))
    assert "MXFP4 activations" in fam.reason(call("w4a4-nvfp4"))
    assert "MXFP4 activations" in fam.reason(call("w4a8-mxfp4"))
    assert "per-token e4m3" in families.get("scaled_mm_mx").reason(call("w4a4-mxfp4"))


@pytest.mark.gpu
def test_mx_rows_quantizer_on_the_gpu(rng):
    from humming_triton.kernels.dense import mx_rows_reference, triton_quantize_mx_rows
    spec = ht.QuantScheme.parse("w4a4-mxfp4").act
    for m, k in ((13, 4096), (300, 2080), (1, 8192)):
        x = _mx_activations(max(m, 8), k, rng)[:m]
        codes, scales = triton_quantize_mx_rows(x.cuda(), spec)
        ref_codes, ref_scales = mx_rows_reference(x, spec)
        assert torch.equal(codes.cpu(), ref_codes), f"{m}x{k}"
        assert torch.equal(scales.cpu().nan_to_num(), ref_scales.nan_to_num())
        assert torch.equal(scales.cpu().isnan(), ref_scales.isnan())


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["scaled_mm_mx", "scaled_mm", "scaled_mm_w4a4"])
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
    elif family == "scaled_mm_w4a4":
        qw = _weight(1040, 2048, rng, spread=5, scheme="w4a4-mxfp4")
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


@pytest.mark.gpu
@pytest.mark.parametrize("m,k", [(1, 8192), (4096, 8192), (333, 2080), (7, 16416)])
@pytest.mark.parametrize("cvt", [False, True], ids=["bits", "cvt"])
def test_mx_rows_quantizer_on_gpu(m, k, cvt, monkeypatch, rng):
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import mx_rows_reference, triton_quantize_mx_rows
    monkeypatch.setattr(dense, "CVT_E4M3", cvt)
    spec = ht.QuantScheme.parse("w4a4-mxfp4").act
    x = _mx_activations(max(m, 8), k, rng)[:m]
    codes, scales = triton_quantize_mx_rows(x.cuda(), spec)
    ref_codes, ref_scales = mx_rows_reference(x, spec)
    assert torch.equal(codes.cpu(), ref_codes)
    assert torch.equal(scales.cpu().nan_to_num(), ref_scales.nan_to_num())
