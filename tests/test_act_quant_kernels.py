"""The quantized-activation tensor-core paths (W8A8-FP8 channel/block, W4A8-FP8, W4A8-MXFP4 on fp8 MMAs;
W8A8-INT8, W4A8-INT8 on int8 MMAs): the fused activation quantizer against the reference quantizer, and the
GEMM against the reference on the very activation codes the kernel produced.  CPU: interpreter; `pytest -m gpu`."""
import dataclasses

import pytest
import torch

import humming_triton as ht
from humming_triton.kernels import configs
from humming_triton.formats.activation import QuantActivation
from humming_triton.testing import unit_roundoff, assert_linear_close, poison_like

SCHEMES = ["w8a8-fp8", "w8a8-fp8-block", "w4a8-fp8", "w4a8-mxfp4", "weight=e2m1,scale=fp16:g64,act=e4m3fn/fp32:g64",
           "w8a8-int8", "w4a8-int8", "weight=int8,scale=fp32:channel,act=int8/fp32:g128",
           "w4a4-mxfp4", "w4a4-nvfp4", "weight=int4,scale=fp16:g128,act=e2m1/e8m0:g32", "w8a8-mxfp8",
           "w4a8-mx"]


@pytest.mark.interpret
@pytest.mark.parametrize("scheme", ["w8a8-fp8", "w8a8-fp8-block", "w8a8-int8",
                                    "weight=int8,scale=fp32:channel,act=int8/fp32:g128", "w4a4-mxfp4", "w4a4-nvfp4",
                                    "w8a8-mxfp8"])
@pytest.mark.parametrize("fast", [False, True], ids=["per_group", "tiled"])
def test_activation_quantizer_matches_reference(scheme, fast, monkeypatch, rng):
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import triton_quantize_activation
    monkeypatch.setattr(dense, "FAST_ACT_QUANT", fast)  # block formats: a program per group, or tiles of them
    act = ht.QuantScheme.parse(scheme).act
    x = (torch.randn(37, 640, generator=rng) * 4).half()
    x[3] = 0  # an all-zero row keeps scale 1
    x[5, :7] = torch.tensor([1e-6, -2e-3, 448.0, -600.0, 1e4, 0.0, 3.0], dtype=torch.half)
    x[6, :32] = 1e-7  # a block of tiny values: the e4m3 block scale bottoms out at its smallest subnormal
    q = triton_quantize_activation(x, act)
    codes, scales = q.codes, q.scales
    ref = ht.quantize_activation(x, scheme)
    assert torch.equal(scales, ref.scales)
    if act.global_scale:
        assert torch.equal(q.global_scale, ref.global_scale)
    # code for code: the quotient is formed in float64 as in the reference (in fp32, fp16 inputs often land
    # exactly on an e4m3 midpoint and break the tie the other way: 3 of 384 codes, 1.4 % of the GEMM output)
    assert torch.equal(codes, ref.codes)


@pytest.mark.interpret
@pytest.mark.parametrize("m,k,dtype", [(1, 8192, torch.bfloat16), (5, 4100, torch.float16), (70, 1024, torch.float32)])
def test_global_scale_kernel_is_the_reference_bit_for_bit(m, k, dtype, rng):
    """NV's per-tensor activation scale in one reduction launch equals formats.activation.global_act_scale, NaN / inf
    ignored, on strided rows, all-zero and empty inputs."""
    _global_scale_case(m, k, dtype, rng, "cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,dtype", [(1, 8192, torch.bfloat16), (4096, 8192, torch.bfloat16), (33, 4100, torch.float16)])
def test_global_scale_kernel_on_gpu(m, k, dtype, rng):
    _global_scale_case(m, k, dtype, rng, "cuda")


def _global_scale_case(m, k, dtype, rng, dev):
    from humming_triton.formats.activation import global_act_scale
    from humming_triton.kernels.dense import triton_global_scale
    spec = ht.QuantScheme.parse("w4a4-nvfp4").act
    x = (torch.randn(m, k + 8, generator=rng) * 3).to(dtype)[:, :k]  # strided rows
    if m > 2:
        x[1, 5], x[2, 7], x[0, 3] = float("nan"), float("inf"), -float("inf")
    for t in (x, torch.zeros(3, 64, dtype=dtype), torch.full((2, 32), float("nan"), dtype=dtype)):
        got, want = triton_global_scale(t.to(dev), spec), global_act_scale(t, spec)
        assert got.dtype == torch.float32 and got.shape == ()
        assert got.item() == want.item(), (got.item(), want.item())
    assert triton_global_scale(torch.empty(0, 64, device=dev), spec).item() == global_act_scale(
        torch.empty(0, 64), spec).item()


