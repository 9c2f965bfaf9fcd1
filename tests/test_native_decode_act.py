"""Quantized-activation schemes at decode sizes on the native decode GEMM (family ``mma_decode_act``): the
activation codes as 16-bit values, the weight's codes, fp32 sums, the per-token scale on each output row.

CPU: the quantizer's code values are the reference quantizer's codes exactly, and the kernel's arithmetic replayed
from the repacked weight (``decode_mma.emulate``) times the row scales equals the reference on odd shapes.
GPU (``-m gpu``): the kernel against the reference for every candidate config, M = 1..16, poisoned outputs, NaN
rows; and the fp8 accuracy standard -- no less accurate than ``torch._scaled_mm`` (fast accumulation off) on the
same codes.
"""
import pytest
import torch

import humming_triton as ht
from cutlass_ext import decode_mma as dm
from humming_triton.formats.activation import QuantActivation
from humming_triton.kernels.dense import quantize_activation_values
from humming_triton.kernels.families.mma_decode_act import code_dtype
from humming_triton.testing import FP8_STANDARD_FACTOR, assert_linear_close, poison_like

SCHEMES = ["w8a8-fp8", "w8a8-int8", "w4a8-fp8", "w4a8-int8", "w4a8-mxfp4",
           "weight=int4,scale=bf16:g64,act=int8/fp32:token", "weight=e4m3fn,scale=fp16:g128,act=e4m3fn/fp32:token",
           # activation scales per group of K (the kernel scales each group's partial sums)
           "w8a8-fp8-block", "weight=int8,scale=fp32:channel,act=int8/fp32:g128",
           "weight=e4m3fn,scale=fp32:g128,act=e4m3fn/fp32:g64"]
SHAPES = [(37, 512), (100, 1280)]  # odd N (a partial 16-row tile), K a multiple of every group


def _weight(scheme, n, k, rng):
    return ht.quantize_weight(torch.randn(n, k, generator=rng) * 0.05, scheme, bias=torch.randn(n, generator=rng))


def _x(m, k, rng, dtype=torch.float32):
    x = torch.randn(m, k, generator=rng) * 3
    if m > 2:
        x[1] = 0  # an all-zero row: scale 1, zero codes
        x[2, :5] = torch.tensor([1e-6, -2e-3, 448.0, -600.0, 1e4])  # saturating and tiny values
    return x.to(dtype)


