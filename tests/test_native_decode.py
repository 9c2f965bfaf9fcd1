"""The native CUDA decode GEMM (``cutlass_ext``, family ``mma_decode``, backend ``cuda``).

CPU: the repacked layout replayed register by register through PTX's mma fragment layout (``emulate``) equals the
reference on odd shapes for every format the kernel takes; unsupported formats get a reason, never a wrong answer.
GPU (``-m gpu``): the kernel itself against the reference, every candidate config, fp16 / bf16, M = 1..16,
bias, fp32 out, poisoned outputs.
"""
import dataclasses

import pytest
import torch

import humming_triton as ht
from cutlass_ext import decode_mma as dm
from humming_triton.testing import assert_linear_close, poison_like

FORMATS = ["w4a16", "w4a16-asym", "w8a16", "w8a16-asym", "weight=int4,scale=bf16:g64",
           "weight=int8,scale=fp16:g128,zero=none", "weight=uint4,scale=fp32:g256,zero=int", "mxfp4", "nvfp4",
           "w8a16-fp8", "weight=e4m3fn,scale=fp16:g128", "w8a16-fp8-block"]
FP4 = ("mxfp4", "nvfp4")  # bf16 activations only
E4M3 = ("w8a16-fp8", "weight=e4m3fn,scale=fp16:g128", "w8a16-fp8-block")  # fp16 activations only
SHAPES = [(37, 512), (100, 1280), (16, 256)]  # odd N (a partial 16-row tile), K a multiple of every group
CHANNEL_ODD_K = [("w8a16", (50, 208)), ("weight=int4,scale=fp16:channel", (24, 400)),  # K % 64 != 0
                 ("nvfp4", (24, 208)), ("mxfp4", (40, 224))]


def _weight(scheme, n, k, rng):
    w = torch.randn(n, k, generator=rng) * 0.05
    return ht.quantize_weight(w, scheme, bias=torch.randn(n, generator=rng))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_emulated_kernel_matches_reference(fmt, shape, rng):
    qw = _weight(fmt, *shape, rng)
    p = dm.repack(qw)
    for m in (1, 7, 16):
        x = torch.randn(m, shape[1], generator=rng)
        ref = ht.reference_linear(x, qw, out_dtype=torch.float32).double() - qw.bias.double()
        got = dm.emulate(x, p)
        assert_linear_close(got, ref, x, ht.dequantize_weight(qw), torch.float32, f"{fmt} {shape} M={m}")


def _spread_rows(scheme, rng, n=48, k=512):
    """A weight whose rows sit 2^-100 .. 2^100 apart, one row's blocks spanning 2^40 as well: the e2m1 decode
    folds a per-row exponent into the block scales, and no row may lose its bits to another's range.  NVFP4's
    per-tensor scale and e4m3 block scales hold 2^±6 of spread (the format's own limit)."""
    e = 100 if scheme == "mxfp4" else 3
    w = torch.randn(n, k, generator=rng) * 0.05
    w *= torch.exp2(torch.linspace(-e, e, n)).view(n, 1)
    w[3] *= torch.exp2(torch.linspace(-0.4 * e, 0.4 * e, k))
    return ht.quantize_weight(w, scheme)


def _assert_rows_close(y, x, qw, what):
    """Every row against the float64 reference relative to its own sum of |x w| (a norm over the whole output
    would not see a row 2^-100 under the others)."""
    w_hat = ht.dequantize_weight(qw).double()
    ref = x.double() @ w_hat.T
    scale = x.double().abs() @ w_hat.abs().T
    assert scale.amin() > 0, "a row of the test weight quantized to zeros"
    rel = ((y.double() - ref).abs() / scale).amax(0)
    assert torch.isfinite(y).all() and (rel < 2e-5).all(), f"{what}: worst rows {rel.topk(3)}"


@pytest.mark.parametrize("fmt", FP4)
def test_emulated_fp4_keeps_every_row(fmt, rng):
    qw = _spread_rows(fmt, rng)
    x = torch.randn(3, qw.K, generator=rng).to(torch.bfloat16).float()
    _assert_rows_close(dm.emulate(x, dm.repack(qw)), x, qw, fmt)


@pytest.mark.parametrize("fmt,shape", CHANNEL_ODD_K)
def test_emulated_kernel_pads_k(fmt, shape, rng):
    qw = _weight(fmt, *shape, rng)
    x = torch.randn(3, shape[1], generator=rng)
    ref = ht.reference_linear(x, qw, out_dtype=torch.float32).double() - qw.bias.double()
    assert_linear_close(dm.emulate(x, dm.repack(qw)), ref, x, ht.dequantize_weight(qw), torch.float32, fmt)