@pytest.mark.interpret
def test_activation_quantizer_breaks_near_ties_like_the_reference():
    g = torch.Generator().manual_seed(1)
    torch.randn(40, 384, generator=g), torch.randn(40, generator=g)
    x = torch.randn(1, 384, generator=g).half()  # x / s = 336.0000034 etc.: exact midpoints in fp32
    from humming_triton.kernels.dense import triton_quantize_activation
    for spec in ("e4m3fn/fp32:token", "int8/fp32:token"):
        codes = triton_quantize_activation(x, ht.ActQuant.parse(spec)).codes
        assert torch.equal(codes, ht.quantize_activation(x, ht.ActQuant.parse(spec)).codes), spec


@pytest.mark.interpret
def test_e2m1_quantizer_ties_and_signs():
    """Exact e2m1 midpoints round to the even code, saturation at 6, negatives rounding to zero keep -0: with
    an e8m0 scale of 2**-3 (block amax 0.75 -> 0.75 / 6 = 2**-3) every quotient below is exact."""
    from humming_triton.kernels.dense import triton_quantize_activation
    q = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.1, -0.0, 0.1, -5.0, 4.5, 2.25, 1.9])
    x = torch.cat([q, torch.zeros(16)]).reshape(1, 32) * 0.125
    spec = ht.ActQuant.parse("e2m1/e8m0:g32")
    got = triton_quantize_activation(x, spec)
    assert got.scales.tolist() == [[124]]  # 2**-3
    #          6  .25 .75 1.25 1.75 2.5 3.5  5  -.25 -.1 -0  .1  -5  4.5 2.25 1.9
    expect = [7, 0, 2, 2, 4, 4, 6, 6, 8, 8, 0, 0, 14, 6, 4, 4] + [0] * 16
    assert got.codes[0].tolist() == expect
    assert torch.equal(got.codes, ht.quantize_activation(x, spec).codes)


def _gemm_case(scheme, m, n, k, dtype, rng, device="cpu", config=None):
    from humming_triton.kernels.dense import triton_linear, triton_quantize_activation
    qw = ht.quantize_weight(torch.randn(n, k, generator=rng), scheme, bias=torch.randn(n, generator=rng)).to(device)
    x = torch.randn(m, k, generator=rng).to(dtype).to(device)
    out = poison_like(torch.empty(m, n, dtype=dtype, device=device))
    y = triton_linear(x, qw, config=config, out=out)
    act = qw.scheme.act
    q = triton_quantize_activation(x, act)
    x_hat = ht.dequantize_activation(QuantActivation(q.codes.cpu(), q.scales.cpu(), act,
                                                     None if q.global_scale is None else q.global_scale.cpu()))
    qc = qw.to("cpu")
    w_hat = ht.dequantize_weight(qc)
    ref = (x_hat.double() @ w_hat.double().T + qc.bias.double())
    # fp8 x fp8 products are exact in fp32 (int8 x int8 in int32): only accumulation and output rounding remain;
    # the large-M fp8 path (dequant_mm) rounds both dequantized operands to x's dtype for cuBLAS instead
    from humming_triton.kernels.dense import act_config
    cfg = config or act_config(m, n, k, qw.scheme)
    # e2m1 activations (W4A4) meet the scaled weight in a bf16 MMA: the weight is rounded to bf16 there
    mma = dtype if cfg.family == "dequant_mm" else torch.bfloat16 if str(act.dtype) == "e2m1" else torch.float32
    assert_linear_close(y.cpu(), ref, x_hat, w_hat, mma, f"{scheme} M={m} ({cfg.family})")
    # end to end against the reference's own quantization: the codes are identical, so only the output
    # rounding (and, on the dequant_mm route, operand rounding to x's dtype) is left
    full = ht.reference_linear(x.cpu(), qc, out_dtype=torch.float32)
    rel = ((y.cpu().double() - full.double()).norm() / full.double().norm()).item()
    assert rel < 4 * unit_roundoff(dtype), f"{scheme} M={m}: {rel:.3g} from the reference end to end"


