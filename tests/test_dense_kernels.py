"""Triton dense WnA16 kernels against the torch reference: every kernel family x every weight element type x
odd M/N/K.  On CPU they run under TRITON_INTERPRET=1 (set by conftest); with `pytest -m gpu` on CUDA."""
import pytest
import torch

import humming_triton as ht
from humming_triton.kernels import configs
from humming_triton.testing import assert_linear_close, poison_like, zero_offset

# (weight element type, scale spec, zero kind): every element-type family and every scale kind
FORMATS = [
    ("int4", "fp16:g128", "none"), ("uint4", "fp16:g64", "int"), ("int8", "fp16:channel", "none"),
    ("uint8", "bf16:g32", "int"), ("int2", "fp16:g32", "none"), ("uint2", "fp16:g128", "int"),
    ("uint3", "fp16:g32", "int"), ("int3", "fp16:g64", "none"), ("uint1", "fp16:g32", "float"),
    ("int5", "fp32:channel", "none"), ("uint6", "fp16:g32", "int"), ("int7", "bf16:g64", "none"),
    ("uint4", "fp16:g32", "float"), ("int1", "fp16:tensor", "none"),
    ("e2m1", "e8m0:g32", "none"), ("e2m1", "e4m3fn:g16+global", "none"), ("int4", "e8m0:g32", "none"),
    ("e2m3", "fp16:g32", "none"), ("e3m2", "bf16:g64", "none"), ("e4m3fn", "fp32:channel", "none"),
    ("e4m3fn", "fp32:b64x32", "none"), ("e5m2", "fp16:g128", "none"), ("e3m3", "fp16:g32", "none"),
    ("e2m2", "fp16:channel", "none"), ("e4m2fn", "fp32:g64", "none"), ("e3m4", "fp16:g32", "none"),
]
FAMILIES = {
    # K tile below the group size (scale per tile), and above it (several groups per tile)
    "gemv": lambda m: configs.DenseConfig("gemv", configs.m_bucket(min(m, 8)), 16, 256, 1, num_stages=1),
    "gemv_splitk": lambda m: configs.DenseConfig("gemv", configs.m_bucket(min(m, 8)), 16, 64, 3, num_stages=1),
    "gemv_words": lambda m: configs.DenseConfig("gemv_words", 1, 16, 256, 1, num_stages=1),
    "gemv_words_prefetch_splitk": lambda m: configs.DenseConfig("gemv_words", 1, 8, 128, 2, num_stages=2),
    # several activation rows per program (a partial last row block at M = 5 and 19)
    "gemv_words_rows": lambda m: configs.DenseConfig("gemv_words", 4, 8, 256, 1, num_stages=1),
    "gemv_words_rows_prefetch_splitk": lambda m: configs.DenseConfig("gemv_words", 2, 4, 128, 2, num_stages=2),
    "tiled": lambda m: configs.DenseConfig("tiled", 16, 32, 64, 1, 2),
    "tiled_wide_k": lambda m: configs.DenseConfig("tiled", 32, 16, 256, 1, 2),
    "tiled_splitk": lambda m: configs.DenseConfig("tiled", 16, 16, 64, 2, 2),
    # tokens on the MMA's N side: K tile below the group and above it, and split-K
    "swapab": lambda m: configs.DenseConfig("swapab", 16, 32, 64, 1, 8),
    "swapab_wide_k_splitk": lambda m: configs.DenseConfig("swapab", 16, 16, 256, 2, 8),
    # above 16 tokens: 32 / 64-token tiles (a partial last tile at M = 19), the scale before the dot
    "swapab_wide_m": lambda m: configs.DenseConfig("swapab", 32, 32, 64, 1, 8),
    "swapab_wide_m_k_splitk": lambda m: configs.DenseConfig("swapab", 64, 16, 256, 2, 8),
    "dequant_mm": lambda m: configs.DenseConfig("dequant_mm", 1, 16, 64),
}
SHAPES = [(1, 37, 384), (5, 64, 128), (19, 100, 640)]  # (M, N, K): odd N, K not a multiple of the K tile


def _scheme(fmt):
    w, sc, z = fmt
    return ht.QuantScheme.parse(f"weight={w},scale={sc},zero={z}")