def _dequantized(values, scales):
    """The activation the GEMM multiplies: code values times their scale (per token or per group; float64)."""
    return values.double() * scales.double().repeat_interleave(values.shape[1] // scales.shape[1], 1)


def _emulated(values, scales, qw):
    """The kernel's result from the repacked weight: per-token scales multiply the rows; group scales multiply
    each group's partial sums (one emulated product per group of K)."""
    k, groups = values.shape[1], scales.shape[1]
    if groups == 1:
        return dm.emulate(values, dm.repack(qw)) * scales.double()
    p = dm.repack(qw, k // groups)
    g = k // groups
    y = 0
    for i in range(groups):
        part = torch.zeros_like(values)
        part[:, i * g:(i + 1) * g] = values[:, i * g:(i + 1) * g]
        y = y + dm.emulate(part, p) * scales[:, i:i + 1].double()
    return y


@pytest.mark.interpret
@pytest.mark.parametrize("act", ["e4m3fn/fp32:token", "int8/fp32:token", "e4m3fn/fp32:g128", "int8/fp32:g64"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_code_values_are_the_reference_codes(act, dtype, rng):
    spec = ht.QuantScheme.parse(f"weight=int8,scale=fp32:channel,act={act}").act
    x = _x(9, 640, rng, torch.float16)
    x[4, 100] = float("nan")  # a NaN row / group: NaN scale, zero codes (formats/activation.py)
    x[5, 7] = float("inf")
    values, scales = quantize_activation_values(x, spec, dtype)
    ref = ht.quantize_activation(x, spec)
    assert values.dtype == dtype and scales.shape == ref.scales.shape == (9, 640 // (spec.group_k or 640))
    assert torch.equal(values.float(), ref.values()), "the code values differ from the reference codes"
    assert torch.equal(scales.nan_to_num(-1.0), ref.scales.nan_to_num(-1.0))  # NaN exactly where the reference's is
    g = spec.group_k or 640
    for r, c in ((4, 100), (5, 7)):  # the group holding the NaN / inf: NaN scale, zero codes
        assert scales[r, c // g].isnan() and not values[r, c // g * g:(c // g + 1) * g].any()


@pytest.mark.parametrize("spec", ["int8/fp32:tensor", "e2m1/e8m0:g32", "e4m3fn/fp32:token:static", "e4m3fn/e8m0:g32"])
def test_code_values_refuse_what_does_not_factor(spec):
    act = ht.QuantScheme.parse(f"weight=int8,scale=fp32:channel,act={spec}").act
    with pytest.raises(ValueError, match="per-token or per-group"):
        quantize_activation_values(torch.zeros(2, 256), act, torch.float16)


@pytest.mark.interpret
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_emulated_path_matches_reference(scheme, shape, rng):
    qw = _weight(scheme, *shape, rng)
    w_hat = ht.dequantize_weight(qw)
    for m in (1, 7, 16):
        x = _x(m, shape[1], rng)
        values, scales = quantize_activation_values(x, qw.scheme.act, code_dtype(qw.scheme))
        got = _emulated(values, scales, qw) + qw.bias.double()
        x_hat = _dequantized(values, scales)
        ref = x_hat @ w_hat.double().T + qw.bias.double()
        assert_linear_close(got, ref, x_hat, w_hat, torch.float32, f"{scheme} {shape} M={m}")
        # and against the reference's own quantization end to end (the codes are the same)
        full = ht.reference_linear(x, qw, out_dtype=torch.float32).double()
        assert_linear_close(got, full, x_hat, w_hat, torch.float32, f"{scheme} {shape} M={m} end to end")


@pytest.mark.interpret
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_w4a4_mx_rows_emulated_matches_reference(shape, rng):
    """W4A4-MXFP4 on the decode kernel: the activations as e4m3 rows (their values in bf16, a power-of-two
    scale per row; ``dense.triton_quantize_mx_rows``, here the interpreter), the kernel's arithmetic replayed
    from the repacked weight, against the reference end to end."""
    from humming_triton.kernels.dense import triton_quantize_mx_rows
    qw = _weight("w4a4-mxfp4", *shape, rng)
    w_hat = ht.dequantize_weight(qw)
    for m in (1, 7, 16):
        x = _x(m, shape[1], rng)
        values, scales = triton_quantize_mx_rows(x, qw.scheme.act, torch.bfloat16)
        assert values.dtype == torch.bfloat16
        got = dm.emulate(values, dm.repack(qw)) * scales.double() + qw.bias.double()
        x_hat = ht.dequantize_activation(ht.quantize_activation(x, qw.scheme.act)).double()
        assert torch.equal(values.double() * scales.double(), x_hat)  # exact: these rows span < 14 binades
        full = ht.reference_linear(x, qw, out_dtype=torch.float32).double()
        assert_linear_close(got, full, x_hat, w_hat, torch.float32, f"w4a4-mxfp4 {shape} M={m}")


@pytest.mark.interpret
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_w4a4_nv_values_emulated_matches_reference(shape, rng):
    """W4A4-NVFP4 on the decode kernel: the activations as code x block scale values in bf16 (exact) with the
    global scale per row (``dense.block_act_values``, here the interpreter), the kernel's arithmetic replayed from
    the repacked weight, against the reference end to end."""
    from humming_triton.kernels.dense import block_act_values
    qw = _weight("w4a4-nvfp4", *shape, rng)
    w_hat = ht.dequantize_weight(qw)
    for m in (1, 7, 16):
        x = _x(m, shape[1], rng)
        values, rows = block_act_values(x, qw.scheme.act, torch.bfloat16)
        got = dm.emulate(values, dm.repack(qw)) * rows.double()[:, None] + qw.bias.double()
        x_hat = ht.dequantize_activation(ht.quantize_activation(x, qw.scheme.act)).double()
        torch.testing.assert_close(values.double() * rows.double()[:, None], x_hat, rtol=2e-7, atol=0)
        full = ht.reference_linear(x, qw, out_dtype=torch.float32).double()
        assert_linear_close(got, full, x_hat, w_hat, torch.float32, f"w4a4-nvfp4 {shape} M={m}")


def test_family_reasons_and_mma_kinds():
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    fam = families.get("mma_decode_act")
    assert fam.backend == "cuda" and fam.op == "quant_linear"

    def call(scheme, m=4, dtype=torch.bfloat16, n=4096, k=4096):
        return Call("quant_linear", ht.QuantScheme.parse(scheme), dtype, m, n, k)

    for scheme, kind in [("w8a8-fp8", "fp8"), ("w8a8-int8", "fp16"), ("w4a8-fp8", "fp16"), ("w4a8-mxfp4", "bf16")]:
        assert fam.reason(call(scheme)) is None, scheme
        assert fam.mma(call(scheme)) == kind, scheme
    assert fam.reason(call("w8a8-fp8", dtype=torch.float16)) is None  # the codes' type is the family's choice
    assert "M=17" in fam.reason(call("w8a8-fp8", m=17))
    assert fam.reason(call("w8a8-fp8-block")) is None and fam.mma(call("w8a8-fp8-block")) == "fp8"
    assert fam.reason(call("w4a4-mxfp4")) is None and fam.mma(call("w4a4-mxfp4")) == "bf16"  # e4m3 rows
    assert fam.reason(call("w4a4-nvfp4")) is None and fam.mma(call("w4a4-nvfp4")) == "bf16"  # values, global
    assert "per-token or per-group" in fam.reason(call("weight=e2m1,scale=e8m0:g32,act=e4m3fn/e8m0:g32"))
    assert "int8 / e4m3 only" in fam.reason(call("weight=int4,scale=fp16:g128,act=int8/fp32:g128"))
    assert "activation groups of 32" in fam.reason(call("weight=int8,scale=fp32:channel,act=int8/fp32:g32"))
    assert "activation groups of 128" in fam.reason(call("weight=int8,scale=fp32:g64,act=int8/fp32:g128"))
    assert "16-bit activations" in fam.reason(call("w4a16"))
    assert "scale group 32" in fam.reason(call("weight=int4,scale=fp16:g32,act=int8/fp32:token"))
    cands = fam.candidates(call("w8a8-fp8"))
    assert cands and all(c.family == "mma_decode_act" and c.num_warps * 32 <= 512 for c in cands)


# ---- the kernel on the GPU ------------------------------------------------------------------------------------

def _gpu_family():
    from cutlass_ext import native
    from humming_triton.kernels import families
    if native.unavailable():
        pytest.fail(native.unavailable())  # asked for GPU tests: a missing build is a failure, not a skip
    return families.get("mma_decode_act")


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES + ["w4a4-mxfp4", "w4a4-nvfp4"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_kernel_matches_reference(scheme, shape, dtype, rng):
    from humming_triton.calls import Call
    fam = _gpu_family()
    n, k = shape
    qw = _weight(scheme, n, k, rng).to("cuda")
    qc = qw.to("cpu")
    w_hat = ht.dequantize_weight(qc)
    for m in (1, 2, 5, 8, 9, 16):
        x = _x(m, k, rng, dtype)
        q = ht.quantize_activation(x, qw.scheme.act)  # the same codes the kernel's quantizer makes (CPU test)
        x_hat = ht.dequantize_activation(q).double()
        ref = x_hat @ w_hat.double().T + qc.bias.double()
        call = Call("quant_linear", qw.scheme, dtype, m, n, k)
        assert fam.reason(call) is None
        for cfg in fam.candidates(call):
            out = poison_like(torch.empty(m, n, dtype=dtype, device="cuda"))
            y = fam.run(x.cuda(), x.cuda(), qw, qw.bias, dtype, cfg, out)
            assert y.data_ptr() == out.data_ptr()
            assert_linear_close(y.cpu(), ref, x_hat, w_hat, torch.float32, f"{scheme} {shape} M={m} {cfg.describe()}")
        out = poison_like(torch.empty(m, n, dtype=torch.float32, device="cuda"))  # fp32 output
        y = fam.run(x.cuda(), x.cuda(), qw, qw.bias, torch.float32, fam.candidates(call)[0], out)
        assert_linear_close(y.cpu(), ref, x_hat, w_hat, torch.float32, f"{scheme} {shape} fp32 out M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["w8a8-fp8", "w4a8-int8", "w4a8-mxfp4", "w8a8-fp8-block", "w4a4-mxfp4",
                                    "w4a4-nvfp4"])
def test_non_finite_rows_stay_in_their_row(scheme, rng):
    fam = _gpu_family()
    from humming_triton.calls import Call
    qw = _weight(scheme, 64, 512, rng).to("cuda")
    x = _x(4, 512, rng, torch.bfloat16)
    x[1, 3], x[2, 9] = float("nan"), float("inf")
    call = Call("quant_linear", qw.scheme, torch.bfloat16, 4, 64, 512)
    y = fam.run(x.cuda(), x.cuda(), qw, qw.bias, torch.bfloat16, fam.candidates(call)[0], None).cpu()
    assert y[1].isnan().all() and y[2].isnan().all()  # NaN stays NaN, inf becomes NaN (formats/activation.py)
    assert torch.isfinite(y[[0, 3]]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 16])
def test_fp8_no_less_accurate_than_scaled_mm(m, rng):
    """The project's fp8 standard: torch._scaled_mm, fast accumulation off, on the very same codes and scales;
    both against float64 of those codes.  K = 8192 makes the accumulation error visible."""
    from humming_triton.calls import Call
    fam = _gpu_family()
    n, k = 1024, 8192
    qw = _weight("w8a8-fp8", n, k, rng).to("cuda")
    x = _x(m, k, rng, torch.bfloat16).cuda()
    q = ht.quantize_activation(x.cpu(), qw.scheme.act)
    exact = (ht.dequantize_activation(q).double() @ ht.dequantize_weight(qw.to("cpu")).double().T).cuda()
    call = Call("quant_linear", qw.scheme, torch.bfloat16, m, n, k)
    ours = fam.run(x, x, qw, None, torch.float32, fam.candidates(call)[0],
                   torch.empty(m, n, dtype=torch.float32, device="cuda"))
    pad = max(16, m)  # cuBLASLt's fp8 GEMM wants M in multiples of 16
    codes = torch.zeros(pad, k, dtype=torch.uint8)
    codes[:m] = q.codes
    sa = torch.ones(pad, 1)
    sa[:m] = q.scales
    theirs = torch._scaled_mm(codes.cuda().view(torch.float8_e4m3fn), qw.data.view(torch.uint8).view(
        torch.float8_e4m3fn).t(), scale_a=sa.cuda(), scale_b=qw.scales.reshape(1, -1).float(),
        out_dtype=torch.float32, use_fast_accum=False)[:m]
    err = lambda y: ((y.double() - exact).norm() / exact.norm()).item()  # noqa: E731
    assert err(ours) <= FP8_STANDARD_FACTOR * err(theirs), (err(ours), err(theirs))


@pytest.mark.gpu
def test_through_the_op_and_graph_replay(rng):
    _gpu_family()
    qw = _weight("w8a8-fp8", 4096, 2048, rng).to("cuda")
    x = torch.randn(3, 2048, generator=rng).to(torch.bfloat16).cuda()

    def check(y, what):
        q = ht.quantize_activation(x.cpu(), qw.scheme.act)
        x_hat = ht.dequantize_activation(QuantActivation(q.codes, q.scales, q.spec)).double()
        qc = qw.to("cpu")
        w_hat = ht.dequantize_weight(qc)
        ref = x_hat @ w_hat.double().T + qc.bias.double()  # the weight carries its bias (quant_linear adds it)
        assert_linear_close(y.cpu(), ref, x_hat, w_hat, torch.float32, what)

    from humming_triton import dispatch
    y = ht.quant_linear(x, qw, backend="cuda")
    assert dispatch.last_plan().startswith("cuda/mma_decode_act"), dispatch.last_plan()
    check(y, "op")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = ht.quant_linear(x, qw, backend="cuda")
    x.copy_(torch.randn(3, 2048, generator=rng).to(torch.bfloat16))
    g.replay()
    torch.cuda.synchronize()
    check(yg, "graph")


# ---- MoE experts (mma_decode_grouped_act) ---------------------------------------------------------------------

GROUPED_SCHEMES = ["w4a8-mxfp4", "w8a8-fp8", "w4a8-int8", "weight=int4,scale=bf16:g64,act=int8/fp32:token"]


def _experts(scheme, e, n, k, rng):
    return ht.quantize_weight(torch.randn(e, n, k, generator=rng) * 0.05, scheme,
                              bias=torch.randn(e, n, generator=rng))


def _routed(counts, k, rng, dtype=torch.float32):
    x = _x(sum(counts), k, rng, dtype)
    offsets = torch.zeros(len(counts) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(counts), 0)
    return x, offsets


def _grouped_reference(x, qw, offsets):
    """float64 of the reference's own codes: per expert, (code values x scale) @ dequantized weight + bias."""
    q = ht.quantize_activation(x, qw.scheme.act)
    x_hat = ht.dequantize_activation(q).double()
    w_hat = ht.dequantize_weight(qw).double()
    ref = torch.zeros(x.shape[0], qw.N, dtype=torch.float64)
    for e, (r0, r1) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        ref[r0:r1] = x_hat[r0:r1] @ w_hat[e].T + qw.bias[e].double()
    return ref, x_hat, w_hat


@pytest.mark.interpret
@pytest.mark.parametrize("scheme", GROUPED_SCHEMES)
def test_grouped_emulated_path_matches_reference(scheme, rng):
    """The grouped kernel's arithmetic (each expert's repacked rows replayed by ``decode_mma.emulate``) on the
    code values, each row times its token's scale, equals the reference's grouped linear."""
    n, k = 40, 256
    qw = _experts(scheme, 3, n, k, rng)
    p = dm.repack_experts(qw)
    x, offsets = _routed([0, 5, 19], k, rng)  # an expert without rows, one pass, two passes of 16
    values, scales = quantize_activation_values(x, qw.scheme.act, code_dtype(qw.scheme))
    ref, x_hat, w_hat = _grouped_reference(x, qw, offsets)
    full = ht.reference_grouped_linear(x, qw, offsets, out_dtype=torch.float32).double()
    for e, (r0, r1) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        if r1 == r0:
            continue
        got = dm.emulate(values[r0:r1], p.expert(e)) * scales[r0:r1].double() + qw.bias[e].double()
        assert_linear_close(got, ref[r0:r1], x_hat[r0:r1], w_hat[e], torch.float32, f"{scheme} e{e}")
        assert_linear_close(got, full[r0:r1], x_hat[r0:r1], w_hat[e], torch.float32, f"{scheme} e{e} end to end")


def test_grouped_family_reasons():
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    fam = families.get("mma_decode_grouped_act")
    assert fam.backend == "cuda" and fam.op == "grouped_linear"

    def call(scheme, m=8, experts=8, dtype=torch.bfloat16, n=1536, k=2048):
        return Call("grouped_linear", ht.QuantScheme.parse(scheme), dtype, m, n, k, experts)

    for scheme, kind in [("w4a8-mxfp4", "bf16"), ("w8a8-fp8", "fp8"), ("w4a8-int8", "fp16")]:
        assert fam.reason(call(scheme)) is None, scheme
        assert fam.mma(call(scheme)) == kind, scheme
    assert "per-token ones" in fam.reason(call("w8a8-fp8-block"))
    assert "16-bit activations" in fam.reason(call("w4a16"))
    assert "decode batches" in fam.reason(call("w4a8-mxfp4", m=4096))
    assert "MoE experts" in fam.reason(Call("quant_linear", ht.QuantScheme.parse("w4a8-mxfp4"), torch.bfloat16,
                                            8, 1536, 2048))
    assert all(c.family == "mma_decode_grouped_act" for c in fam.candidates(call("w4a8-mxfp4")))
    from humming_triton import dispatch
    assert dispatch._measured_choice(call("w4a8-mxfp4"), {}, None) is None  # untimed: auto needs a table entry


def test_grouped_row_scales_are_checked(rng):
    p = dm.repack_experts(_experts("w4a8-int8", 2, 32, 128, rng))
    x, offsets = _routed([3, 4], 128, rng, torch.float16)
    out = torch.empty(7, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="row_scales must be 7"):
        dm.run_grouped(x, p, offsets, None, out, row_scales=torch.ones(6))


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", GROUPED_SCHEMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_grouped_kernel_matches_reference(scheme, dtype, rng):
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    _gpu_family()
    fam = families.get("mma_decode_grouped_act")
    n, k = 200, 768
    qc = _experts(scheme, 6, n, k, rng)
    qw = qc.to("cuda")
    passes = families.get("mma_decode_grouped_act_passes")  # the same kernel on the pass grid
    for counts in ([0, 1, 0, 0, 2, 1], [3, 0, 17, 1, 40, 5]):
        x, offsets = _routed(counts, k, rng, dtype)
        ref, x_hat, w_hat = _grouped_reference(x, qc, offsets)
        call = Call("grouped_linear", qw.scheme, dtype, x.shape[0], n, k, 6)
        assert fam.reason(call) is None and passes.reason(call) is None
        for off in (offsets.cuda(), offsets.to(torch.int32).cuda()):
            for cfg in fam.candidates(call) + passes.candidates(call)[:3]:
                out = poison_like(torch.empty(x.shape[0], n, dtype=dtype, device="cuda"))
                y = families.get(cfg.family).run(x.cuda(), off, qw, None, dtype, cfg, out)
                assert y.data_ptr() == out.data_ptr()
                for e, (r0, r1) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
                    if r1 > r0:
                        assert_linear_close(y[r0:r1].cpu(), ref[r0:r1], x_hat[r0:r1], w_hat[e], torch.float32,
                                            f"{scheme} {counts} e{e} {cfg.describe()} {off.dtype}")
    y = ht.grouped_linear(x.cuda(), qw, offsets.cuda(), backend="cuda")
    assert y.shape == (x.shape[0], n)


@pytest.mark.gpu
def test_grouped_non_finite_rows_stay_in_their_row(rng):
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    _gpu_family()
    fam = families.get("mma_decode_grouped_act")
    qw = _experts("w4a8-mxfp4", 2, 64, 512, rng).to("cuda")
    x, offsets = _routed([2, 3], 512, rng, torch.bfloat16)
    x[1, 3], x[3, 9] = float("nan"), float("inf")
    call = Call("grouped_linear", qw.scheme, torch.bfloat16, 5, 64, 512, 2)
    y = fam.run(x.cuda(), offsets.cuda(), qw, None, torch.bfloat16, fam.candidates(call)[0], None).cpu()
    assert y[1].isnan().all() and y[3].isnan().all()
    assert torch.isfinite(y[[0, 2, 4]]).all()
