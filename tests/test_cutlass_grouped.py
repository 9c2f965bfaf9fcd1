"""MoE experts on the sm_90a CUTLASS grouped mixed-input GEMM (``cutlass_ext/csrc_sm90_grouped``, families
``cutlass_grouped`` / ``cutlass_grouped_bf16s`` / ``cutlass_grouped_shuffled`` (int4) and ``cutlass_grouped_mx`` (MXFP4 as e4m3 rows), backend
``cutlass``; issue 11).

CPU: the Python tables agree with the .cu's; the repacked experts, read back the way CUTLASS reads them
(``emulate``: low nibble first, N-major scales in the format's type), equal the reference over uneven and empty
experts; unsupported weights get a reason; the launcher refuses bad arguments before touching the library; the
families are opt-in.  GPU (``-m gpu``): every built variant of both formats against the reference over uneven and
empty experts, int32 and int64 offsets, poisoned outputs, CUDA-graph replay, an expert bias on the Triton kernel.
"""
import re
from pathlib import Path

import pytest
import torch

import humming_triton as ht
from cutlass_ext import grouped_gemm as gg
from humming_triton.calls import Call, KernelConfig
from humming_triton.kernels import families
from humming_triton.testing import assert_linear_close, poison_like

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = {"cutlass_grouped": 0, "cutlass_grouped_bf16s": 10, "cutlass_grouped_shuffled": 11}  # the int4 families
ALL_FAMILIES = {**FAMILIES, "cutlass_grouped_mx": 6, "cutlass_grouped_mx_a8": 6}
SCHEMES = ["w4a16", "weight=int4,scale=bf16:g64", "weight=int4,scale=fp32:g256"]


def _experts(scheme, e, n, k, rng, bias=False):
    w = torch.randn(e, n, k, generator=rng) * 0.05
    return ht.quantize_weight(w, scheme, bias=torch.randn(e, n, generator=rng) if bias else None)


def _routed(counts, k, rng):
    offsets = torch.zeros(len(counts) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(counts), 0)
    return torch.randn(int(offsets[-1]), k, generator=rng).to(torch.bfloat16), offsets


def test_tables_match_the_source():
    from cutlass_ext.build import sm90_grouped_kernels
    text = (ROOT / "cutlass_ext" / "csrc_sm90_grouped" / "grouped_gemm.cu").read_text()
    variants = re.findall(r"X\((\d+), Shape<_(\d+) COMMA _(\d+) COMMA _(\d+)>, (\w+)\)", text)
    assert {int(v): (int(t), int(k), int(rows)) for v, rows, t, k, _ in variants} == gg.VARIANTS
    assert all((policy == "Pingpong") == (rows == "64") for _, rows, _, _, policy in variants)
    rows = re.findall(r"HT_SM90G_FMT == (\d+)(?: \|\| HT_SM90G_FMT == (\d+))?\nusing HtWeight = (?:cutlass::)?(\w+);"
                      r"\nusing HtScale = (?:cutlass::)?(\w+);\nconstexpr bool HtShuffled = ([^;]+);", text)
    weights = {"int4b_t": "int4", "float_e4m3_t": "e4m3fn"}
    scales = {"float": torch.float32, "bfloat16_t": torch.bfloat16}
    got, shuffled = {}, set()
    for f1, f2, w, t, shuf in rows:
        for f in filter(None, (f1, f2)):
            got[int(f)] = (weights[w], scales[t])
            other = re.fullmatch(r"HT_SM90G_FMT != (\d+)", shuf)  # the branch's C++ expression at that format
            assert shuf == "false" or other, shuf
            if other and int(f) != int(other.group(1)):
                shuffled.add(int(f))
    assert got == gg.FORMATS and shuffled == gg.SHUFFLED
    # the shuffled order is the dense kernels' own, word for word
    dense = (ROOT / "cutlass_ext" / "csrc_sm90" / "mixed_gemm.cu").read_text()
    block = re.compile(r"using ShuffleBlock = [^;]+;")
    assert block.search(text).group(0) == block.search(dense).group(0)
    assert sorted(sm90_grouped_kernels()) == sorted((f, v) for f in gg.FORMATS for v in gg.VARIANTS)
    assert {families.get(n).fmt for n in ALL_FAMILIES} == set(gg.FORMATS)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("fmt", sorted(FAMILIES.values()))