@pytest.mark.parametrize("fmt,why", [
    ("weight=e2m1,scale=fp16:g32", "MXFP4 e8m0:g32 and NVFP4"), ("w1a16", "weight type uint1"),
    ("weight=int4,scale=fp16:g32", "scale group 32"),     ("weight=e5m2,scale=fp32:channel", "weight type e5m2"),
])
def test_unsupported_formats_have_a_reason(fmt, why):
    scheme = ht.QuantScheme.parse(fmt)
    assert why in dm.weight_reason(scheme, 256, 1024)
    qw = ht.quantize_weight(torch.randn(32, 256), scheme)
    with pytest.raises(ValueError, match="cannot take this weight"):
        dm.repack(qw)


def test_quantized_activations_need_their_codes():
    """A W8A8 / W4A8 scheme is refused as a 16-bit-activation call; its weight half repacks (mma_decode_act feeds
    the kernel the activation codes), unless the weight half itself is out of reach."""
    scheme = ht.QuantScheme.parse("w4a8-fp8")
    assert "quantizes its activations" in dm.weight_reason(scheme, 256, 1024)
    assert dm.weight_reason(scheme, 256, 1024, act_codes=True) is None
    assert dm.repack(ht.quantize_weight(torch.randn(32, 256), scheme)).bits == 4
    mx = ht.QuantScheme.parse("w8a8-mxfp8")
    assert "e8m0 scales" in dm.weight_reason(mx, 256, 1024, act_codes=True)
    with pytest.raises(ValueError, match="cannot take this weight"):
        dm.repack(ht.quantize_weight(torch.randn(32, 256), mx))


def test_fp4_takes_bf16_activations_only():
    scheme = ht.QuantScheme.parse("mxfp4")
    assert dm.weight_reason(scheme, 256, 1024, torch.bfloat16) is None
    assert "bf16 only" in dm.weight_reason(scheme, 256, 1024, torch.float16)


def test_e4m3_takes_fp16_activations_only():
    scheme = ht.QuantScheme.parse("w8a16-fp8")
    assert dm.weight_reason(scheme, 256, 1024, torch.float16) is None
    assert "fp16 only" in dm.weight_reason(scheme, 256, 1024, torch.bfloat16)
    # the conversion is an sm_89 instruction: the family asks for the fp8 MMA generation
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    call = Call("quant_linear", scheme, torch.float16, 4, 256, 1024)
    assert families.get("mma_decode").mma(call) == "fp8"
    from dataclasses import replace
    from humming_triton.backends._families import family_reason
    from humming_triton.capability import facts_for_sm
    assert "8.9" in family_reason(families.get("mma_decode"), replace(call, facts=facts_for_sm((8, 6))))
    # a 2-D block partial in K has no per-row group of its own: refused, not mis-repacked
    assert "partial last block" in dm.weight_reason(ht.QuantScheme.parse("w8a16-fp8-block"), 256, 1000,
                                                    torch.float16)
    # a quantized-activation scheme's weight half, for the kernel fed with activation codes (mma_decode_act)
    assert dm.weight_reason(ht.QuantScheme.parse("w8a8-fp8"), 256, 1024, torch.float16, act_codes=True) is None