@pytest.mark.interpret
@pytest.mark.parametrize("m", [1, 20])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_fp8_gemm_interpreted(scheme, m, rng):
    _gemm_case(scheme, m, 40, 384, torch.float16, rng)


@pytest.mark.interpret
def test_fp8_large_m_path_bf16(rng):
    """Above 16 rows the fp8 codes meet the weight in a bf16 MMA (64/128-row tiles, ACT_KIND 5); from M = 512
    both operands are dequantized for cuBLAS (dequant_mm).  bf16 activations, grouped activation scales."""
    _gemm_case("weight=e4m3fn,scale=fp32:channel,act=e4m3fn/fp32:g128", 40, 24, 384, torch.bfloat16, rng)
    _gemm_case("w8a8-fp8", 100, 24, 256, torch.float16, rng)
    _gemm_case("weight=e4m3fn,scale=fp32:channel,act=e4m3fn/fp32:g128", 520, 16, 256, torch.bfloat16, rng)


# (scheme, M, K, the integer-decode ACT_KIND): int4 / int8 weights on int8 codes (group weight scales: 7, the
# token scale after the loop; per-group activation scales: 7, per tile; channel x token scales: 9, int32 sums over
# all of K), K tails (K = 200: a partial last tile), int4 weights on e4m3 codes (8, a bf16 MMA)
INT_DECODE_CASES = [("w4a8-int8", 20, 384, 7), ("w8a8-int8", 70, 256, 9),
                    ("weight=int8,scale=fp32:channel,act=int8/fp32:g128", 20, 384, 7),
                    ("weight=int4,scale=fp32:channel,act=int8/fp32:token", 33, 200, 9),
                    ("weight=int8,scale=fp16:g64,act=int8/fp32:token", 5, 320, 7),
                    ("w4a8-fp8", 70, 256, 8), ("weight=int4,scale=fp32:channel,act=e4m3fn/fp32:token", 65, 200, 8)]