def _run_case(fmt, family, shape, dtype, rng, device="cpu", cfg=None):
    m, n, k = shape
    scheme = _scheme(fmt)
    w = torch.randn(n, k, generator=rng)
    qw = ht.quantize_weight(w, scheme, bias=torch.randn(n, generator=rng)).to(device)
    x = torch.randn(m, k, generator=rng).to(dtype).to(device)
    from humming_triton.kernels.dense import triton_linear
    cfg = cfg or FAMILIES[family](m)
    cfg = configs.DenseConfig(**{**cfg.__dict__, "block_k": configs.fit_block_k(cfg.block_k, scheme.group_k(k), k,
                                                                                 scheme.bits)})
    out = poison_like(torch.empty(m, n, dtype=dtype, device=device))
    y = triton_linear(x, qw, config=cfg, out=out)
    assert y.data_ptr() == out.data_ptr()
    ref = ht.reference_linear(x.cpu(), qw.to("cpu"), out_dtype=torch.float32).double()
    w_hat = ht.dequantize_weight(qw.to("cpu"))
    mma = torch.float32 if family.startswith("gemv") else dtype
    # the word-major GEMV subtracts zero * scale * sum(x) apart from the codes' sum (testing.zero_offset)
    offset = zero_offset(qw.to("cpu")) if family.startswith("gemv") else None
    assert_linear_close(y.cpu(), ref, x.cpu().float(), w_hat, mma, f"{scheme} {family} {shape} {dtype}", offset)


# every format on every family; the odd shapes rotate over the pairs so each (format, family) sees one of them
# and each shape meets every format and every family
CASES = [(fmt, fam, SHAPES[(i + j) % len(SHAPES)]) for i, fmt in enumerate(FORMATS) for j, fam in enumerate(FAMILIES)]


@pytest.mark.interpret
@pytest.mark.parametrize("fmt,family,shape", CASES,
                         ids=["-".join(f) + f"-{fam}-" + "x".join(map(str, sh)) for f, fam, sh in CASES])
def test_dense_kernel_interpreted(fmt, family, shape, rng):
    _run_case(fmt, family, shape, torch.float16, rng)


@pytest.mark.interpret
@pytest.mark.parametrize("family", ["gemv", "tiled", "swapab"])
@pytest.mark.parametrize("fmt", [("int4", "fp16:g128", "none"), ("e2m1", "e4m3fn:g16+global", "none")],
                         ids=lambda f: "-".join(f))
def test_dense_kernel_bf16_interpreted(fmt, family, rng):
    _run_case(fmt, family, (9, 48, 256), torch.bfloat16, rng)


@pytest.mark.interpret
@pytest.mark.parametrize("family", ["swapab_wide_m", "swapab_wide_m_k_splitk"])
@pytest.mark.parametrize("fmt", FORMATS[::2], ids=lambda f: "-".join(f))
def test_swapab_token_tiles_interpreted(fmt, family, rng):
    """More than 16 tokens: several token tiles, the last one partial (M = 40 with 32- and 64-token tiles)."""
    _run_case(fmt, family, (40, 48, 384), torch.float16, rng)


@pytest.mark.interpret
@pytest.mark.parametrize("m", [0, 1, 8, 9, 70])
def test_auto_dispatch_and_odd_m(m, rng):
    qw = ht.quantize_weight(torch.randn(40, 256, generator=rng), "w4a16")
    x = torch.randn(2, m, 256, generator=rng).half()
    y = ht.quant_linear(x, qw, backend="triton")
    assert y.shape == (2, m, 40) and y.dtype == torch.float16
    ref = ht.reference_linear(x, qw, out_dtype=torch.float32).double()
    if m:
        assert_linear_close(y, ref, x.float(), ht.dequantize_weight(qw), torch.float16, "auto")


@pytest.mark.interpret
@pytest.mark.parametrize("fmt", FORMATS[::3], ids=lambda f: "-".join(f))
def test_triton_dequantize_is_exact(fmt, rng):
    from humming_triton.kernels.dense import triton_dequantize
    qw = ht.quantize_weight(torch.randn(37, 384, generator=rng), _scheme(fmt))
    assert torch.equal(triton_dequantize(qw, torch.float32), ht.dequantize_weight(qw))


