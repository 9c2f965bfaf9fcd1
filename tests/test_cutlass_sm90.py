"""The sm_90a CUTLASS mixed-input GEMMs (issue 13: ``cutlass_ext/csrc_sm90``, family ``cutlass_mixed``, backend
``cutlass``).

CPU: the Python format table agrees with the .cu's; the repacked operands, read back the way CUTLASS reads them
(``emulate``: sub-byte order, N-major scales, folded zeros, the mainloop's scale types), equal the reference on
odd shapes for every format; unsupported weights get a reason; the family is opt-in.  CI compiles one kernel per
weight family for sm_90a and checks the SASS (time-boxed).  GPU (``-m gpu``): every variant against the
reference on odd shapes, bias, poisoned outputs.
"""
import dataclasses
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import humming_triton as ht
from cutlass_ext import mixed_gemm as mg
from humming_triton.calls import Call
from humming_triton.testing import assert_linear_close, poison_like

ROOT = Path(__file__).resolve().parent.parent
# scheme -> the formats it runs as (bf16, fp16 activations)
SCHEMES = {"w4a16": (0, 1), "weight=int4,scale=bf16:g128": (0, None), "weight=int4,scale=fp32:g256": (0, None),
           "w4a16-asym": (2, 3), "weight=uint4,scale=bf16:g64,zero=int": (2, 3), "w8a16": (4, 5),
           "weight=int8,scale=fp32:channel": (4, 5), "w8a16-fp8": (6, 7), "weight=int4,scale=fp16:channel": (8, 9)}
SHAPES = [(72, 384), (200, 1024), (8, 256)]  # N a multiple of 8, not of the 128-row tile


def _weight(scheme, n, k, rng):
    w = torch.randn(n, k, generator=rng) * 0.05
    return ht.quantize_weight(w, scheme, bias=torch.randn(n, generator=rng))


def _shape_ok(scheme, k):
    return mg.weight_reason(ht.QuantScheme.parse(scheme), 8, k, torch.bfloat16) is None


def test_format_table_matches_the_source():
    text = (ROOT / "cutlass_ext" / "csrc_sm90" / "mixed_gemm.cu").read_text()
    rows = re.findall(r"X\((\d+), (?:cutlass::)?(\w+), cutlass::(\w+), (?:cutlass::)?(\w+), Scaling::(\w+), "
                      r"(HT_RM|Order::Shuffled)\)", text)
    names = {"int4b_t": "int4", "uint4b_t": "uint4", "int8_t": "int8", "float_e4m3_t": "e4m3fn"}
    acts = {"bfloat16_t": torch.bfloat16, "half_t": torch.float16}
    scaling = {"Group": "group", "GroupZero": "group_zero", "Channel": "channel"}
    scale_types = {"float": torch.float32, "half_t": torch.float16, "bfloat16_t": torch.bfloat16}
    got = {int(i): (names[w], acts[a], scaling[s]) for i, w, a, _, s, _ in rows}
    assert got == mg.FORMATS
    assert {int(i) for i, *_, order in rows if order == "Order::Shuffled"} == mg.SHUFFLED
    for i, _, _, sc, s, _ in rows:
        if s != "Channel":
            assert mg.GROUP_SCALE_DTYPE[int(i)] == scale_types[sc], i
    variants = re.findall(r"X\((\d+), Shape<_(\d+) COMMA _(\d+) COMMA _(\d+)>, (\w+),", text)
    assert {int(v): (int(t), int(k), policy == "StreamK", int(rows))
            for v, rows, t, k, policy in variants} == mg.VARIANTS
    # cooperative policies split 128-row tiles over two warpgroups; pingpong runs 64-row ones
    assert all((policy == "Pingpong") == (rows == "64") for _, rows, _, _, policy in variants)


CPU_CASES = [(s, shape, dtype) for s in SCHEMES for shape in SHAPES for dtype in (torch.bfloat16, torch.float16)
             if SCHEMES[s][dtype == torch.float16] is not None and _shape_ok(s, shape[1])]


@pytest.mark.parametrize("scheme,shape,dtype", CPU_CASES)
def test_emulated_kernel_matches_reference(scheme, shape, dtype, rng):
    fmt = SCHEMES[scheme][dtype == torch.float16]
    n, k = shape
    qw = _weight(scheme, n, k, rng)
    p = mg.repack(qw, dtype)
    assert p.fmt == fmt
    for m in (1, 5, 33):
        x = torch.randn(m, k, generator=rng).to(dtype)
        ref = ht.reference_linear(x, qw, out_dtype=torch.float32).double()
        got = mg.emulate(x, p, qw.bias.to(dtype))
        ref16 = ref - qw.bias.double() + qw.bias.to(dtype).double()
        assert_linear_close(got, ref16, x.float(), ht.dequantize_weight(qw), dtype, f"{scheme} {shape} {dtype} M={m}")