@pytest.mark.interpret
@pytest.mark.parametrize("scheme,m,k,kind", INT_DECODE_CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("decode", [True, False], ids=["int_decode", "fp32_decode"])
def test_integer_decode_tile_loops(scheme, m, k, kind, dtype, decode, monkeypatch, rng):
    """ACT_KIND 7 / 8 / 9 (dense.INT_DECODE_ACT, PACKED_E4M3_ACT): the weight decoded by integer / packed
    operations instead of through fp32 (flags off: ACT_KIND 2 / 5, the fp32 decode), against the reference on the
    kernel's own activation codes; the launcher must pick the kind."""
    from humming_triton.calls import Call
    from humming_triton.kernels import dense
    from humming_triton.kernels.format_args import format_constexprs
    monkeypatch.setattr(dense, "INT_DECODE_ACT", decode)
    monkeypatch.setattr(dense, "PACKED_E4M3_ACT", decode)
    cfg = configs.KernelConfig("act_tiled", 64, 32, 64, 1, 8, 4, 2)
    call = Call("quant_linear", ht.QuantScheme.parse(scheme), dtype, m, 24, k)
    fmt = format_constexprs(call.scheme, 24, k)
    want = kind if decode else {7: 2, 9: 2, 8: 5}[kind]
    assert dense.act_constexprs(fmt, call, dense.fitted(cfg, call), False)["ACT_KIND"] == want
    _gemm_case(scheme, m, 24, k, dtype, rng, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme,m,k,kind", INT_DECODE_CASES)
@pytest.mark.parametrize("cfg", [(64, 128, 128, 4, 3), (128, 256, 128, 8, 3), (128, 128, 64, 4, 4)], ids=str)
def test_integer_decode_tile_loops_on_gpu(scheme, m, k, kind, cfg, monkeypatch, rng):
    """The same on the H200 (wgmma) with the probe's tile shapes, N = 1000 (partial weight tiles), bf16."""
    from humming_triton.kernels import dense
    monkeypatch.setattr(dense, "INT_DECODE_ACT", True)
    monkeypatch.setattr(dense, "PACKED_E4M3_ACT", True)
    bm, bn, bk, warps, stages = cfg
    _gemm_case(scheme, 4 * m, 1000, 2 * k, torch.bfloat16, rng, device="cuda",
               config=configs.KernelConfig("act_tiled", bm, bn, bk, 1, 8, warps, stages))


@pytest.mark.interpret
@pytest.mark.parametrize("scheme,m,k,dtype", [("w4a4-nvfp4", 5, 416, torch.bfloat16),  # K tail: 416 = 3 * 128 + 32
                                              ("weight=int4,scale=fp16:g32,act=e2m1/e8m0:g32", 3, 288, torch.float16),
                                              ("w4a4-mxfp4", 520, 96, torch.float16)])  # M >= 512: dequant_mm
def test_w4a4_odd_shapes(scheme, m, k, dtype, rng):
    _gemm_case(scheme, m, 24, k, dtype, rng)


@pytest.mark.interpret
@pytest.mark.parametrize("scheme", ["weight=int4,scale=fp16:g16,act=e2m1/e8m0:g32", "w4a8-fp8"])
def test_activation_group_must_divide_k(scheme):
    s = ht.QuantScheme.parse(scheme.replace("w4a8-fp8", "weight=int4,scale=fp32:channel,act=e4m3fn/fp32:g32"))
    # refused when quantizing (issue 15: the same rule, not a late refusal) ...
    with pytest.raises(ValueError, match="activation group size 32 does not divide K=48"):
        ht.quantize_weight(torch.randn(8, 48), s)
    # ... and by every backend for a QuantWeight made otherwise (a checkpoint)
    w_only = ht.quantize_weight(torch.randn(8, 48), dataclasses.replace(s, act=None))
    qw = dataclasses.replace(w_only, scheme=s, cache={})
    for backend in ("triton", "reference"):
        with pytest.raises(ValueError, match="activation group size 32 does not divide K=48"):
            ht.quant_linear(torch.randn(2, 48), qw, backend=backend)


def test_fp8_path_under_auto_and_names_what_it_cannot_do(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    qw = ht.quantize_weight(torch.randn(16, 128), "w8a8-fp8")
    ht.quant_linear(torch.randn(2, 128), qw)
    assert ht.last_backend() == "triton"  # auto runs the kernels (here interpreted; verified on the H200)
    for scheme, msg in [("weight=e2m1,scale=e8m0:g32,act=e2m1/e8m0:token", "e2m1 with e8m0 block scales"),
                        ("weight=e2m1,scale=e8m0:g32,act=e2m1/e4m3fn:g16", "e2m1 with e8m0 block scales"),
                        # a static MX scale is the calibrated input_scale, which the fused quantizer does not take
                        ("weight=e2m1,scale=e8m0:g32,act=e2m1/e8m0:g32:static", "dynamic e2m1"),
                        ("weight=int8,scale=fp32:channel,act=e4m3fn/fp32:token", "not exactly representable"),
                        ("weight=e2m1,scale=e8m0:g32,act=int8/fp32:token", "not exactly representable")]:
        q = ht.quantize_weight(torch.randn(16, 128), scheme)
        with pytest.raises(RuntimeError, match=msg):
            ht.quant_linear(torch.randn(2, 128), q, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (33, 1000, 2048), (512, 768, 1024)], ids=str)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_fp8_gemm_on_gpu(scheme, shape, dtype, rng):
    _gemm_case(scheme, *shape, dtype, rng, device="cuda")


# how the fp32 quantizer decides a rounding: the float64 midpoint comparison (default), split fp32, or the
# hardware e4m3 conversion of the near-exact quotient (exact comparison only in tiles near a midpoint)
ROUNDINGS = ["f64", "f32", "cvt", "cvt2"]


def _set_rounding(dense, rounding, monkeypatch):
    monkeypatch.setattr(dense, "F32_COMPARE", rounding == "f32")
    monkeypatch.setattr(dense, "CVT_E4M3", {"cvt": True, "cvt2": 2}.get(rounding, False))


class _PosedCuda:
    """Just what ``dense.cvt_e4m3`` reads of an activation: where it lives and its shape."""
    is_cuda, device = True, "cuda"

    def __init__(self, m):
        self.shape = (m, 8192)


@pytest.mark.parametrize("sm", [(8, 9), (9, 0), (10, 0)])
def test_cvt_e4m3_default_where_timed(sm, monkeypatch):
    """CVT_E4M3 unset: the hardware conversion only where the H200 timed it faster -- SM 9.0, the MXFP4 e4m3 rows
    at every M, per-token codes from CVT_E4M3_MIN_ROWS rows on, never per-group scales; forced to its value
    everywhere by the flag; never for CPU tensors (the interpreter keeps the bit-operation path unless a test
    asks)."""
    from humming_triton import capability
    from humming_triton.kernels import dense
    monkeypatch.setattr(dense, "CVT_E4M3", None)
    monkeypatch.setattr(capability, "device_facts", lambda device=None: capability.facts_for_sm(sm))
    least = dense.CVT_E4M3_MIN_ROWS
    on = sm == (9, 0)
    assert [dense.cvt_e4m3(_PosedCuda(m)) for m in (1, 256, least - 1, least, 8 * least)] == [False] * 3 + [on] * 2
    assert [dense.cvt_e4m3(_PosedCuda(m), "mx_rows") for m in (1, 16, least)] == [on] * 3
    assert not any(dense.cvt_e4m3(_PosedCuda(m), "group") for m in (1, least, 8 * least))  # per-group: untimed
    assert not dense.cvt_e4m3(torch.zeros(least, 8)) and not dense.cvt_e4m3(torch.zeros(1, 8), "mx_rows")
    for forced in (True, False, 2):
        monkeypatch.setattr(dense, "CVT_E4M3", forced)
        assert all(dense.cvt_e4m3(x, q) is forced for x in (_PosedCuda(1), torch.zeros(1, 8))
                   for q in ("token", "group", "mx_rows"))


@pytest.mark.parametrize("act,grid", [("e4m3fn/fp32:token", "e4m3"), ("int8/fp32:token", "int"),
                                      ("e4m3fn/fp32:g128", "e4m3")])
@pytest.mark.parametrize("e", [-3, 0, 5])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_fp32_quantizer_ties_and_their_neighbours(act, grid, e, rounding, monkeypatch):
    """Quotients exactly on a rounding midpoint (the scale a power of two) and one fp32 ulp either side: the
    division-free fp32 quantizer must round each as the reference does (ties to even), with the midpoint
    comparison in float64 (the default) or in split fp32 (``dense.F32_COMPARE``), or by the hardware conversion of
    the near-exact quotient with the exact comparison near midpoints (``dense.CVT_E4M3``)."""
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import triton_quantize_activation
    _set_rounding(dense, rounding, monkeypatch)
    spec = ht.QuantScheme.parse(f"weight=int8,scale=fp32:channel,act={act}").act
    if grid == "e4m3":
        vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        vals = torch.unique(vals[torch.isfinite(vals)].abs())
        mids, qmax = (vals[1:] + vals[:-1]) / 2, 448.0
    else:
        mids, qmax = torch.arange(0, 126) + 0.5, 127.0
    s = 2.0 ** e
    vals = torch.cat([mids, -mids, torch.nextafter(mids, torch.tensor(1e9)), torch.nextafter(mids, torch.tensor(-1e9))])
    x = torch.zeros(3, 1024)
    x[:, :vals.numel()] = vals[:1024] * s
    x[:, 127::128] = qmax * s  # every group's amax: the scale is exactly 2**e
    q = triton_quantize_activation(x, spec)
    r = ht.quantize_activation(x, spec)
    assert bool((r.scales == s).all())
    assert torch.equal(q.scales, r.scales) and torch.equal(q.codes, r.codes)


@pytest.mark.parametrize("act", ["e4m3fn/fp32:g128", "int8/fp32:token", "e4m3fn/fp32:g32"])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_fp32_quantizer_scale_that_rounds_to_zero(act, rounding, monkeypatch, rng):
    """A group whose amax / qmax rounds to 0 in fp32 (amax a tiny subnormal) keeps fp32's smallest normal as its
    scale, as the reference's round_scale clamps it (found by a random seed: kernel 0 against 1.18e-38)."""
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import triton_quantize_activation
    _set_rounding(dense, rounding, monkeypatch)
    spec = ht.QuantScheme.parse(f"weight=int8,scale=fp32:channel,act={act}").act
    tiny = 1.401298464324817e-45  # fp32's smallest subnormal: 2 * tiny / 448 still rounds to 0
    x = torch.randn(2, 256, generator=rng)  # row 1: a normal row beside it
    x[0] = torch.randint(-2, 3, (256,), generator=rng).float() * tiny  # row 0: random codes of +-tiny, +-2 tiny
    x[0, 5] = tiny
    q, r = triton_quantize_activation(x, spec), ht.quantize_activation(x, spec)
    assert float(r.scales.flatten()[0]) == torch.finfo(torch.float32).tiny
    assert torch.equal(q.scales, r.scales) and torch.equal(q.codes, r.codes)


@pytest.mark.parametrize("act", ["e4m3fn/fp32:g128", "int8/fp32:token", "e4m3fn/fp32:token"])
@pytest.mark.parametrize("magnitude", [1e-44, 1e-40, 1e-37, 1e-20, 1e30])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_fp32_quantizer_tiny_and_huge_groups(act, magnitude, rounding, monkeypatch, rng):
    """Groups whose scale is an fp32 subnormal (1 / s would overflow, products underflow) or huge: code for code
    the reference's."""
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import triton_quantize_activation
    _set_rounding(dense, rounding, monkeypatch)
    spec = ht.QuantScheme.parse(f"weight=int8,scale=fp32:channel,act={act}").act
    x = torch.randn(4, 512, generator=rng) * torch.exp2(torch.randint(-20, 20, (4, 512), generator=rng) * 0.3)
    x = x * magnitude
    q, r = triton_quantize_activation(x, spec), ht.quantize_activation(x, spec)
    assert torch.equal(q.scales, r.scales) and torch.equal(q.codes, r.codes)


def _block_act_case(scheme, m, k, dtype, rng, dev):
    """Block-scaled activations with the special rows: a NaN, an Inf, an all-zero row, a block of tiny values."""
    x = (torch.randn(m, k + 16, generator=rng) * 3).to(dtype)[:, :k]  # strided rows
    x[min(1, m - 1), 5] = float("nan")
    x[min(2, m - 1), k - 1] = float("inf")
    x[min(3, m - 1)] = 0
    x[0, :16] = 1e-4
    return x.to(dev), ht.QuantScheme.parse(scheme).act


@pytest.mark.interpret
@pytest.mark.parametrize("scheme", ["w4a4-nvfp4", "w4a4-mxfp4", "w8a8-mxfp8"])
@pytest.mark.parametrize("m,k,dtype", [(7, 640, torch.bfloat16), (5, 96, torch.float16), (4, 2080, torch.float32)])
def test_dequantized_activation_is_the_torch_composition(scheme, m, k, dtype, rng):
    """One quantizer launch writes ``dequantize_activation(quantize_activation(x))`` in x's dtype bit for bit
    (what ``dequant_mm`` multiplies), NaN where the reference has NaN."""
    _dequantized_activation_case(scheme, m, k, dtype, rng, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["w4a4-nvfp4", "w4a4-mxfp4"])
@pytest.mark.parametrize("m,k", [(1, 8192), (300, 4096)])
def test_dequantized_activation_is_the_torch_composition_on_gpu(scheme, m, k, rng):
    _dequantized_activation_case(scheme, m, k, torch.bfloat16, rng, "cuda")


def _dequantized_activation_case(scheme, m, k, dtype, rng, dev):
    from humming_triton.formats.activation import dequantize_activation, quantize_activation
    from humming_triton.kernels.dense import block_act_values, triton_dequantize_activation
    x, spec = _block_act_case(scheme, m, k, dtype, rng, dev)
    want64 = dequantize_activation(quantize_activation(x.cpu(), scheme)).double()
    want = want64.to(dtype)
    got = triton_dequantize_activation(x, spec, None, dtype).cpu()
    assert got.dtype == dtype and torch.equal(got.isnan(), want.isnan()) and want.isnan().any() == (m > 3)
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    # the decode kernel's form: code x block scale in bf16 (exact), the global scale per row
    vals, rows = block_act_values(x, spec, torch.bfloat16)
    full = vals.cpu().double() * rows.cpu().double()[:, None]
    assert vals.dtype == torch.bfloat16 and rows.shape == (m,)
    assert torch.equal(full.isnan(), want64.isnan())
    torch.testing.assert_close(full.nan_to_num(), want64.nan_to_num(), rtol=2e-7, atol=0)  # fp32 global rounding


@pytest.mark.interpret
@pytest.mark.parametrize("scheme", ["w8a8-fp8", "w8a8-int8"])
@pytest.mark.parametrize("m,k,programs", [(7, 640, 3), (5, 96, 1), (4, 2080, 4), (3, 33, 8)])
@pytest.mark.parametrize("rounding", ["f64", "cvt"])
def test_persistent_token_quantizer_matches_reference(scheme, m, k, programs, rounding, monkeypatch, rng):
    """The persistent per-token quantizer (each program walks rows p, p + P, ..., the next row loaded first; opt-in
    ``TOKEN_ROWS_PERSISTENT``) writes the reference's codes and scales: fewer programs than rows, more programs than
    rows, odd K, a NaN row, an inf row, an all-zero row, 16-bit code values."""
    from humming_triton.kernels import dense
    _set_rounding(dense, rounding, monkeypatch)
    x, spec = _block_act_case(scheme, m, k, torch.bfloat16, rng, "cpu")
    ref = ht.quantize_activation(x, scheme)
    block = triton_next_pow2(k)
    for values in (False, True):
        codes = torch.empty(m, k, dtype=torch.bfloat16 if values else torch.uint8)
        scales = torch.empty(m, 1, dtype=torch.float32)
        dense._launch_token_rows(x, spec, codes, scales, block, programs=programs)
        assert torch.equal(scales.isnan(), ref.scales.isnan())
        assert torch.equal(scales.nan_to_num(), ref.scales.nan_to_num())
        want = ref.codes if not values else ref.values().to(torch.bfloat16)
        assert torch.equal(codes, want), (codes != want).nonzero()[:5].tolist()


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["w8a8-fp8", "w8a8-int8"])
@pytest.mark.parametrize("m,k", [(1, 8192), (4096, 8192), (333, 2048), (70, 4100)])
def test_persistent_token_quantizer_on_gpu(scheme, m, k, monkeypatch, rng):
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import triton_quantize_activation
    monkeypatch.setattr(dense, "TOKEN_ROWS_PERSISTENT", True)
    x, spec = _block_act_case(scheme, m, k, torch.bfloat16, rng, "cuda")
    q = triton_quantize_activation(x, spec)
    ref = ht.quantize_activation(x.cpu(), scheme)
    assert torch.equal(q.codes.cpu(), ref.codes)
    assert torch.equal(q.scales.cpu().nan_to_num(), ref.scales.nan_to_num())


def _cvt_case(m, k, dtype, rng, dev):
    """Random rows (the hardware-conversion path's common case: no element near a midpoint) beside rows that hold
    exact midpoints and their fp32 neighbours (its exact fallback), -0.0, a NaN row, an all-zero row.  The ties
    row's amax is 448 * 7, so its scale is 7 and the rounded quotient 7 mid / 7 can land on a midpoint the exact
    one is not on (with a power-of-two scale the quotient is exact and no fallback is needed); 7 mid is exact in
    bf16 (at most 8 significant bits)."""
    x = torch.randn(m, k, generator=rng) * torch.exp2(torch.randint(-8, 8, (m, 1), generator=rng).float())
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    vals = torch.unique(vals[torch.isfinite(vals)].abs())
    mids = (vals[1:] + vals[:-1]) / 2
    ties = torch.cat([mids, torch.nextafter(mids, torch.tensor(1e9)), -mids])[:k - 1] * 7
    x[0, :ties.numel()] = ties
    x[0, -1] = 448.0 * 7  # amax: the scale is exactly 7
    x[m - 1, k // 2] = -0.0  # the reference writes +0 for -0.0 (the sign bit only for x < 0)
    if m > 2:
        x[1, 3] = float("nan")
        x[2] = 0
    return x.to(dtype).to(dev)


def _near_midpoint_rows(rng, scales: int = 6) -> torch.Tensor:
    """Every e4m3 midpoint and its fp32 neighbours (+-1..3 ulps), both signs, times a scale with a random 24-bit
    mantissa, one row per scale (its last element the amax that makes the quantizer derive exactly that scale):
    the rounded quotient x * (1 / s) lands within a few ulps of a midpoint, on either side of it, where the exact
    quotient may lie on the other."""
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    vals = torch.unique(vals[torch.isfinite(vals)].abs())
    mids = (vals[1:] + vals[:-1]) / 2
    rows = []
    for _ in range(scales):
        exponent = int(torch.randint(-30, 30, (), generator=rng))
        amax = torch.tensor(448.0) * (1 + torch.rand((), generator=rng)) * 2.0 ** exponent
        x = mids * (amax / 448.0)  # the scale the quantizer derives (IEEE division in fp32, as the reference)
        near, up, down = [x, -x], x, x
        for _ in range(3):  # 1, 2, 3 fp32 ulps above and below
            up, down = torch.nextafter(up, up * 2), torch.nextafter(down, down / 2)
            near += [up, down]
        rows.append(torch.cat(near + [amax.reshape(1)]))
    return torch.stack(rows)


def _near_midpoint_case(mode, dev, monkeypatch, rng):
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import triton_quantize_activation
    _set_rounding(dense, mode, monkeypatch)
    spec = ht.QuantScheme.parse("weight=int8,scale=fp32:channel,act=e4m3fn/fp32:token").act
    x = _near_midpoint_rows(rng)
    ref = ht.quantize_activation(x, spec)
    q = triton_quantize_activation(x.to(dev), spec)
    assert torch.equal(q.scales.cpu(), ref.scales)
    assert torch.equal(q.codes.cpu(), ref.codes), (q.codes.cpu() != ref.codes).nonzero()[:5].tolist()


@pytest.mark.interpret
@pytest.mark.parametrize("mode", ["f64", "f32", "cvt", "cvt2"])
def test_quantizer_near_midpoints_at_random_scales(mode, monkeypatch, rng):
    """The case the exact comparison (``_fp32_codes``), the tile fallback (CVT_E4M3 1) and the per-element fix
    (2: split fp32, mid * s_hi exact, |x| - mid * s_hi exact by Sterbenz) exist for: code for code the
    reference's (float64 division) at random scales (``_near_midpoint_rows``)."""
    _near_midpoint_case(mode, "cpu", monkeypatch, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["f64", "f32", "cvt", "cvt2"])
def test_quantizer_near_midpoints_at_random_scales_on_gpu(mode, monkeypatch, rng):
    _near_midpoint_case(mode, "cuda", monkeypatch, rng)


@pytest.mark.interpret
@pytest.mark.parametrize("act", ["e4m3fn/fp32:token", "e4m3fn/fp32:g128"])
@pytest.mark.parametrize("m,k,dtype", [(9, 640, torch.bfloat16), (5, 1100, torch.float16), (6, 384, torch.float32)])
@pytest.mark.parametrize("mode", ["cvt", "cvt2"])
def test_cvt_e4m3_quantizer_matches_reference(act, m, k, dtype, mode, monkeypatch, rng):
    """``dense.CVT_E4M3``: the hardware conversion of the near-exact quotient, the exact comparison only where a
    tile holds an element near a midpoint -- code for code the reference's, through the library's launch and the
    persistent one (per token); mode cvt2 (``CVT_E4M3 = 2``): near midpoints fixed element by element."""
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import triton_quantize_activation
    _set_rounding(dense, mode, monkeypatch)
    spec = ht.QuantScheme.parse(f"weight=int8,scale=fp32:channel,act={act}").act
    k = -(-k // (spec.group_k or 1)) * (spec.group_k or 1)  # odd K per token; whole groups of 128
    x = _cvt_case(m, k, dtype, rng, "cpu")
    ref = ht.quantize_activation(x, spec)
    q = triton_quantize_activation(x, spec)
    assert torch.equal(q.scales.isnan(), ref.scales.isnan())
    assert torch.equal(q.scales.nan_to_num(), ref.scales.nan_to_num())
    assert torch.equal(q.codes, ref.codes), (q.codes != ref.codes).nonzero()[:5].tolist()
    if spec.group_k is None:
        codes, scales = torch.empty(m, k, dtype=torch.uint8), torch.empty(m, 1)
        dense._launch_token_rows(x, spec, codes, scales, triton_next_pow2(k), programs=4)
        assert torch.equal(codes, ref.codes)


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["e4m3fn/fp32:token", "e4m3fn/fp32:g128"])
@pytest.mark.parametrize("m,k", [(1, 8192), (4096, 8192), (32768, 2048), (333, 768), (70, 4100)])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("mode", ["cvt", "cvt2"])
def test_cvt_e4m3_quantizer_on_gpu(act, m, k, persistent, mode, monkeypatch, rng):
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import triton_quantize_activation
    _set_rounding(dense, mode, monkeypatch)
    monkeypatch.setattr(dense, "TOKEN_ROWS_PERSISTENT", persistent)
    spec = ht.QuantScheme.parse(f"weight=int8,scale=fp32:channel,act={act}").act
    k = -(-k // (spec.group_k or 1)) * (spec.group_k or 1)
    x = _cvt_case(m, k, torch.bfloat16, rng, "cuda")
    q = triton_quantize_activation(x, spec)
    ref = ht.quantize_activation(x.cpu(), spec)
    assert torch.equal(q.codes.cpu(), ref.codes)
    assert torch.equal(q.scales.cpu().nan_to_num(), ref.scales.nan_to_num())