def test_emulated_kernel_matches_reference(scheme, fmt, rng):
    e, n, k = 5, 80, 512
    qw = _experts(scheme, e, n, k, rng)
    p = gg.repack_experts(qw, fmt)
    assert p.w.shape == (e, n, k // 2) and p.scales.shape == (e, k // p.group, n) and p.scales.dtype == gg.FORMATS[fmt][1]
    x, offsets = _routed([3, 0, 9, 1, 20], k, rng)
    ref = ht.reference_grouped_linear(x, qw, offsets, out_dtype=torch.float32).double()
    got = gg.emulate(x, p, offsets)
    w_hat = ht.dequantize_weight(qw)
    for i in range(e):
        rows = slice(int(offsets[i]), int(offsets[i + 1]))
        if rows.stop > rows.start:
            assert_linear_close(got[rows], ref[rows], x[rows].float(), w_hat[i], torch.bfloat16, f"{scheme} e{i}")


def test_shuffled_experts_emulate_as_format_10(rng):
    """Format 11 holds each expert's codes in the shuffled order (not the canonical bytes) and computes what format
    10 computes; N not a multiple of 16 is refused with the reason."""
    e, n, k = 3, 48, 256
    qw = _experts("w4a16", e, n, k, rng)
    p10, p11 = gg.repack_experts(qw, 10), gg.repack_experts(qw, 11)
    assert not torch.equal(p10.w, p11.w)
    for i in range(e):  # each expert shuffled on its own
        from cutlass_ext.mixed_gemm import shuffle
        assert torch.equal(p11.w[i], shuffle(torch.stack([p10.w[i] & 15, p10.w[i] >> 4], -1).reshape(n, k)))
    x, offsets = _routed([4, 0, 7], k, rng)
    assert torch.equal(gg.emulate(x, p11, offsets), gg.emulate(x, p10, offsets))
    call = Call("grouped_linear", qw.scheme, torch.bfloat16, 11, 72, k, experts=e, device_type="cpu")
    assert "multiple of 16" in (families.get("cutlass_grouped_shuffled").reason(call) or "")
    with pytest.raises(ValueError, match="16-row blocks"):
        gg.repack_experts(_experts("w4a16", 2, 72, k, rng), 11)


def test_emulation_can_fail(rng):
    """A mistake in the repack (the nibbles swapped) is caught by the same comparison."""
    qw = _experts("w4a16", 2, 64, 256, rng)
    p = gg.repack_experts(qw, 0)
    p.w = ((p.w & 15) << 4) | (p.w >> 4)
    x, offsets = _routed([7, 9], 256, rng)
    ref = ht.reference_grouped_linear(x, qw, offsets, out_dtype=torch.float32).double()
    with pytest.raises(AssertionError):
        assert_linear_close(gg.emulate(x, p, offsets), ref, x.float(), ht.dequantize_weight(qw)[0], torch.bfloat16,
                            "swapped nibbles")


@pytest.mark.parametrize("scheme,dtype,n,k,why", [
    ("w8a16", torch.bfloat16, 256, 1024, "signed int4"),
    ("w4a16-asym", torch.bfloat16, 256, 1024, "signed int4"),
    ("w4a16", torch.float16, 256, 1024, "bf16 only"),
    ("weight=int4,scale=fp16:channel", torch.bfloat16, 256, 1024, "per row and K group"),
    ("w4a8-fp8", torch.bfloat16, 256, 1024, "quantizes its activations"),
    ("w4a16", torch.bfloat16, 100, 1024, "N=100"),
    ("weight=int4,scale=bf16:g32", torch.bfloat16, 256, 1024, "scale group 32"),
])
def test_unsupported_weights_have_a_reason(scheme, dtype, n, k, why):
    call = Call("grouped_linear", ht.QuantScheme.parse(scheme), dtype, 64, n, k, experts=8, device_type="cpu")
    for name in FAMILIES:
        assert why in (families.get(name).reason(call) or ""), name


def test_dense_calls_and_act_order_are_refused():
    s = ht.QuantScheme.parse("w4a16")
    fam = families.get("cutlass_grouped")
    assert "MoE experts" in fam.reason(Call("quant_linear", s, torch.bfloat16, 16, 256, 1024, device_type="cpu"))
    assert "act-order" in fam.reason(Call("grouped_linear", s, torch.bfloat16, 16, 256, 1024, experts=4,
                                          act_order=True, device_type="cpu"))


def test_candidates_respect_the_group():
    fam = families.get("cutlass_grouped_bf16s")
    g64 = Call("grouped_linear", ht.QuantScheme.parse("weight=int4,scale=bf16:g64"), torch.bfloat16, 512, 1536,
               2048, experts=128, device_type="cpu")
    assert fam.reason(g64) is None
    picks = fam.candidates(g64)
    assert picks and all(c.block_k == 64 for c in picks)
    assert len(fam.candidates(g64.__class__(**{**g64.__dict__, "scheme": ht.QuantScheme.parse("w4a16")}))) == \
        len(gg.VARIANTS)
    for cfg in picks:
        from humming_triton.kernels.families.cutlass_grouped import variant_of
        assert gg.VARIANTS[variant_of(cfg)] == (cfg.block_m, cfg.block_k, cfg.block_n)


def test_run_checks_its_arguments_before_the_library(rng):
    qw = _experts("w4a16", 3, 64, 256, rng)
    p = gg.repack_experts(qw, 10)
    x, offsets = _routed([2, 0, 5], 256, rng)
    out = torch.empty(7, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unknown variant"):
        gg.run(x, p, offsets, out, 99)
    with pytest.raises(ValueError, match="bf16 activations"):
        gg.run(x.half(), p, offsets, out, 0)
    with pytest.raises(ValueError, match="contiguous"):
        gg.run(x[:, :128], p, offsets, out, 0)
    with pytest.raises(ValueError, match="4 int32 / int64"):
        gg.run(x, p, offsets[:3], out, 0)
    with pytest.raises(ValueError, match="3-D expert weights"):
        gg.repack_experts(ht.quantize_weight(torch.randn(64, 256, generator=rng), "w4a16"), 0)
    with pytest.raises(ValueError, match="unknown grouped int4 format"):
        gg.repack_experts(qw, 6)


def test_families_are_opt_in(monkeypatch):
    """Runnable on an sm_90a build, yet ``auto`` never runs them without a measured table entry naming them (they
    are untimed until the tuner times them on the device)."""
    from humming_triton import backends, dispatch
    from humming_triton.capability import facts_for_sm
    monkeypatch.setattr(gg, "available", lambda fmt=None: None)  # as if the sm_90a build were loaded
    monkeypatch.setattr(gg, "built_variants", lambda fmt: sorted(gg.VARIANTS))
    call = Call("grouped_linear", ht.QuantScheme.parse("w4a16"), torch.bfloat16, 512, 1536, 2048, experts=128,
                facts=facts_for_sm((9, 0)))
    for name in FAMILIES:
        fam = families.get(name)
        assert fam.backend == "cutlass" and fam.op == "grouped_linear" and fam.mma(call) == "wgmma"
        assert fam.reason(call) is None and len(fam.candidates(call)) == len(gg.VARIANTS)
        assert "SM 9.0 only" in fam.reason(Call("grouped_linear", call.scheme, torch.bfloat16, 512, 1536, 2048,
                                                experts=128, facts=facts_for_sm((10, 0))))
    assert dispatch._measured_choice(call, {}, None) is None
    assert backends.get("triton").default(call).family not in FAMILIES


# ---- MXFP4 experts as e4m3 rows (format 6) ------------------------------------------------------------------------

def _mx_family():
    return families.get("cutlass_grouped_mx")


@pytest.mark.parametrize("spread", [0, 6])
def test_mx_rows_emulated_match_reference(spread, rng):
    """The e4m3 rows and bf16 row scales the family hands the kernel, read back as format 6 computes (e4m3 -> bf16,
    times the row scale in bf16), give the reference's products: the conversion is exact."""
    e, n, k = 4, 48, 512
    w = torch.randn(e, n, k, generator=rng) * 0.05
    if spread:  # blocks' magnitudes ramp over that many binades along K
        w = w * torch.exp2(torch.linspace(0, spread, k // 32)).repeat_interleave(32)
    qw = ht.quantize_weight(w, "mxfp4")
    p = _mx_family().packed(qw)
    assert p.fmt == 6 and p.group == k and p.scales.shape == (e, 1, n) and p.w.shape == (e, n, k)
    deq = p.w.view(torch.float8_e4m3fn).to(torch.bfloat16) * p.scales.transpose(1, 2)
    assert torch.equal(deq.float(), ht.dequantize_weight(qw).float())  # exact, row by row
    x, offsets = _routed([3, 0, 9, 20], k, rng)
    ref = ht.reference_grouped_linear(x, qw, offsets, out_dtype=torch.float32).double()
    got = gg.emulate(x, p, offsets)
    assert float((got - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_mx_rows_outside_bf16s_exact_range_are_refused():
    codes = torch.ones(2, 8, 64).to(torch.float8_e4m3fn)
    ok = gg.pack_e4m3_rows(codes, torch.full((2, 8), 2.0 ** -124))
    assert isinstance(ok, gg.PackedExperts)
    for bad in (2.0 ** -125, 2.0 ** 120):
        why = gg.pack_e4m3_rows(codes, torch.full((2, 8), bad))
        assert isinstance(why, str) and "exact" in why


@pytest.mark.parametrize("scheme,dtype,n,k,why", [
    ("w4a16", torch.bfloat16, 256, 1024, "converts MXFP4"),
    ("nvfp4", torch.bfloat16, 256, 1024, "converts MXFP4"),
    ("mxfp4", torch.float16, 256, 1024, "bf16 only"),
    ("w4a8-mxfp4", torch.bfloat16, 256, 1024, "quantizes its activations"),
    ("mxfp4", torch.bfloat16, 256, 1056, "K=1056"),
])
def test_mx_reasons(scheme, dtype, n, k, why):
    call = Call("grouped_linear", ht.QuantScheme.parse(scheme), dtype, 64, n, k, experts=8, device_type="cpu")
    assert why in (_mx_family().reason(call) or "")


@pytest.mark.parametrize("scheme,dtype,n,k,why", [
    ("w4a8-mxfp4", torch.bfloat16, 256, 1024, None),
    ("mxfp4", torch.bfloat16, 256, 1024, "per-token e4m3"),
    ("w4a8-mx", torch.bfloat16, 256, 1024, "per-token e4m3"),
    ("w8a8-fp8", torch.bfloat16, 256, 1024, "converts MXFP4"),
    ("w4a8-mxfp4", torch.float16, 256, 1024, "bf16 only"),
    ("w4a8-mxfp4", torch.bfloat16, 100, 1024, "N=100"),
])
def test_mx_a8_reasons(scheme, dtype, n, k, why):
    call = Call("grouped_linear", ht.QuantScheme.parse(scheme), dtype, 64, n, k, experts=8, device_type="cpu")
    got = families.get("cutlass_grouped_mx_a8").reason(call)
    assert got is None if why is None else why in (got or "")


# ---- the kernels on the GPU ------------------------------------------------------------------------------------

COUNTS = {"decode": [1, 0, 3, 1, 0, 2, 9, 1], "uneven": [70, 0, 133, 5, 300, 1, 0, 64], "one": [0, 0, 257, 0]}


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("counts", COUNTS, ids=str)
def test_kernel_matches_reference(name, scheme, counts, rng):
    fam, fmt = families.get(name), FAMILIES[name]
    why = gg.available(fmt)
    if why:
        pytest.fail(why)  # asked for GPU tests: a missing build is a failure, not a skip
    counts = COUNTS[counts]
    n, k = 208, 1024
    qw = _experts(scheme, len(counts), n, k, rng).to("cuda")
    x, offsets = _routed(counts, k, rng)
    ref = ht.reference_grouped_linear(x, qw.to("cpu"), offsets, out_dtype=torch.float32).double()
    w_hat = ht.dequantize_weight(qw.to("cpu"))
    call = Call("grouped_linear", qw.scheme, torch.bfloat16, x.shape[0], n, k, experts=len(counts))
    assert fam.reason(call) is None and fam.candidates(call)
    for i, cfg in enumerate(fam.candidates(call)):
        off = offsets.to("cuda", torch.int32 if i % 2 else torch.int64)
        out = poison_like(torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda"))
        y = fam.run(x.cuda(), off, qw, None, torch.bfloat16, cfg, out)
        assert y.data_ptr() == out.data_ptr()
        for e, c in enumerate(counts):
            rows = slice(int(offsets[e]), int(offsets[e + 1]))
            if c:
                assert_linear_close(y[rows].cpu(), ref[rows], x[rows].float(), w_hat[e], torch.bfloat16,
                                    f"{name} {scheme} expert {e} {cfg.describe()}")


@pytest.mark.gpu
def test_graph_replay_bias_and_empty_batch(rng):
    fam = families.get("cutlass_grouped_bf16s")
    if gg.available(10):
        pytest.fail(gg.available(10))
    n, k, counts = 256, 512, [5, 0, 40, 3]
    qw = _experts("w4a16", 4, n, k, rng, bias=True).to("cuda")
    nobias = qw.__class__(**{**qw.__dict__, "bias": None, "cache": {}})
    x, offsets = _routed(counts, k, rng)
    x, off = x.cuda(), offsets.cuda()
    cfg = fam.candidates(Call("grouped_linear", qw.scheme, torch.bfloat16, 48, n, k, experts=4))[0]
    y0 = fam.run(x, off, nobias, None, torch.bfloat16, cfg, None)
    graph, out = torch.cuda.CUDAGraph(), torch.empty_like(y0)
    with torch.cuda.graph(graph):
        fam.run(x, off, nobias, None, torch.bfloat16, cfg, out)
    x.copy_(torch.randn(x.shape, generator=rng).to(x.dtype))
    graph.replay()
    assert torch.equal(out, fam.run(x, off, nobias, None, torch.bfloat16, cfg, None))
    # an expert bias: the Triton grouped kernel, the reference's answer
    yb = fam.run(x, off, qw, qw.bias, torch.bfloat16, cfg, None)
    ref = ht.reference_grouped_linear(x.cpu(), qw.to("cpu"), offsets, out_dtype=torch.float32)
    assert float((yb.cpu().float() - ref).norm() / ref.norm()) < 1e-2
    empty = fam.run(x[:0], torch.zeros(5, dtype=torch.int64, device="cuda"), nobias, None, torch.bfloat16, cfg, None)
    assert empty.shape == (0, n)


# ---- CI: the grouped kernel compiles for sm_90a ------------------------------------------------------------------

def test_sm90a_grouped_kernel_compiles_to_wgmma(tmp_path, cutlass_nvcc):
    """One kernel (bf16 scales, 128 weight rows x 128 tokens x 64 K, cooperative): nvcc compiles it against the
    nvidia-cutlass headers, the SASS holds bf16 HGMMA and neither the GEMM nor the per-expert fill kernel spills.
    ~1-2 min on one core."""
    import subprocess
    nvcc = cutlass_nvcc
    from cutlass_ext.build import SM90_GROUPED_SOURCE, cuobjdump, cutlass_command
    obj = tmp_path / "grouped.o"
    cmd = cutlass_command(SM90_GROUPED_SOURCE, obj, "90a", nvcc, ("HT_SM90G_FMT=10", "HT_SM90G_VARIANT=2"))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    tool = cuobjdump()
    assert tool, "no cuobjdump (Triton's bundled one, or the CUDA toolkit's) to read the SASS"
    sass = subprocess.run([tool, "-sass", str(obj)], capture_output=True, text=True, timeout=600).stdout
    assert re.search(r"HGMMA\.64x128x16\.F32\.BF16\b", sass), set(re.findall(r"HGMMA\.\S+", sass))
    res = subprocess.run([tool, "-res-usage", str(obj)], capture_output=True, text=True, timeout=600).stdout
    assert res.count("Function") == 3 and res.count("LOCAL:0") == 3, res


@pytest.mark.gpu
@pytest.mark.parametrize("counts", COUNTS, ids=str)
def test_mx_kernel_matches_reference(counts, rng):
    fam = _mx_family()
    if gg.available(6):
        pytest.fail(gg.available(6))
    counts = COUNTS[counts]
    n, k = 208, 1024
    w = torch.randn(len(counts), n, k, generator=rng) * 0.05
    qw = ht.quantize_weight(w * torch.exp2(torch.linspace(0, 5, k // 32)).repeat_interleave(32), "mxfp4").to("cuda")
    x, offsets = _routed(counts, k, rng)
    ref = ht.reference_grouped_linear(x, qw.to("cpu"), offsets, out_dtype=torch.float32).double()
    w_hat = ht.dequantize_weight(qw.to("cpu"))
    call = Call("grouped_linear", qw.scheme, torch.bfloat16, x.shape[0], n, k, experts=len(counts))
    assert fam.reason(call) is None and fam.candidates(call)
    for cfg in fam.candidates(call):
        out = poison_like(torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda"))
        y = fam.run(x.cuda(), offsets.cuda(), qw, None, torch.bfloat16, cfg, out)
        assert y.data_ptr() == out.data_ptr()
        for e, c in enumerate(counts):
            rows = slice(int(offsets[e]), int(offsets[e + 1]))
            if c:
                assert_linear_close(y[rows].cpu(), ref[rows], x[rows].float(), w_hat[e], torch.bfloat16,
                                    f"mx expert {e} {cfg.describe()}")


@pytest.mark.gpu
@pytest.mark.parametrize("counts", COUNTS, ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_mx_a8_kernel_matches_reference(counts, bias, rng):
    """W4A8-MXFP4 experts: each expert's rows against the reference on the same e4m3 activation codes, within the
    fp8 activations' tolerance (an expert bias runs the Triton grouped kernel)."""
    fam = families.get("cutlass_grouped_mx_a8")
    if gg.available(6):
        pytest.fail(gg.available(6))
    counts = COUNTS[counts]
    n, k = 208, 1024
    w = torch.randn(len(counts), n, k, generator=rng) * 0.05
    qw = ht.quantize_weight(w * torch.exp2(torch.linspace(0, 5, k // 32)).repeat_interleave(32), "w4a8-mxfp4",
                            bias=torch.randn(len(counts), n, generator=rng) if bias else None).to("cuda")
    x, offsets = _routed(counts, k, rng)
    x_hat = ht.dequantize_activation(ht.quantize_activation(x, qw.scheme.act)).double()
    w_hat = ht.dequantize_weight(qw.to("cpu")).double()
    call = Call("grouped_linear", qw.scheme, torch.bfloat16, x.shape[0], n, k, experts=len(counts))
    assert fam.reason(call) is None and fam.candidates(call)
    for cfg in fam.candidates(call):
        out = poison_like(torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda"))
        y = fam.run(x.cuda(), offsets.cuda(), qw, qw.bias, torch.bfloat16, cfg, out)
        assert y.data_ptr() == out.data_ptr()
        for e, c in enumerate(counts):
            rows = slice(int(offsets[e]), int(offsets[e + 1]))
            if c:
                ref = x_hat[rows] @ w_hat[e].T + (qw.bias[e].double().cpu() if bias else 0)
                assert_linear_close(y[rows].cpu(), ref, x_hat[rows], w_hat[e], torch.float8_e4m3fn,
                                    f"mx a8 expert {e} {cfg.describe()}")