def test_unsupported_schemes_are_named(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    qw = ht.quantize_weight(torch.randn(16, 128), "weight=e2m1,scale=e8m0:g32,act=e2m1/e4m3fn:g16")
    with pytest.raises(RuntimeError, match="e2m1/e4m3fn:g16 has no Triton kernel yet"):
        ht.quant_linear(torch.randn(2, 128), qw, backend="triton")


# --- on the GPU: every WnA16 preset x {fp16, bf16} x odd shapes ------------------------------------------------
GPU_SHAPES = [(1, 4096, 4096), (7, 1000, 2048), (33, 4100, 1024), (1024, 768, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("preset", list(ht.formats.WEIGHT_ONLY_PRESETS))
def test_wna16_presets_on_gpu(preset, dtype, shape, rng):
    m, n, k = shape
    qw = ht.quantize_weight(torch.randn(n, k, generator=rng) * 0.02, preset).to("cuda")
    x = (torch.randn(m, k, generator=rng)).to(dtype).cuda()
    out = poison_like(torch.empty(m, n, dtype=dtype, device="cuda"))
    from humming_triton.kernels.dense import triton_linear
    y = triton_linear(x, qw, out=out)
    torch.cuda.synchronize()
    qc = qw.to("cpu")
    ref = ht.reference_linear(x.cpu(), qc, out_dtype=torch.float32).double()
    assert_linear_close(y.cpu(), ref, x.cpu().float(), ht.dequantize_weight(qc), dtype, f"{preset} {shape}")


GPU_FAMILIES = ("gemv", "gemv_splitk", "gemv_words", "gemv_words_prefetch_splitk", "gemv_words_rows",
                "gemv_words_rows_prefetch_splitk", "tiled", "tiled_splitk", "swapab", "swapab_wide_k_splitk",
                "swapab_wide_m", "swapab_wide_m_k_splitk", "dequant_mm")
GPU_CASES = [(fmt, fam, (SHAPES + [(3, 300, 512)])[(i + j) % 4]) for i, fmt in enumerate(FORMATS)
             for j, fam in enumerate(GPU_FAMILIES)]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,family,shape", GPU_CASES,
                         ids=["-".join(f) + f"-{fam}-" + "x".join(map(str, sh)) for f, fam, sh in GPU_CASES])
def test_every_format_family_on_gpu(fmt, family, shape, rng):
    _run_case(fmt, family, shape, torch.bfloat16, rng, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("m,pick", [(300, 0), (300, -1), (40, 0), (40, -1)], ids=["300-first", "300-last", "40-first",
                                                                                "40-last"])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: "-".join(f))
def test_swapab_token_tiles_on_gpu(fmt, m, pick, rng):
    """The wide token tiles the tuner times (the family's own candidates for this format and M) with tails."""
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    call = Call("quant_linear", _scheme(fmt), torch.bfloat16, m, 1000, 2048)
    _run_case(fmt, "swapab", (m, 1000, 2048), torch.bfloat16, rng, device="cuda",
              cfg=families.get("swapab").candidates(call)[pick])


@pytest.mark.interpret
@pytest.mark.parametrize("family", ["gemv", "tiled", "swapab", "dequant_mm"])
def test_fp32_and_strided_activations(family, rng):
    """fp32 activations take the exact (ieee) dot; a strided / 3-D x is handled without the caller copying."""
    from humming_triton.kernels.dense import triton_linear
    qw = ht.quantize_weight(torch.randn(40, 256, generator=rng), "w4a16")
    cfg = FAMILIES[family](3)
    x = torch.randn(2, 3, 512, generator=rng)[..., ::2]  # non-contiguous last dim
    y = triton_linear(x, qw, config=cfg)
    assert y.shape == (2, 3, 40) and y.dtype == torch.float32
    ref = ht.reference_linear(x.contiguous(), qw, out_dtype=torch.float32).double()
    assert_linear_close(y, ref, x.float(), ht.dequantize_weight(qw), torch.float32, family)
    xb = torch.randn(5, 2 * 256, generator=rng).half()[:, :256]  # row stride != K
    yb = triton_linear(xb, qw, config=FAMILIES[family](5))
    refb = ht.reference_linear(xb.contiguous(), qw, out_dtype=torch.float32).double()
    assert_linear_close(yb, refb, xb.float(), ht.dequantize_weight(qw), torch.float16, family + " row stride")


def _launch_replay_case(preset, device, rng):
    """Calls that share a signature replay one cached launch; M, alignment, bias or out change it."""
    from humming_triton.kernels.dense import triton_linear
    n, k = 300, 1024
    qw = ht.quantize_weight(torch.randn(n, k, generator=rng) * 0.05, preset).to(device)
    qc = qw.to("cpu")
    w_hat = ht.dequantize_weight(qc)
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    bias = torch.randn(n, generator=rng).to(dtype).to(device)
    buf = torch.randn(40 * k + 8, generator=rng).to(dtype).to(device)
    # (M, element offset of x in buf: 1 misaligns it by 2 bytes, bias passed?, out given?)
    calls = [(1, 0, False, False), (1, 0, False, False), (3, 0, False, False), (1, 1, False, False),
             (3, 0, True, False), (1, 0, False, True), (3, 0, False, False), (1, 1, False, False),
             (24, 0, False, False), (24, 0, False, False)]  # M = 24: the tiled family (a 2-axis grid)
    for m, off, with_bias, with_out in calls:
        buf.copy_(torch.randn(buf.shape, generator=rng).to(dtype))  # fresh values each call, same storage
        x = buf[off:off + m * k].view(m, k)
        out = poison_like(torch.empty(m, n, dtype=dtype, device=device)) if with_out else None
        y = triton_linear(x, qw, bias=bias if with_bias else None, out=out)
        if out is not None:
            assert y.data_ptr() == out.data_ptr()
        ref = ht.reference_linear(x.cpu(), qc, bias=bias.cpu() if with_bias else None,
                                  out_dtype=torch.float32).double()
        # the word-major GEMV runs M = 1 (it subtracts zero * scale * sum(x) apart); the tiled one M = 3 and 24
        offset = None if preset == "w3a16" or m > 1 else zero_offset(qc)
        mma = torch.float32 if m == 1 else dtype
        assert_linear_close(y.cpu(), ref, x.cpu().float(), w_hat, mma,
                            f"{preset} M={m} offset={off} bias={with_bias} out={with_out}", offset)
    return qw.cache["triton"]["launches"]


@pytest.mark.interpret
def test_launch_cache_keys(rng):
    launches = _launch_replay_case("w4a16", "cpu", rng)
    # (1,0), (3,0), (1,1), (3,0,bias), (1,0,out), (24,0): six signatures; no compiled kernel under the interpreter
    assert len(launches) == 6 and all(launch.runner is None for launch in launches.values())


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["w4a16", "w4a16-asym", "mxfp4", "nvfp4", "w3a16", "w8a16"])
def test_launch_replay_on_gpu(preset, rng, monkeypatch):
    monkeypatch.setenv("HUMMING_TRITON_LAUNCH_REPLAY", "1")
    launches = _launch_replay_case(preset, "cuda", rng)
    assert len(launches) == 6 and all(launch.runner is not None for launch in launches.values())


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["gemv", "gemv_words", "tiled", "swapab"])
def test_split_k_is_deterministic_on_gpu(family, rng):
    """Split-K reduces its partials in one launch, in split order (decode.store_output): the same call gives the
    same bits every time (fp32 atomics did not), with bias, and matches the reference."""
    from humming_triton.kernels.dense import triton_linear
    n, k = 520, 4096
    qw = ht.quantize_weight(torch.randn(n, k, generator=rng) * 0.05, "w4a16",
                            bias=torch.randn(n, generator=rng)).to("cuda")
    x = torch.randn(5, k, generator=rng).to(torch.bfloat16).cuda()
    bm = {"gemv": 8, "gemv_words": 4, "tiled": 16, "swapab": 16}[family]
    cfg = configs.DenseConfig(family, bm, 64 if family in ("tiled", "swapab") else 8, 128, 8, 8, 4, 3)
    outs = [triton_linear(x, qw, config=cfg) for _ in range(4)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    ref = ht.reference_linear(x.cpu(), qw.to("cpu"), out_dtype=torch.float32).double()
    mma = torch.float32 if family.startswith("gemv") else torch.bfloat16
    offset = zero_offset(qw.to("cpu")) if family == "gemv_words" else None
    assert_linear_close(outs[0].cpu(), ref, x.cpu().float(), ht.dequantize_weight(qw.to("cpu")), mma, family, offset)