def test_family_is_registered_for_the_cuda_backend():
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    fam = families.get("mma_decode")
    assert fam.backend == "cuda"
    call = Call("quant_linear", ht.QuantScheme.parse("w4a16"), torch.bfloat16, 4, 8192, 8192)
    assert fam.reason(call) is None and fam.mma(call) == "bf16"
    cands = fam.candidates(call)
    assert cands and all(c.num_warps == c.split_k * c.block_n // 16 and c.num_warps * 32 <= 512 for c in cands)
    assert "M=17" in fam.reason(Call("quant_linear", call.scheme, torch.bfloat16, 17, 8192, 8192))
    assert "float32" in fam.reason(Call("quant_linear", call.scheme, torch.float32, 4, 8192, 8192))


def test_decode_call_matches_the_c_struct(tmp_path):
    """native.DecodeCall (ctypes) against decode_mma.cu's HtDecodeCall, compiled here: every field's offset and
    the size -- a launch reads its arguments from that struct."""
    import ctypes
    import re
    import shutil
    import subprocess
    from pathlib import Path
    from cutlass_ext.native import DecodeCall
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed to lay out the launch struct"
    src = (Path(dm.__file__).parent / "csrc" / "decode_mma.cu").read_text()
    struct = re.search(r"struct HtDecodeCall \{.*?\n\};", src, re.S).group(0)
    names = [f for f, _ in DecodeCall._fields_]
    body = "".join(f'printf("%zu ", offsetof(HtDecodeCall, {f}));' for f in names)
    (tmp_path / "s.cpp").write_text("#include <cstddef>\n#include <cstdio>\n" + struct +
                                    f"\nint main() {{ {body} printf(\"%zu\", sizeof(HtDecodeCall)); }}\n")
    subprocess.run([cxx, "-o", str(tmp_path / "s"), str(tmp_path / "s.cpp")], check=True, timeout=120)
    got = list(map(int, subprocess.run([str(tmp_path / "s")], capture_output=True, text=True).stdout.split()))
    assert got == [getattr(DecodeCall, f).offset for f in names] + [ctypes.sizeof(DecodeCall)]
    from cutlass_ext import native
    if native.unavailable() is None:  # built here: the entry reads the struct (bad calls are refused before CUDA)
        call = DecodeCall(M=1, kw=4, tw=1, experts=1, bits=4)
        for bad in (dict(M=0), dict(kw=0), dict(bits=40, dtype=0), dict(out_dtype=3)):
            c = DecodeCall.from_buffer_copy(call)
            for k, v in bad.items():
                setattr(c, k, v)
            assert native.library().ht_decode_mma(ctypes.byref(c)) == 1, bad  # cudaErrorInvalidValue


def test_backend_says_why_without_the_library(monkeypatch, tmp_path):
    from cutlass_ext import native
    from humming_triton import backends
    from humming_triton.calls import Call
    monkeypatch.setenv("HT_NATIVE_LIB", str(tmp_path / "missing.so"))
    native._load.cache_clear()
    try:
        call = Call("quant_linear", ht.QuantScheme.parse("w4a16"), torch.bfloat16, 4, 256, 256)
        assert "python3 -m cutlass_ext.build" in backends.get("cuda").reason(call)
        with pytest.raises(RuntimeError, match="not built"):
            native.library()
    finally:
        native._load.cache_clear()


def test_build_command_names_every_arch_and_ptx():
    from cutlass_ext.build import command
    from pathlib import Path
    cmd = command(["80", "90"], Path("/tmp/x.so"))
    assert "-gencode=arch=compute_80,code=sm_80" in cmd and "-gencode=arch=compute_90,code=compute_90" in cmd
    assert any(s.endswith("decode_mma.cu") for s in cmd)
    assert not any(s.startswith("-D") for s in cmd)
    # an experiment's macros reach the compile and its cache key (another object than the plain build's)
    from cutlass_ext.build import cached_object
    exp = command(["80", "90"], Path("/tmp/x.so"), defines=("HT_GROUPED_NT1_REGS=80",))
    assert "-DHT_GROUPED_NT1_REGS=80" in exp
    assert cached_object(exp, Path("/tmp")) != cached_object(cmd, Path("/tmp"))


# ---- the kernel on the GPU ------------------------------------------------------------------------------------

GPU_CASES = [(fmt, shape, dtype) for fmt, shape in [(f, s) for f in FORMATS for s in SHAPES[:2]] + CHANNEL_ODD_K
             for dtype in (torch.float16, torch.bfloat16)
             if not (fmt in FP4 and dtype == torch.float16) and not (fmt in E4M3 and dtype == torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FP4)
def test_fp4_kernel_keeps_every_row(fmt, rng):
    from cutlass_ext import native
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    if native.unavailable():
        pytest.fail(native.unavailable())
    fam = families.get("mma_decode")
    qw = _spread_rows(fmt, rng)
    qw_gpu = qw.to("cuda")  # one weight (and one repack) for every launch below
    for m in (1, 16):
        x = torch.randn(m, qw.K, generator=rng).to(torch.bfloat16)
        for cfg in fam.candidates(Call("quant_linear", qw.scheme, torch.bfloat16, m, qw.N, qw.K))[:3]:
            out = poison_like(torch.empty(m, qw.N, dtype=torch.float32, device="cuda"))
            y = fam.run(x.cuda(), x.cuda(), qw_gpu, None, torch.float32, cfg, out)
            _assert_rows_close(y.cpu(), x.float(), qw, f"{fmt} M={m} {cfg.describe()}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,shape,dtype", GPU_CASES)
def test_kernel_matches_reference(fmt, shape, dtype, rng):
    from cutlass_ext import native
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    if native.unavailable():
        pytest.fail(native.unavailable())  # asked for GPU tests: a missing build is a failure, not a skip
    fam = families.get("mma_decode")
    n, k = shape
    qw = _weight(fmt, n, k, rng).to("cuda")
    w_hat = ht.dequantize_weight(qw.to("cpu"))
    for m in (1, 2, 5, 8, 9, 16):
        x = torch.randn(m, k, generator=rng).to(dtype)
        ref = ht.reference_linear(x, qw.to("cpu"), out_dtype=torch.float32).double()
        call = Call("quant_linear", qw.scheme, dtype, m, n, k)
        assert fam.reason(call) is None
        for cfg in fam.candidates(call):
            out = poison_like(torch.empty(m, n, dtype=dtype, device="cuda"))
            y = fam.run(x.cuda(), x.cuda(), qw, qw.bias, dtype, cfg, out)
            assert y.data_ptr() == out.data_ptr()
            assert_linear_close(y.cpu(), ref, x.float(), w_hat, dtype, f"{fmt} {shape} {dtype} M={m} {cfg.describe()}")
        # fp32 output and a bias of the activation type
        out = poison_like(torch.empty(m, n, dtype=torch.float32, device="cuda"))
        y = fam.run(x.cuda(), x.cuda(), qw, qw.bias.to(dtype).cuda(), torch.float32, fam.candidates(call)[0], out)
        ref16 = ref - qw.bias.double().cpu() + qw.bias.to(dtype).double().cpu()
        assert_linear_close(y.cpu(), ref16, x.float(), w_hat, dtype, f"{fmt} {shape} fp32 out M={m}")


@pytest.mark.gpu
def test_backend_cuda_through_the_op_and_graph_replay(rng):
    from cutlass_ext import native
    if native.unavailable():
        pytest.fail(native.unavailable())
    qw = _weight("w4a16", 4096, 2048, rng).to("cuda")
    x = torch.randn(3, 2048, generator=rng).to(torch.bfloat16).cuda()
    y = ht.quant_linear(x, qw, backend="cuda")
    ref = ht.reference_linear(x.cpu(), qw.to("cpu"), out_dtype=torch.float32).double()
    assert_linear_close(y.cpu(), ref, x.cpu().float(), ht.dequantize_weight(qw.to("cpu")), torch.bfloat16, "op")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = ht.quant_linear(x, qw, backend="cuda")
    x.copy_(torch.randn(3, 2048, generator=rng).to(torch.bfloat16))
    g.replay()
    torch.cuda.synchronize()
    ref = ht.reference_linear(x.cpu(), qw.to("cpu"), out_dtype=torch.float32).double()
    assert_linear_close(yg.cpu(), ref, x.cpu().float(), ht.dequantize_weight(qw.to("cpu")), torch.bfloat16, "graph")


# ---- MoE experts (mma_decode_grouped) -------------------------------------------------------------------------

def _experts(scheme, e, n, k, rng):
    w = torch.randn(e, n, k, generator=rng) * 0.05
    return ht.quantize_weight(w, scheme, bias=torch.randn(e, n, generator=rng))


def _routing(counts, k, rng, dtype=torch.float32):
    x = torch.randn(sum(counts), k, generator=rng).to(dtype)
    offsets = torch.zeros(len(counts) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(counts), 0)
    return x, offsets


@pytest.mark.parametrize("fmt", ["w4a16", "w8a16-asym", "mxfp4", "nvfp4"])
def test_stacked_experts_are_the_dense_layouts(fmt, rng):
    qw = _experts(fmt, 3, 40, 256, rng)
    p = dm.repack_experts(qw)
    assert p.experts == 3
    counts = [0, 5, 19]  # an expert without rows, one pass, two passes of 16
    x, offsets = _routing(counts, 256, rng)
    ref = ht.reference_grouped_linear(x, qw, offsets, out_dtype=torch.float32).double()
    for e, (r0, r1) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        if r1 == r0:
            continue
        got = dm.emulate(x[r0:r1], p.expert(e)) + qw.bias[e].double()
        assert_linear_close(got, ref[r0:r1], x[r0:r1], ht.dequantize_weight(qw)[e], torch.float32, f"{fmt} e{e}")


def test_grouped_rows_per_pass_are_checked(rng):
    """8, 16 or 32 rows per pass; 32 (four token tiles) with one or two chunks in flight only -- the launcher
    refuses the rest before any CUDA call."""
    p = dm.repack_experts(_experts("w4a16", 2, 32, 128, rng))
    x, offsets = _routing([3, 40], 128, rng, torch.bfloat16)
    out = torch.empty(43, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="8, 16 or 32"):
        dm.run_grouped(x, p, offsets, None, out, rows_per_pass=24)
    with pytest.raises(ValueError, match="unroll 1 or 2"):
        dm.run_grouped(x, p, offsets, None, out, unroll=3, rows_per_pass=32)
    with pytest.raises(ValueError, match="row grid runs 8 rows"):
        dm.run_grouped(x, p, offsets, None, out, rows_per_pass=16, grid="rows")
    with pytest.raises(ValueError, match="grid must be one of"):
        dm.run_grouped(x, p, offsets, None, out, grid="tiles")


def test_grouped_family_reasons():
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    fam = families.get("mma_decode_grouped")
    assert fam.backend == "cuda" and fam.op == "grouped_linear"
    s = ht.QuantScheme.parse("w4a16")
    assert fam.reason(Call("grouped_linear", s, torch.bfloat16, 8, 1536, 2048, 128)) is None
    assert "decode batches" in fam.reason(Call("grouped_linear", s, torch.bfloat16, 32768, 1536, 2048, 128))
    assert "act-order" in fam.reason(Call("grouped_linear", s, torch.bfloat16, 8, 1536, 2048, 128, True))
    assert [c.block_m for c in fam.candidates(Call("grouped_linear", s, torch.bfloat16, 8, 1536, 2048, 128))] \
        == [8] * len(fam.candidates(Call("grouped_linear", s, torch.bfloat16, 8, 1536, 2048, 128)))
    # rows per pass: 16 above one row per expert on average; 32 (measured slower than two 16-row passes) not offered
    mid = fam.candidates(Call("grouped_linear", s, torch.bfloat16, 1024, 1536, 2048, 128))
    wide = fam.candidates(Call("grouped_linear", s, torch.bfloat16, 4096, 1536, 2048, 128))
    assert {c.block_m for c in mid} == {8, 16} and {c.block_m for c in wide} == {8, 16}


def test_grouped_row_grid_family_reasons():
    """``mma_decode_grouped_rows`` runs only where its grid differs from the expert grid (fewer routed rows than
    experts), on the base family's configs plus deeper K splits."""
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    base, fam = families.get("mma_decode_grouped"), families.get("mma_decode_grouped_rows")
    assert fam.backend == "cuda" and fam.grid == "rows" and base.grid == "experts"
    s = ht.QuantScheme.parse("w4a16")
    few = Call("grouped_linear", s, torch.bfloat16, 8, 1536, 2048, 128)
    assert fam.reason(few) is None
    assert "row grid" in fam.reason(Call("grouped_linear", s, torch.bfloat16, 128, 1536, 2048, 128))
    assert "act-order" in fam.reason(Call("grouped_linear", s, torch.bfloat16, 8, 1536, 2048, 128, True))
    got = fam.candidates(few)
    assert all(c.family == fam.name and c.block_m == 8 and 32 * c.split_k * c.block_n // 16 <= 512 for c in got)
    assert {(c.split_k, c.block_n // 16) for c in got} > {(c.split_k, c.block_n // 16) for c in base.candidates(few)}


def _grid_equals_expert_grid(name, fmt, dtype, rng, e, n, k, routings, pick=lambda cfgs: cfgs):
    """Family ``name`` (the grouped decode kernel on another grid) computes bit for bit what the expert grid does
    with the same config, on every routing of ``routings`` and int64 / int32 offsets, and matches the reference
    expert by expert; ``pick`` chooses the configs from the family's candidates."""
    from cutlass_ext import native
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    if native.unavailable():
        pytest.fail(native.unavailable())
    base, fam = families.get("mma_decode_grouped"), families.get(name)
    qw = _experts(fmt, e, n, k, rng).to("cuda")
    w_hat = ht.dequantize_weight(qw.to("cpu"))
    for counts in routings:
        x, offsets = _routing(counts, k, rng, dtype)
        ref = ht.reference_grouped_linear(x, qw.to("cpu"), offsets, out_dtype=torch.float32).double()
        call = Call("grouped_linear", qw.scheme, dtype, x.shape[0], n, k, e)
        assert fam.reason(call) is None
        xc = x.cuda()
        for off in (offsets.cuda(), offsets.to(torch.int32).cuda()):
            for cfg in pick(fam.candidates(call)):
                want = base.run(xc, off, qw, None, dtype, dataclasses.replace(cfg, family=base.name),
                                poison_like(torch.empty(x.shape[0], n, dtype=dtype, device="cuda")))
                got = fam.run(xc, off, qw, None, dtype, cfg,
                              poison_like(torch.empty(x.shape[0], n, dtype=dtype, device="cuda")))
                assert torch.equal(got, want), f"{fmt} {counts} {cfg.describe()} {off.dtype}"
                for j, (r0, r1) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
                    if r1 > r0:
                        assert_linear_close(got[r0:r1].cpu(), ref[r0:r1], x[r0:r1].float(), w_hat[j], dtype,
                                            f"{fmt} {counts} e{j} {cfg.describe()}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,dtype", [("w4a16", torch.bfloat16), ("w8a16-asym", torch.float16),
                                       ("mxfp4", torch.bfloat16)])
def test_grouped_row_grid_equals_expert_grid(fmt, dtype, rng):
    """The row grid (a CTA row per routed row, each running the expert whose rows start there) computes exactly
    what the expert grid does: empty experts first, last and between, an expert of two passes, int32 / int64
    offsets; and it matches the reference."""
    _grid_equals_expert_grid("mma_decode_grouped_rows", fmt, dtype, rng, 16, 72, 384,
                             ([0, 0, 3, 0, 9] + [0] * 11, [1] + [0] * 15, [0] * 15 + [1],
                              [1, 0, 2, 0, 1, 1, 0, 0, 4] + [0] * 7))


def test_grouped_pass_grid_family():
    """``mma_decode_grouped_passes`` (and its activation-code twin) is the base family's kernel, configs and reasons
    on the pass grid; untimed, so ``auto`` takes it only where a measured table names it."""
    from humming_triton import dispatch
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    s = ht.QuantScheme.parse("w4a16")
    for base, name in (("mma_decode_grouped", "mma_decode_grouped_passes"),
                       ("mma_decode_grouped_act", "mma_decode_grouped_act_passes")):
        b, fam = families.get(base), families.get(name)
        assert fam.grid == "passes" and b.grid == "experts" and fam.backend == "cuda"
        scheme = s if base == "mma_decode_grouped" else ht.QuantScheme.parse("w4a8-mxfp4")
        call = Call("grouped_linear", scheme, torch.bfloat16, 512, 1536, 2048, 128)
        assert fam.reason(call) is None and b.reason(call) is None
        assert [c.describe() for c in fam.candidates(call)] == \
            [c.describe() for c in b.candidates(call)]
        assert all(c.family == name for c in fam.candidates(call))
        assert dispatch._measured_choice(call, {}, None) is None


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,dtype", [("w4a16", torch.bfloat16), ("w8a16-asym", torch.float16),
                                       ("mxfp4", torch.bfloat16), ("nvfp4", torch.bfloat16)])
def test_grouped_pass_grid_equals_expert_grid(fmt, dtype, rng):
    """The pass grid (a CTA row per pass of every expert's passes, found by a warp scan of the offsets) computes
    exactly what the expert grid does, at 8 / 16 / 32 rows per pass: empty experts first, last and between,
    experts of one to five passes, every row in one expert, one row in all, int32 / int64 offsets; and it matches
    the reference."""
    def pick(cfgs):
        return cfgs[:4] + [dataclasses.replace(c, block_m=16) for c in cfgs[:2]] + \
            [dataclasses.replace(c, block_m=32) for c in cfgs if c.num_stages <= 2][:2]
    _grid_equals_expert_grid("mma_decode_grouped_passes", fmt, dtype, rng, 40, 72, 384,
                             ([0, 0, 3, 0, 9] + [0] * 35, [70] + [0] * 39, [0] * 39 + [33], [1] * 40,
                              [1, 0, 17, 0, 1, 8, 0, 0, 16, 2] * 4), pick)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,dtype", [("w4a16", torch.bfloat16), ("w4a16", torch.float16),
                                       ("w8a16-asym", torch.float16), ("mxfp4", torch.bfloat16),
                                       ("nvfp4", torch.bfloat16), ("weight=int4,scale=fp16:g64", torch.bfloat16)])
def test_grouped_kernel_matches_reference(fmt, dtype, rng):
    from cutlass_ext import native
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    if native.unavailable():
        pytest.fail(native.unavailable())
    fam = families.get("mma_decode_grouped")
    qw = _experts(fmt, 6, 200, 768, rng).to("cuda")
    w_hat = ht.dequantize_weight(qw.to("cpu"))
    for counts in ([0, 1, 0, 0, 2, 1], [3, 0, 17, 1, 40, 5]):
        x, offsets = _routing(counts, 768, rng, dtype)
        ref = ht.reference_grouped_linear(x, qw.to("cpu"), offsets, out_dtype=torch.float32).double()
        xc = x.cuda()
        call = Call("grouped_linear", qw.scheme, dtype, x.shape[0], 200, 768, 6)
        assert fam.reason(call) is None
        # the 32-row pass (four token tiles) is no tuner candidate any more (measured slower) but run_grouped
        # still takes it: keep it checked
        four_tiles = [dataclasses.replace(c, block_m=32) for c in fam.candidates(call) if c.num_stages <= 2][:2]
        for off in (offsets.cuda(), offsets.to(torch.int32).cuda()):
            for cfg in fam.candidates(call) + four_tiles:
                out = poison_like(torch.empty(x.shape[0], 200, dtype=dtype, device="cuda"))
                y = fam.run(xc, off, qw, None, dtype, cfg, out)
                for e, (r0, r1) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
                    if r1 > r0:
                        assert_linear_close(y[r0:r1].cpu(), ref[r0:r1], x[r0:r1].float(), w_hat[e], dtype,
                                            f"{fmt} {counts} e{e} {cfg.describe()} {off.dtype}")
    y = ht.grouped_linear(xc, qw, offsets.cuda(), backend="cuda")
    assert y.shape == (x.shape[0], 200)


# The dense kernel's registers, read from an sm_90 compile: the decode GEMM is ALU-bound, and the grouped (MoE)
# pass loop once shared its kernel and took it from 61-68 registers to the 128 cap -- M = 1 rows 17-36 % slower on
# the H200 (session 7).  The dense and grouped launches are separate kernels; this keeps them apart.
DENSE_REG_BUDGET = 72  # the measured-fast build: 61-68 for one token tile, one or two chunks in flight


def test_dense_decode_kernel_registers(tmp_path):
    import re
    import shutil
    import subprocess
    from cutlass_ext.build import command, cuobjdump
    nvcc = shutil.which("nvcc")
    assert nvcc, "nvcc (the CUDA toolkit) is needed to compile the native decode kernels"
    obj = tmp_path / "decode.o"
    cmd = [c for c in command(["90"], obj, nvcc) if not c.startswith("-gencode=arch=compute_90,code=compute")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    tool = cuobjdump()
    assert tool, "no cuobjdump to read the registers"
    res = subprocess.run([tool, "-res-usage", str(obj)], capture_output=True, text=True, timeout=600).stdout
    assert shutil.which("c++filt"), "c++filt (binutils) is needed to read the kernels' template arguments"
    demangled = subprocess.run(["c++filt"], input=res, capture_output=True, text=True).stdout
    # spills show as STACK (the local-memory frame; cuobjdump's LOCAL is 0 for every kernel here)
    found = re.findall(r"Function ([^\n]*?decode_mma(?:_grouped)?_kernel<([^>]*)>[^\n]*)\n[^\n]*REG:(\d+) STACK:(\d+)",
                       demangled)
    dense = {args: (int(reg), int(stack)) for name, args, reg, stack in found if "grouped" not in name}
    grouped = {args.replace("(anonymous namespace)::", ""): (int(reg), int(stack))
               for name, args, reg, stack in found if "grouped" in name}
    assert dense and grouped, "the dense and grouped decode kernels were not both found"
    # the grid is the last template argument: 0 experts, 1 rows (one token tile only), 2 passes (every build)
    assert {a.rsplit(", ", 1)[1] for a in grouped} == {"0", "1", "2"}
    assert all(re.search(r", 1, (true|false), [1-8], 1$", a) for a in grouped if a.endswith(", 1"))
    assert {a[:-1] for a in grouped if a.endswith(", 2")} == {a[:-1] for a in grouped if a.endswith(", 0")}
    # the pass grid runs one pass per CTA: never more spill than the expert grid's loop, and at one or two token
    # tiles with one or two chunks in flight (the configs the tables pick) a small part of it
    twin = {a: (grouped[a[:-1] + "2"][1], grouped[a][1]) for a in grouped if a.endswith(", 0")}
    assert all(passes <= loop for passes, loop in twin.values()), twin
    hot_grouped = [v for a, v in twin.items() if re.search(r", [12], (true|false), [12], 0$", a)]
    assert sum(p for p, _ in hot_grouped) * 4 < sum(loop for _, loop in hot_grouped), hot_grouped
    # one token tile (NT = 1), no zero point, unroll 1 / 2: the configs the measured table picks at M = 1
    hot = {a: v for a, v in dense.items()
           if re.fullmatch(r"(__nv_bfloat16, (4|8|40|41)|__half, 18), 1, false, [12], false",
                           a.replace("(anonymous namespace)::", ""))}
    assert len(hot) == 10, sorted(dense)
    assert max(reg for reg, _ in hot.values()) <= DENSE_REG_BUDGET, hot
    assert max(stack for _, stack in hot.values()) <= 8, hot  # the measured-fast builds: int8 U = 1 spills 8
    # the hot loop's length: ptxas once branched around the x loads instead of predicating them, +5 instructions
    # per chunk and M = 1 rows 4-7 % slower on the H200 (session 9); the budgets are the measured-fast builds'
    sass = subprocess.run([tool, "-sass", str(obj)], capture_output=True, text=True, timeout=600).stdout
    sass = subprocess.run(["c++filt"], input=sass, capture_output=True, text=True).stdout
    for args, budget in DENSE_LOOP_BUDGET.items():
        per_chunk = _chunk_loops(sass, f"decode_mma_kernel<{args}>")
        assert len(per_chunk) == len(budget) and all(n <= b for n, b in zip(per_chunk, budget)), \
            f"decode_mma_kernel<{args}>: {per_chunk} instructions per chunk in its loops (budgets {budget})"


# instructions per chunk of the chunk loops, sm_90, shortest first -- channel scales (no group ends: every e2m1
# kind), an even number of chunks per group (a group end after every pair of chunks: g128, g256), an odd number
# (after every chunk).  One token tile, U = 1: the M = 1 winners; session 11's ping-pong registers (the loop
# unrolled by two, no copies) and a loop per group-end shape took int4 108 -> 65 / 78 / 89; session 12's loop
# unrolled by U + 1 (one body for U = 1 and 3) 62 / 77 / 92.  Two token tiles (M = 16), U = 1 and 3: x by half
# chunks within 64 registers (session 13) costs instructions (U = 1 with whole chunks unbounded: 71 / 89 / 105) and
# wins on occupancy.
DENSE_LOOP_BUDGET = {"__nv_bfloat16, 4, 1, false, 1, false": (62, 77, 92),
                     "__nv_bfloat16, 8, 1, false, 1, false": (100, 116, 129),
                     "__nv_bfloat16, 40, 1, false, 1, false": (105, 121, 135),
                     "__nv_bfloat16, 41, 1, false, 1, false": (125, 138, 152),
                     "__nv_bfloat16, 4, 2, false, 1, false": (78, 98, 115),
                     "__nv_bfloat16, 4, 2, false, 3, false": (78, 107, 128)}


def _chunk_loops(sass: str, kernel: str) -> list[float]:
    """Instructions per 64-wide chunk of each backward-branch loop of ``kernel``'s sm_90 SASS that holds the most
    HMMAs (4 per chunk and token tile; the tiles are the kernel's third template argument), shortest first."""
    import re
    body = None
    for part in re.split(r"\n\s+Function : ", sass):
        head = part.split("\n", 1)[0].replace("(anonymous namespace)::", "")
        if kernel in head and "grouped" not in head:
            body = part
    assert body, f"{kernel} not in the SASS"
    ops = [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", body)]
    loops = []
    for at, op in ops:
        m = re.search(r"BRA (?:P\d, )?0x([0-9a-f]+)", op)
        if m and int(m.group(1), 16) < at:
            loop = [o for a, o in ops if int(m.group(1), 16) <= a <= at]
            loops.append((sum("HMMA" in o for o in loop), len(loop)))
    most = max((mma for mma, _ in loops), default=0)
    assert most, f"{kernel}: no loop with an HMMA"
    nt = int(kernel.split("<", 1)[1].split(",")[2])
    return sorted(n / (most / (4 * nt)) for mma, n in loops if mma == most)