def test_emulation_can_fail(rng):
    """The emulation reads what repack wrote: a scale matrix left [N, groups] instead of N-major is caught."""
    qw = _weight("w4a16", 72, 384, rng)
    p = mg.repack(qw, torch.bfloat16)
    x = torch.randn(3, 384, generator=rng).to(torch.bfloat16)
    ref = ht.reference_linear(x, qw, out_dtype=torch.float32).double() - qw.bias.double()
    bad = mg.Packed(p.fmt, p.w, p.scales.reshape(-1).flip(0).reshape(p.scales.shape), None, p.n, p.k, p.group)
    with pytest.raises(AssertionError):
        assert_linear_close(mg.emulate(x, bad), ref, x.float(), ht.dequantize_weight(qw), torch.bfloat16)


@pytest.mark.parametrize("scheme,dtype,why", [
    ("w4a8-fp8", torch.bfloat16, "quantizes its activations"), ("w4a16", torch.float32, "bf16 / fp16 only"),
    ("mxfp4", torch.bfloat16, "e8m0 scales"), ("nvfp4", torch.bfloat16, "global scale"),
    ("weight=int4,scale=fp16:g32", torch.bfloat16, "scale group 32"),
    ("w1a16", torch.bfloat16, "zero=float"), ("w3a16", torch.bfloat16, "uint3"),
    ("w8a16-asym", torch.bfloat16, "uint8 with zero=int"),
    ("weight=int4,scale=bf16:g128", torch.float16, "fp16 scales only"),
    ("w8a16-fp8-block", torch.bfloat16, "scale blocks of 128 rows"),
])
def test_unsupported_weights_have_a_reason(scheme, dtype, why):
    s = ht.QuantScheme.parse(scheme)
    got = mg.weight_reason(s, 256, 1024, dtype)
    assert got is not None and why in got, got
    if s.act is None and dtype != torch.float32:
        with pytest.raises(ValueError, match="cannot take this weight"):
            mg.repack(ht.quantize_weight(torch.randn(256, 1024) * 0.05, s), dtype)


@pytest.mark.parametrize("n,k,why", [(256, 1000, "K=1000"), (100, 1024, "N=100")])
def test_shape_rules(n, k, why):
    assert why in mg.weight_reason(ht.QuantScheme.parse("w8a16"), n, k, torch.bfloat16)


def test_variants_respect_the_group():
    assert mg.variant_reason(0, 64) is not None  # K tile 128 > group 64
    assert mg.variant_reason(3, 64) is None and mg.variant_reason(0, 128) is None and mg.variant_reason(0, 0) is None
    assert "unknown variant" in mg.variant_reason(99, 128)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_accepted_call_has_candidates(scheme):
    """Where the family takes a call it offers a config for it, at every M (g64 fits only the 64-wide K tiles,
    which only the larger token tiles have: a one-token call still gets one of those)."""
    from humming_triton.kernels import families
    from humming_triton.kernels.families.cutlass_mixed import variant_of
    fam = families.get("cutlass_mixed")
    for m in (1, 7, 16, 64, 300, 5000):
        call = Call("quant_linear", ht.QuantScheme.parse(scheme), torch.bfloat16, m, 200, 1024, device_type="cpu")
        assert fam.reason(call) is None
        cands = fam.candidates(call)
        assert cands, (scheme, m)
        s = ht.QuantScheme.parse(scheme)
        group = s.group_k(1024) if s.scale.block_k else 0
        assert all(mg.variant_reason(variant_of(c), group) is None for c in cands), (scheme, m)


def test_family_and_backend_are_opt_in(monkeypatch):
    from humming_triton import backends
    monkeypatch.setattr(mg, "available", lambda fmt=None: None)  # as if the sm_90a build were loaded
    monkeypatch.setattr(mg, "built_variants", lambda fmt: sorted(mg.VARIANTS))
    from humming_triton.capability import facts_for_sm
    from humming_triton.kernels import families
    from humming_triton.kernels.families.cutlass_mixed import variant_of
    fam = families.get("cutlass_mixed")
    assert fam.backend == "cutlass" and "cutlass" in backends.names()
    scheme = ht.QuantScheme.parse("w4a16")
    for m in (1, 16, 256, 4096):
        call = Call("quant_linear", scheme, torch.bfloat16, m, 8192, 8192, facts=facts_for_sm((9, 0)))
        assert fam.reason(call) is None and fam.mma(call) == "wgmma"
        cands = fam.candidates(call)
        assert cands and {variant_of(c) for c in cands} <= set(mg.VARIANTS)
        assert backends.get("triton").default(call).backend != "cutlass"
    g64 = Call("quant_linear", ht.QuantScheme.parse("weight=int4,scale=fp16:g64"), torch.float16, 64, 4096, 4096)
    assert all(c.block_k == 64 for c in fam.candidates(g64))
    assert "SM 9.0 only" in fam.reason(Call("quant_linear", scheme, torch.bfloat16, 16, 8192, 8192,
                                            facts=facts_for_sm((10, 0))))
    assert "dense" in fam.reason(Call("grouped_linear", scheme, torch.bfloat16, 16, 8192, 8192, experts=8))
    assert "act-order" in fam.reason(Call("quant_linear", scheme, torch.bfloat16, 16, 8192, 8192, act_order=True))


def test_run_checks_its_arguments_before_the_library(rng):
    """Bad arguments are refused with a message naming the problem before any native call (no library here)."""
    qw = _weight("w4a16", 72, 384, rng)
    p = mg.repack(qw, torch.bfloat16)
    x = torch.randn(4, 384, generator=rng).to(torch.bfloat16)
    out = torch.empty(4, 72, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="takes torch.bfloat16 activations"):
        mg.run(x.half(), p, None, out.half())
    with pytest.raises(ValueError, match="must be contiguous"):
        mg.run(x.t().contiguous().t(), p, None, out)
    with pytest.raises(ValueError, match="must be contiguous"):
        mg.run(x, p, None, torch.empty(4, 70, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bias must be"):
        mg.run(x, p, torch.zeros(71, dtype=torch.bfloat16), out)
    with pytest.raises(ValueError, match="unknown variant"):
        mg.run(x, p, None, out, variant=42)
    g64 = mg.repack(_weight("weight=int4,scale=fp16:g64", 72, 384, rng), torch.bfloat16)
    with pytest.raises(ValueError, match="not a multiple of the variant's K tile"):
        mg.run(x, g64, None, out, variant=0)
    with pytest.raises(ValueError, match="act-order"):
        mg.repack(dataclasses.replace(qw, k_perm=torch.arange(384)), torch.bfloat16)


def test_missing_library_or_symbols_say_how_to_build(monkeypatch, tmp_path):
    from cutlass_ext import native
    from humming_triton import backends
    monkeypatch.setenv("HT_NATIVE_LIB", str(tmp_path / "missing.so"))
    native._load.cache_clear()
    try:
        assert "python3 -m cutlass_ext.build" in mg.available()
        call = Call("quant_linear", ht.QuantScheme.parse("w4a16"), torch.bfloat16, 64, 256, 256)
        assert "cutlass_ext.build" in backends.get("cutlass").reason(call)
    finally:
        native._load.cache_clear()


def test_a_partial_build_offers_only_its_variants(monkeypatch):
    from humming_triton.kernels import families
    from humming_triton.kernels.families.cutlass_mixed import variant_of
    monkeypatch.setattr(mg, "available", lambda fmt=None: None)
    monkeypatch.setattr(mg, "built_variants", lambda fmt: [0, 3])
    call = Call("quant_linear", ht.QuantScheme.parse("w4a16"), torch.bfloat16, 256, 4096, 4096)
    assert {variant_of(c) for c in families.get("cutlass_mixed").candidates(call)} == {0, 3}


def test_a_table_pick_the_build_lacks_falls_to_the_next_candidate(monkeypatch):
    """A measured table tuned against a fuller build: dispatch skips the variant this library does not hold
    (and one the weight's group refuses) and takes the entry's next candidate, instead of failing at launch."""
    from humming_triton import dispatch
    from humming_triton.calls import Candidate, KernelConfig
    from humming_triton.capability import facts_for_sm
    from cutlass_ext import native
    monkeypatch.setattr(native, "unavailable", lambda: None)  # a library with variants 0 and 3 of every format
    monkeypatch.setattr(mg, "available", lambda fmt=None: None)
    monkeypatch.setattr(mg, "built_variants", lambda fmt: [0, 3])
    call = Call("quant_linear", ht.QuantScheme.parse("w4a16"), torch.bfloat16, 16, 8192, 8192,
                facts=facts_for_sm((9, 0)))
    pingpong = Candidate("cutlass", "cutlass_mixed", KernelConfig("cutlass_mixed", 16, 64, 128, 1, 1, 12, 0))
    built = Candidate("cutlass", "cutlass_mixed", KernelConfig("cutlass_mixed", 16, 128, 128, 1, 1, 12, 0))
    assert not dispatch._can_run(call, pingpong) and dispatch._can_run(call, built)
    from humming_triton.kernels import families
    fam = families.get("cutlass_mixed")
    assert "does not hold CUTLASS variant 7" in fam.config_reason(call, pingpong.config)
    g64 = Call("quant_linear", ht.QuantScheme.parse("weight=uint4,scale=bf16:g64,zero=int"), torch.bfloat16, 16,
               8192, 8192, facts=facts_for_sm((9, 0)))
    assert "not a multiple of the variant's K tile" in fam.config_reason(g64, built.config)
    table = {"quant_linear|w4a16|8192x8192|m16": {"candidates": [
        {**pingpong.to_json(), "us": 1.0}, {**built.to_json(), "us": 2.0}]}}
    monkeypatch.setattr(dispatch, "_auto_allowed", lambda name: True)
    assert dispatch._measured_choice(call, table, None) == built


def test_object_cache_key(tmp_path):
    """A cached object is found again for the same compile (wherever its output was meant to go), and a
    different define or a changed source makes a new one."""
    from cutlass_ext.build import SM90_SOURCE, cached_object, cutlass_command
    one = cutlass_command(SM90_SOURCE, Path("/a/x.o"), "90a", "nvcc", ("HT_SM90_FMT=0",))
    same = cutlass_command(SM90_SOURCE, Path("/b/x.o"), "90a", "/usr/bin/nvcc", ("HT_SM90_FMT=0",))
    other = cutlass_command(SM90_SOURCE, Path("/a/x.o"), "90a", "nvcc", ("HT_SM90_FMT=1",))
    assert cached_object(one, tmp_path) == cached_object(same, tmp_path) != cached_object(other, tmp_path)
    src = tmp_path / "src" / "k.cu"
    src.parent.mkdir()
    src.write_text("// v1")
    cmd = ["nvcc", "-c", str(src), "-o", "/a/k.o"]
    before = cached_object(cmd, tmp_path)
    src.write_text("// v2")
    assert cached_object(cmd, tmp_path) != before


def test_object_cache_key_is_portable(tmp_path):
    """The device reuses this machine's objects: a checkout and a CUTLASS package in other folders (same
    sources, same version) give the same key."""
    from cutlass_ext.build import cached_object
    for root in ("here", "there"):
        (tmp_path / root / "csrc").mkdir(parents=True)
        (tmp_path / root / "csrc" / "k.cu").write_text("// same")
    keys = {cached_object(["nvcc", f"-I/{site}/cutlass_library/source/include", "-DX=1", "-c",
                           str(tmp_path / root / "csrc" / "k.cu"), "-o", "/o/k.o"], tmp_path).name
            for root, site in (("here", "usr/lib/python3/site-packages"), ("there", "tmp/site"))}
    assert len(keys) == 1


def test_build_compiles_one_unit_per_format():
    from cutlass_ext.build import cutlass_command, sm90_formats, SM90_SOURCE
    assert sm90_formats() == sorted(mg.FORMATS)
    cmd = cutlass_command(SM90_SOURCE, Path("/tmp/x.o"), "90a", "nvcc", ("HT_SM90_FMT=3",))
    assert "-DHT_SM90_FMT=3" in cmd and "-gencode=arch=compute_90a,code=sm_90a" in cmd


def test_kernel_list_of_the_build():
    from cutlass_ext.build import parse_kernels
    pairs = parse_kernels("0,2:0-2/1:3,4")
    assert pairs == [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (2, 2), (1, 3), (1, 4)]
    assert parse_kernels("0:0/0:0,1") == [(0, 0), (0, 1)]  # named twice, built once
    with pytest.raises(ValueError, match="lacks"):
        parse_kernels("0:99")
    with pytest.raises(ValueError, match="FORMATS:VARIANTS"):
        parse_kernels("0,1")


# ---- CI: compile one kernel per weight family for sm_90a ---------------------------------------------------------

COMPILE_CHECK = {0: "int4 group", 2: "uint4 + zero", 4: "int8 channel", 6: "e4m3 channel", 10: "int4 bf16 scales",
                 11: "int4 bf16 scales, shuffled"}


def _cuobjdump():
    from cutlass_ext.build import cuobjdump
    return cuobjdump()


def test_sm90a_kernels_compile_to_wgmma(tmp_path, cutlass_nvcc):
    """One variant (128 weight rows x 16 tokens x 128 K, persistent) per weight family: nvcc compiles it against
    the nvidia-cutlass headers, the SASS holds register-sourced HGMMA of the activation type and no local-memory
    spills.  ~1.5 min per unit on one core, two at a time."""
    nvcc = cutlass_nvcc
    from cutlass_ext.build import SM90_SOURCE, cutlass_command
    one = tmp_path / "one_variant.cu"
    one.write_text("#define HT_SM90_VARIANTS(X, ...) X(0, Shape<_128 COMMA _16 COMMA _128>, Persistent, __VA_ARGS__)\n"
                   f'#include "{SM90_SOURCE}"\n')

    def compile_fmt(fmt):
        obj = tmp_path / f"fmt{fmt}.o"
        cmd = cutlass_command(one, obj, "90a", nvcc, (f"HT_SM90_FMT={fmt}",))
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        return fmt, obj, r, time.perf_counter() - t0

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(compile_fmt, COMPILE_CHECK))
    tool = _cuobjdump()
    assert tool, "no cuobjdump (Triton's bundled one, or the CUDA toolkit's) to read the SASS"
    for fmt, obj, r, took in results:
        assert r.returncode == 0, (COMPILE_CHECK[fmt], r.stderr[-3000:])
        print(f"sm_90a {COMPILE_CHECK[fmt]} (format {fmt}) compiled in {took:.0f} s")
        sass = subprocess.run([tool, "-sass", str(obj)], capture_output=True, text=True, timeout=600).stdout
        act = "BF16" if mg.FORMATS[fmt][1] == torch.bfloat16 else "F16"
        assert re.search(rf"HGMMA\.64x16x16\.F32\.{act}\b", sass), (fmt, set(re.findall(r"HGMMA\.\S+", sass)))
        res = subprocess.run([tool, "-res-usage", str(obj)], capture_output=True, text=True, timeout=600).stdout
        assert "LOCAL:0" in res and not re.search(r"LOCAL:[1-9]", res), (fmt, res)
        if fmt in mg.SHUFFLED:  # the point of the order: whole 32-bit shared loads, no byte loads to gather
            assert "LDS.U8" not in sass and re.search(r"\bLDS\b", sass), (fmt, set(re.findall(r"LDS\S*", sass)))


def test_shuffled_order_matches_cute(tmp_path):
    """``mg.shuffle``'s tiling against the layout the kernel is given: a host program prints
    ``tile_to_shape(ShuffleBlock, (N, K, 1))`` of csrc_sm90/mixed_gemm.cu at every (n, k) of a 48 x 32 weight."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (the CUDA toolkit): nothing to compile with")
    from cutlass_ext.build import SM90_SOURCE, cutlass_includes
    try:
        incs = [f"-I{d}" for d in cutlass_includes()]
    except RuntimeError as e:
        pytest.skip(str(e))
    text = SM90_SOURCE.read_text()
    block = re.search(r"using ShuffleBlock = [^;]+;", text).group(0)
    prog = tmp_path / "order.cu"
    prog.write_text("#include <cute/tensor.hpp>\n#include <cstdio>\nusing namespace cute;\n" + block + "\n"
                    "int main() { auto L = tile_to_shape(ShuffleBlock{}, make_shape(48, 32, 1));\n"
                    "  for (int n = 0; n < 48; ++n) for (int k = 0; k < 32; ++k) printf(\"%d\\n\", int(L(n, k, 0))); }\n")
    exe = tmp_path / "order"
    r = subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", *incs, str(prog), "-o", str(exe)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    offsets = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert sorted(offsets) == list(range(48 * 32))
    index = torch.arange(48 * 32).reshape(48, 32)
    for digit in range(3):  # each element's row-major index, one hex digit (one nibble) at a time
        codes = ((index >> (4 * digit)) & 15).to(torch.uint8)
        data = mg.shuffle(codes).reshape(-1)
        nibbles = torch.stack([data & 15, data >> 4], -1).reshape(-1)
        assert torch.equal(nibbles[torch.tensor(offsets)], codes.reshape(-1)), digit


# ---- the kernels on the GPU ------------------------------------------------------------------------------------

GPU_CASES = [(s, shape, dtype) for s in SCHEMES for shape in SHAPES[:2] + [(4096, 4096)]
             for dtype in (torch.bfloat16, torch.float16)
             if SCHEMES[s][dtype == torch.float16] is not None and _shape_ok(s, shape[1])]


@pytest.mark.gpu
@pytest.mark.parametrize("scheme,shape,dtype", GPU_CASES)
def test_kernel_matches_reference(scheme, shape, dtype, rng):
    from humming_triton.kernels import families
    why = mg.available()
    if why:
        pytest.fail(why)  # asked for GPU tests: a missing build is a failure, not a skip
    fam = families.get("cutlass_mixed")
    n, k = shape
    qw = _weight(scheme, n, k, rng).to("cuda")
    w_hat = ht.dequantize_weight(qw.to("cpu"))
    for m in (1, 7, 16, 100, 300):
        x = torch.randn(m, k, generator=rng).to(dtype)
        ref = ht.reference_linear(x, qw.to("cpu"), out_dtype=torch.float32).double()
        ref16 = ref - qw.bias.double().cpu() + qw.bias.to(dtype).double().cpu()
        call = Call("quant_linear", qw.scheme, dtype, m, n, k)
        assert fam.reason(call) is None
        for cfg in fam.candidates(call):
            out = poison_like(torch.empty(m, n, dtype=dtype, device="cuda"))
            y = fam.run(x.cuda(), x.cuda(), qw, qw.bias, dtype, cfg, out)
            assert y.data_ptr() == out.data_ptr()
            assert_linear_close(y.cpu(), ref16, x.float(), w_hat, dtype,
                                f"{scheme} {shape} {dtype} M={m} {cfg.describe()}")
        y = fam.run(x.cuda(), x.cuda(), qw, None, torch.float32, fam.candidates(call)[0], None)  # fp32 out, no bias
        assert_linear_close(y.cpu(), ref - qw.bias.double().cpu(), x.float(), w_hat, dtype, f"{scheme} fp32 out")


@pytest.mark.gpu
def test_backend_cutlass_through_the_op_and_graph_replay(rng):
    why = mg.available()
    if why:
        pytest.fail(why)
    qw = _weight("w4a16", 512, 1024, rng).to("cuda")
    x = torch.randn(16, 1024, generator=rng).to(torch.bfloat16).cuda()
    ref = ht.quant_linear(x, qw, backend="triton")
    y = ht.quant_linear(x, qw, backend="cutlass")
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2 * float(ref.abs().max()))
    g = torch.cuda.CUDAGraph()
    out = torch.empty_like(y)
    with torch.cuda.graph(g):
        out.copy_(ht.quant_linear(x, qw, backend="cutlass"))
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, y)


# ---- int4 with bf16 group scales (format 10, family cutlass_mixed_bf16s) -----------------------------------------

BF16S = ["w4a16", "weight=int4,scale=bf16:g128", "weight=int4,scale=fp32:g256"]


def _bf16s_family():
    from humming_triton.kernels import families
    return families.get("cutlass_mixed_bf16s")


BF16S_CASES = [(s, shape) for s in BF16S for shape in SHAPES[:2] + [(256, 4096)] if _shape_ok(s, shape[1])]


@pytest.mark.parametrize("scheme,shape", BF16S_CASES)
def test_bf16_scales_emulated_matches_reference(scheme, shape, rng):
    """Format 10 rounds the scale to bf16 and the product again: still within the bf16 GEMM's tolerance."""
    n, k = shape
    qw = _weight(scheme, n, k, rng)
    p = _bf16s_family().packed(qw, torch.bfloat16)
    assert p.fmt == 10 and p.scales.dtype == torch.bfloat16
    assert mg.repack(qw, torch.bfloat16).fmt == 0  # the exact format stays format_of's choice
    for m in (1, 33):
        x = torch.randn(m, k, generator=rng).to(torch.bfloat16)
        ref = ht.reference_linear(x, qw, out_dtype=torch.float32).double()
        got = mg.emulate(x, p, qw.bias.to(torch.bfloat16))
        ref16 = ref - qw.bias.double() + qw.bias.to(torch.bfloat16).double()
        assert_linear_close(got, ref16, x.float(), ht.dequantize_weight(qw), torch.bfloat16, f"{scheme} {shape}")


@pytest.mark.parametrize("scheme,dtype", [("w4a16", torch.float16), ("w8a16", torch.bfloat16),
                                          ("w4a16-asym", torch.bfloat16), ("weight=int4,scale=fp16:channel",
                                                                            torch.bfloat16)])
def test_bf16_scales_reasons(scheme, dtype):
    call = Call("quant_linear", ht.QuantScheme.parse(scheme), dtype, 16, 256, 1024, device_type="cpu")
    assert "int4 group scales with bf16 activations only" in (_bf16s_family().reason(call) or "")
    with pytest.raises(ValueError, match="no faster twin"):
        mg.repack(_weight("w8a16", 8, 256, torch.Generator().manual_seed(0)), torch.bfloat16, fmt=10)


def _family_matches_reference_on_gpu(fam, fmt, scheme, shape, rng):
    """Every candidate of a CUTLASS family on ``scheme``'s weight (bf16, odd shapes, M = 1 .. 300) against the
    reference, poisoned outputs, bias."""
    why = mg.available(fmt)
    if why:
        pytest.fail(why)  # asked for GPU tests: a missing build is a failure, not a skip
    dtype, (n, k) = torch.bfloat16, shape
    qw = _weight(scheme, n, k, rng).to("cuda")
    w_hat = ht.dequantize_weight(qw.to("cpu"))
    for m in (1, 7, 100, 300):
        x = torch.randn(m, k, generator=rng).to(dtype)
        ref = ht.reference_linear(x, qw.to("cpu"), out_dtype=torch.float32).double()
        ref16 = ref - qw.bias.double().cpu() + qw.bias.to(dtype).double().cpu()
        call = Call("quant_linear", qw.scheme, dtype, m, n, k)
        assert fam.reason(call) is None and fam.candidates(call)
        for cfg in fam.candidates(call):
            out = poison_like(torch.empty(m, n, dtype=dtype, device="cuda"))
            y = fam.run(x.cuda(), x.cuda(), qw, qw.bias, dtype, cfg, out)
            assert y.data_ptr() == out.data_ptr()
            assert_linear_close(y.cpu(), ref16, x.float(), w_hat, dtype, f"{scheme} {shape} M={m} {cfg.describe()}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES[:2] + [(4096, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_bf16_scales_kernel_matches_reference(shape, rng):
    _family_matches_reference_on_gpu(_bf16s_family(), 10, "w4a16", shape, rng)


# ---- format 11: format 10 on the shuffled weight order (family cutlass_mixed_shuffled) -----------------------------

def test_shuffle_places_each_lanes_fragment_in_32_contiguous_bits():
    """The shuffled order against the WGMMA A fragment as the PTX ISA defines it for m64nNk16 (16-bit A, one warp's
    16 rows): lane l holds a0 a1 at (l / 4, 2 (l % 4) + {0, 1}), a2 a3 eight rows down, a4 a5 eight columns right,
    a6 a7 both -- each lane's 8 values must occupy offsets 8 l .. 8 l + 7 in the order [0 2 4 6 1 3 5 7] (the
    value order CUTLASS's vectorized int4 -> bf16 converter takes); and the C++ ShuffleBlock has the same strides."""
    off = mg._block_offsets()
    for lane in range(32):
        for v in range(8):
            row = lane // 4 + 8 * ((v // 2) % 2)
            col = 2 * (lane % 4) + v % 2 + 8 * (v // 4)
            assert int(off[row, col]) == 8 * lane + [0, 4, 1, 5, 2, 6, 3, 7][v], (lane, v)
    assert sorted(off.reshape(-1).tolist()) == list(range(256))
    text = (ROOT / "cutlass_ext" / "csrc_sm90" / "mixed_gemm.cu").read_text()
    r0, r1, k0, k1, k2 = map(int, re.search(r"using ShuffleBlock = Layout<Shape<Shape<_8, _2>, Shape<_2, _4, _2>>, "
                                            r"Stride<Stride<_(\d+), _(\d+)>, Stride<_(\d+), _(\d+), _(\d+)>>>",
                                            text).groups())
    r = torch.arange(16).view(16, 1)
    k = torch.arange(16).view(1, 16)
    assert torch.equal(off, r0 * (r % 8) + r1 * (r // 8) + k0 * (k % 2) + k1 * ((k // 2) % 4) + k2 * (k // 8))


@pytest.mark.parametrize("n,k", [(16, 16), (48, 32), (256, 4096)])
def test_shuffle_round_trip_and_block_tiling(n, k, rng):
    """``unshuffle`` inverts ``shuffle``; block (r, c) starts at value 256 (r + c N / 16) (cute::tile_to_shape's
    order, checked against cute on the CPU when the compile check runs)."""
    codes = torch.randint(0, 16, (n, k), generator=rng, dtype=torch.uint8)
    data = mg.shuffle(codes)
    assert data.shape == (n, k // 2) and data.dtype == torch.uint8
    assert torch.equal(mg.unshuffle(data, n, k), codes)
    nibbles = torch.stack([data.reshape(-1) & 15, data.reshape(-1) >> 4], -1).reshape(-1)
    off = mg._block_offsets()
    for (i, j) in [(0, 0), (n - 1, k - 1), (n // 2, k // 3), (17 % n, 5)]:
        at = int(off[i % 16, j % 16]) + 256 * (i // 16 + (j // 16) * (n // 16))
        assert int(nibbles[at]) == int(codes[i, j]), (i, j)
    with pytest.raises(ValueError, match="whole 16 x 16 blocks"):
        mg.shuffle(codes[:8])


def _shuffled_family():
    from humming_triton.kernels import families
    return families.get("cutlass_mixed_shuffled")


@pytest.mark.parametrize("scheme,shape", [(s, shape) for s, shape in BF16S_CASES if shape[0] % 16 == 0])
def test_shuffled_emulated_matches_reference(scheme, shape, rng):
    n, k = shape
    qw = _weight(scheme, n, k, rng)
    p = _shuffled_family().packed(qw, torch.bfloat16)
    assert p.fmt == 11 and p.w.shape == (n, k // 2)
    assert not torch.equal(p.w, qw.data.contiguous().view(torch.uint8))  # reordered, not the canonical bytes
    p10 = _bf16s_family().packed(qw, torch.bfloat16)
    x = torch.randn(33, k, generator=rng).to(torch.bfloat16)
    assert torch.equal(mg.emulate(x, p), mg.emulate(x, p10))  # the same arithmetic as format 10


def test_shuffled_reasons():
    call = Call("quant_linear", ht.QuantScheme.parse("w4a16"), torch.bfloat16, 16, 200, 1024, device_type="cpu")
    assert "multiple of 16" in (_shuffled_family().reason(call) or "")
    assert _shuffled_family().reason(dataclasses.replace(call, n=208)) is None
    with pytest.raises(ValueError, match="16-row blocks"):
        mg.repack(_weight("w4a16", 200, 256, torch.Generator().manual_seed(0)), torch.bfloat16, fmt=11)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(208, 1024), (4096, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_shuffled_kernel_matches_reference(shape, rng):
    _family_matches_reference_on_gpu(_shuffled_family(), 11, "w4a16", shape, rng)


@pytest.mark.gpu
def test_shuffled_kernel_equals_format_10(rng):
    """Same arithmetic, another weight order: the two kernels agree to the last bit at every variant both have."""
    fam10, fam11 = _bf16s_family(), _shuffled_family()
    qw = _weight("w4a16", 512, 2048, rng).to("cuda")
    for m in (1, 64, 256):
        x = torch.randn(m, 2048, generator=rng).to(torch.bfloat16).cuda()
        call = Call("quant_linear", qw.scheme, torch.bfloat16, m, 512, 2048)
        for cfg in fam11.candidates(call):
            y11 = fam11.run(x, x, qw, None, torch.bfloat16, cfg, None)
            y10 = fam10.run(x, x, qw, None, torch.bfloat16, dataclasses.replace(cfg, family=fam10.name), None)
            torch.testing.assert_close(y11, y10, rtol=0, atol=0, msg=f"M={m} {cfg.describe()}")


# ---- MXFP4 on the e4m3 kernels (family cutlass_mx_e4m3) ---------------------------------------------------------

def _mx_family():
    from humming_triton.kernels import families
    return families.get("cutlass_mx_e4m3")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_mx_e4m3_emulated_matches_reference(shape, dtype, rng):
    """The e4m3 rows the family hands the kernel, read back as CUTLASS reads format 6 / 7, are the MXFP4 weight."""
    n, k = shape
    qw = _weight("mxfp4", n, k, rng)
    p = _mx_family().packed(qw, dtype)
    assert p.fmt == (6 if dtype == torch.bfloat16 else 7) and p.group == 0
    assert _mx_family().packed(qw, dtype) is p  # cached on the weight
    for m in (1, 33):
        x = torch.randn(m, k, generator=rng).to(dtype)
        ref = ht.reference_linear(x, qw, out_dtype=torch.float32).double()
        got = mg.emulate(x, p, qw.bias.to(dtype))
        ref16 = ref - qw.bias.double() + qw.bias.to(dtype).double()
        assert_linear_close(got, ref16, x.float(), ht.dequantize_weight(qw), dtype, f"mxfp4 {shape} M={m}")


def test_mx_e4m3_wide_rows_have_no_view(rng):
    """A row whose block exponents span more than 14 binades is no e4m3 row: the family says so (and its run
    would take dequant_mm)."""
    qw = _weight("mxfp4", 8, 256, rng)
    scales = qw.scales.clone()
    scales[0, 0], scales[0, 1] = 100, 120  # 20 binades apart in row 0
    wide = dataclasses.replace(qw, scales=scales, cache={})
    why = _mx_family().packed(wide, torch.bfloat16)
    assert isinstance(why, str) and "binades" in why


@pytest.mark.parametrize("scheme,dtype,why", [
    ("nvfp4", torch.bfloat16, "converts MXFP4"), ("w4a16", torch.bfloat16, "converts MXFP4"),
    ("w4a8-mxfp4", torch.bfloat16, "quantizes its activations"), ("mxfp4", torch.float32, "bf16 / fp16 only")])
def test_mx_e4m3_reasons(scheme, dtype, why):
    call = Call("quant_linear", ht.QuantScheme.parse(scheme), dtype, 16, 256, 1024, device_type="cpu")
    got = _mx_family().reason(call)
    assert got is not None and why in got, got


def test_mx_e4m3_shape_rule_and_cpu_call():
    mx = ht.QuantScheme.parse("mxfp4")
    assert "N=100" in _mx_family().reason(Call("quant_linear", mx, torch.bfloat16, 16, 100, 1024, device_type="cpu"))
    assert _mx_family().reason(Call("quant_linear", mx, torch.bfloat16, 16, 256, 1024, device_type="cpu")) is None


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES[:2] + [(4096, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_mx_e4m3_kernel_matches_reference(shape, rng):
    _family_matches_reference_on_gpu(_mx_family(), 6, "mxfp4", shape, rng)
