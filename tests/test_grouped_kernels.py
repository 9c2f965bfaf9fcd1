"""Triton grouped (MoE) GEMM against the torch reference: formats x odd shapes x uneven (and empty) experts.
CPU: interpreter; `pytest -m gpu` on CUDA."""
import pytest
import torch

import humming_triton as ht
from humming_triton.testing import assert_linear_close, poison_like

FORMATS = ["w4a16", "w4a16-asym", "w3a16", "w8a16", "mxfp4", "nvfp4", "w8a16-fp8-block", "w1a16",
           "weight=e3m2,scale=bf16:g64,zero=none"]
# activation-quantized schemes: x is quantized first, then fp8 / int8 / bf16 (decoded e2m1) tiles
ACT_FORMATS = ["w8a8-fp8", "w8a8-fp8-block", "w4a8-mxfp4", "w8a8-int8", "w4a8-int8", "w4a4-nvfp4", "w4a4-mxfp4", "w8a8-mxfp8", "w4a8-mx"]


def _case(scheme, counts, n, k, dtype, rng, device="cpu", block_m=None, config=None):
    """Quantized (and checked) on ``device``: on the GPU the CPU-side work would dominate the test."""
    e = len(counts)
    qw = ht.quantize_weight(torch.randn(e, n, k, generator=rng).to(device), scheme,
                            bias=torch.randn(e, n, generator=rng).to(device))
    offsets = torch.zeros(e + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(counts), 0)
    x = torch.randn(int(offsets[-1]), k, generator=rng).to(dtype).to(device)
    from humming_triton.kernels.grouped import triton_grouped_linear
    out = poison_like(torch.empty(x.shape[0], n, dtype=dtype, device=device))
    y = triton_grouped_linear(x, qw, offsets.to(device), out=out, block_m=block_m, config=config)
    ref = ht.reference_grouped_linear(x, qw, offsets.to(device), out_dtype=torch.float32).double().cpu()
    w_hat = ht.dequantize_weight(qw).cpu()
    act = qw.scheme.act
    mma = dtype
    if act is not None:  # the tolerance is about the activation the GEMM multiplies: the quantized one
        x = ht.dequantize_activation(ht.quantize_activation(x, act, qw.input_scale))
        # fp8 x fp8 / int8 x int8 products are exact; e2m1 activations meet the weight in a bf16 MMA
        mma = torch.bfloat16 if str(act.dtype) == "e2m1" else torch.float32
    # the tolerance of each row uses its own expert's weight
    for i in range(e):
        rows = slice(int(offsets[i]), int(offsets[i + 1]))
        if counts[i]:
            assert_linear_close(y[rows].cpu(), ref[rows], x[rows].cpu().float(), w_hat[i], mma,
                                f"{scheme} expert {i}")


@pytest.mark.interpret
@pytest.mark.parametrize("scheme", FORMATS)
def test_grouped_kernel_interpreted(scheme, rng):
    # uneven experts, one empty, one spanning several row tiles; odd N, K not a multiple of the K tile
    _case(scheme, [3, 0, 21, 1, 5], 37, 384, torch.float16, rng, block_m=16)


SPLIT = [("w4a16", 3), ("mxfp4", 2), ("w8a8-fp8", 4), ("w3a16", 2)]


@pytest.mark.interpret
@pytest.mark.parametrize("scheme,split", SPLIT)
def test_grouped_split_k_interpreted(scheme, split, rng):
    """Decode-sized batches split K (one launch, partials reduced in split order: decode.store_output)."""
    from humming_triton.calls import KernelConfig
    _case(scheme, [2, 0, 5, 1], 40, 640, torch.float16, rng, config=KernelConfig("grouped", 16, 32, 128, split, 8, 4, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("scheme,split", SPLIT)
def test_grouped_split_k_on_gpu(scheme, split, rng):
    from humming_triton.calls import KernelConfig
    _case(scheme, [1, 0, 3, 1, 0, 2, 9, 1], 300, 2048, torch.bfloat16, rng, "cuda",
          config=KernelConfig("grouped", 16, 64, 128, split, 8, 4, 3))


# (rows per tile, weight rows, K tile) of grouped_swapab (a 32-wide K tile: not offered, still correct)
SWAP = [(16, 32, 128), (32, 16, 64), (64, 32, 64), (32, 32, 32)]


@pytest.mark.interpret
@pytest.mark.parametrize("tile", SWAP, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("scheme", FORMATS)
def test_grouped_swapab_interpreted(scheme, tile, rng):
    """The swap-AB loop: experts spanning several row tiles (partial last tiles), one empty; 16-row tiles keep
    the scale on the partial product, wider ones scale the weight before the dot."""
    from humming_triton.calls import KernelConfig
    bm, bn, bk = tile
    _case(scheme, [3, 0, 70, 1, 33], 37, 384, torch.float16, rng,
          config=KernelConfig("grouped_swapab", bm, bn, bk, 1, 8, 4, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("rows,pick", [(10, 0), (150, 0), (150, -1), (400, -1)])
@pytest.mark.parametrize("scheme", FORMATS)
def test_grouped_swapab_on_gpu(scheme, rows, pick, rng):
    """The family's own candidates (``grouped_swapab``) for ``rows`` routed rows per expert on average."""
    from humming_triton.calls import Call
    from humming_triton.kernels import families
    counts = [int(c) for c in torch.randint(0, 2 * rows, (16,), generator=rng)]
    counts[3] = 0
    n, k = 1536, 2048 if "g64" not in scheme else 1024
    call = Call("grouped_linear", ht.QuantScheme.parse(scheme), torch.bfloat16, sum(counts), n, k, experts=16)
    _case(scheme, counts, n, k, torch.bfloat16, rng, device="cuda",
          config=families.get("grouped_swapab").candidates(call)[pick])


def test_grouped_swapab_refuses_quantized_activations(monkeypatch, rng):
    from humming_triton.calls import KernelConfig
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="16-bit activations"):
        _case("w8a8-fp8", [2, 3], 32, 128, torch.float16, rng,
              config=KernelConfig("grouped_swapab", 16, 32, 128, 1, 8, 4, 2))


@pytest.mark.interpret
@pytest.mark.parametrize("scheme", ACT_FORMATS)
def test_grouped_quantized_activations_interpreted(scheme, rng):
    _case(scheme, [3, 0, 21, 1, 5], 37, 384, torch.float16, rng)
    if scheme.startswith(("w8a8-fp8", "w4a8")):  # 64-row tiles: fp8 codes on a bf16 MMA (ACT_KIND 5)
        _case(scheme, [70, 0, 3], 24, 256, torch.bfloat16, rng, block_m=64)


def _act_order_case(per_expert, device, rng, counts=(3, 0, 21, 1, 5), n=37, k=384, config=None):
    """GPTQ act-order experts: the stored columns are permuted ([K] shared or [E, K] per expert); the kernel
    gathers x through k_perm and must match the reference on the logical weight.  ``config``: a Triton grouped
    config to run (else ``grouped_linear``'s own choice)."""
    import dataclasses
    e = len(counts)
    stored = ht.quantize_weight(torch.randn(e, n, k, generator=rng), "w4a16")
    perm = torch.stack([torch.randperm(k, generator=rng) for _ in range(e)]) if per_expert else \
        torch.randperm(k, generator=rng)
    qw = dataclasses.replace(stored, k_perm=perm, cache={}).to(device)
    offsets = torch.zeros(e + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(counts), 0)
    x = torch.randn(int(offsets[-1]), k, generator=rng).half().to(device)
    if config is None:
        y = ht.grouped_linear(x, qw, offsets.to(device), backend="triton")
    else:
        from humming_triton.kernels.grouped import triton_grouped_linear
        y = triton_grouped_linear(x, qw, offsets.to(device), config=config)
    qc = qw.to("cpu")
    ref = ht.grouped_linear(x.cpu(), qc, offsets, out_dtype=torch.float32, backend="reference").double()
    w_hat = ht.dequantize_weight(qc)
    assert not torch.allclose(w_hat, ht.dequantize_weight(stored))  # the permutation matters
    for i in range(e):
        rows = slice(int(offsets[i]), int(offsets[i + 1]))
        if counts[i]:
            assert_linear_close(y[rows].cpu(), ref[rows], x[rows].cpu().float(), w_hat[i], torch.float16,
                                f"act-order expert {i}")


@pytest.mark.interpret
@pytest.mark.parametrize("per_expert", [False, True], ids=["shared_perm", "per_expert_perm"])
def test_grouped_act_order_interpreted(per_expert, rng):
    _act_order_case(per_expert, "cpu", rng)


@pytest.mark.interpret
@pytest.mark.parametrize("bm", [16, 32])
def test_grouped_swapab_act_order_interpreted(bm, rng):
    """The swap-AB loop gathers x through k_perm too (16-row tiles: scale on the partial; 32: on the weight)."""
    from humming_triton.calls import KernelConfig
    _act_order_case(True, "cpu", rng, counts=(3, 0, 40, 1, 5),
                    config=KernelConfig("grouped_swapab", bm, 16, 64, 1, 8, 4, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("per_expert", [False, True], ids=["shared_perm", "per_expert_perm"])
def test_grouped_act_order_on_gpu(per_expert, rng):
    _act_order_case(per_expert, "cuda", rng, counts=[int(c) for c in torch.randint(0, 40, (16,), generator=rng)],
                    n=1536, k=2048)


@pytest.mark.interpret
def test_grouped_bf16_and_api(rng):
    _case("w4a16", [2, 9], 48, 256, torch.bfloat16, rng)
    qw = ht.quantize_weight(torch.randn(3, 32, 128, generator=rng), "w4a16")
    offsets = torch.tensor([0, 2, 2, 5])
    x = torch.randn(5, 128, generator=rng).half()
    y = ht.grouped_linear(x, qw, offsets, backend="triton")
    assert ht.last_backend("grouped_linear") == "triton"
    ref = ht.grouped_linear(x, qw, offsets, out_dtype=torch.float32, backend="reference")
    assert ht.last_backend("grouped_linear") == "reference"
    ht.grouped_linear(x, qw, offsets)
    assert ht.last_backend("grouped_linear") == "triton"  # auto: the kernel (here interpreted; on CUDA compiled)
    assert torch.allclose(y.float(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scheme", FORMATS + ACT_FORMATS)
def test_grouped_kernel_on_gpu(scheme, dtype, rng):
    counts = [int(c) for c in torch.randint(0, 40, (16,), generator=rng)]
    counts[3] = 0
    _case(scheme, counts, 1536, 2048 if "g64" not in scheme else 1024, dtype, rng, device="cuda")


@pytest.mark.interpret
@pytest.mark.parametrize("activation,scheme", [("silu", "w4a16"), ("swiglu_oai", "mxfp4"), ("silu", "nvfp4"),
                                               ("silu", "w8a8-fp8"), ("swiglu_oai", "w4a8-mxfp4"),
                                               ("silu", "w4a4-nvfp4")])
@pytest.mark.parametrize("backend", ["triton", "auto"])
def test_fused_moe_triton_matches_reference(activation, scheme, backend, rng):
    t, h, inter, e, topk = 7, 128, 128, 6, 2
    w13 = ht.quantize_weight(torch.randn(e, 2 * inter, h, generator=rng) / 8, scheme,
                             bias=torch.randn(e, 2 * inter, generator=rng))
    w2 = ht.quantize_weight(torch.randn(e, h, inter, generator=rng) / 8, scheme)
    x = torch.randn(t, h, generator=rng).half()
    wts, ids = torch.topk(torch.softmax(torch.randn(t, e, generator=rng), -1), topk)
    y = ht.fused_moe(x, w13, w2, wts, ids, activation=activation, backend=backend)
    assert ht.last_backend("fused_moe") == "triton"
    # quantized activations: the reference in x's dtype too, so that the intermediate activation is rounded
    # the same way before the down GEMM quantizes it (a float32 one would move a few codes across a midpoint)
    xr = x.float() if w13.scheme.act is None else x
    ref = ht.fused_moe(xr, w13, w2, wts, ids, activation=activation, backend="reference").double()
    # the same math except fp16 MMA operands (u = 2^-11) in two GEMMs and the fp16 output: a few u in norm;
    # a routing or scaling mistake is O(1)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 16 * 2.0 ** -11
    from humming_triton.reference import route
    order, offsets = route(ids, e)
    assert offsets[-1] == t * topk and torch.equal(ids.reshape(-1)[order], ids.reshape(-1).sort(stable=True).values)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 7, 300])
@pytest.mark.parametrize("activation,scheme", [("silu", "w4a16"), ("swiglu_oai", "mxfp4"), ("silu", "nvfp4"),
                                               ("silu", "w8a16")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", ["triton", "auto"])
def test_fused_moe_on_gpu(activation, scheme, tokens, dtype, backend, rng):
    """Qwen3-30B-A3B-like routing (64 experts, top-8) at decode and prefill sizes, vs the float64 reference;
    ``triton``: Triton's grouped tiles, ``auto``: each grouped GEMM the measured table's choice (the native decode
    kernel at a few rows per expert)."""
    h, inter, e, topk = 1024, 384, 64, 8
    w13 = ht.quantize_weight(torch.randn(e, 2 * inter, h, generator=rng).cuda() / 8, scheme,
                             bias=torch.randn(e, 2 * inter, generator=rng).cuda())
    w2 = ht.quantize_weight(torch.randn(e, h, inter, generator=rng).cuda() / 8, scheme)
    x = torch.randn(tokens, h, generator=rng).cuda()
    wts, ids = torch.topk(torch.softmax(torch.randn(tokens, e, generator=rng), -1), topk)
    wts, ids = wts.cuda(), ids.cuda()
    y = ht.fused_moe(x.to(dtype), w13, w2, wts, ids, activation=activation, backend=backend)
    # float32 math on the same (dequantized) weights; no TF32 (torch's default for float32 matmuls)
    ref = ht.fused_moe(x, w13, w2, wts, ids, activation=activation, backend="reference").double().cpu()
    u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    rel = ((y.cpu().double() - ref).norm() / ref.norm()).item()
    assert not torch.backends.cuda.matmul.allow_tf32
    assert rel < 16 * u, f"{scheme}/{activation}/{tokens} tokens: rel err {rel:.3g}"


def test_act_order_with_quantized_activations_is_named(monkeypatch, rng):
    """The Triton paths gather x into the stored K order, so per-group activation scales (and the grouped
    kernel's quantization) would follow the wrong order: auto keeps the reference, triton says why."""
    import dataclasses
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    stored = ht.quantize_weight(torch.randn(2, 32, 128, generator=rng), "w8a8-fp8")
    qw = dataclasses.replace(stored, k_perm=torch.randperm(128, generator=rng), cache={})
    x, offsets = torch.randn(3, 128, generator=rng).half(), torch.tensor([0, 1, 3])
    ht.grouped_linear(x, qw, offsets)
    assert ht.last_backend("grouped_linear") == "reference"
    with pytest.raises(RuntimeError, match="act-order"):
        ht.grouped_linear(x, qw, offsets, backend="triton")


def test_fused_moe_checks_both_weights(monkeypatch, rng):
    """Only the down projection is act-order with quantized activations: auto still keeps the reference."""
    import dataclasses
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    h, inter, e = 64, 32, 3
    w13 = ht.quantize_weight(torch.randn(e, 2 * inter, h, generator=rng), "w8a8-fp8")
    w2 = ht.quantize_weight(torch.randn(e, h, inter, generator=rng), "w8a8-fp8")
    w2 = dataclasses.replace(w2, k_perm=torch.randperm(inter, generator=rng), cache={})
    x = torch.randn(4, h, generator=rng).half()
    wts, ids = torch.topk(torch.softmax(torch.randn(4, e, generator=rng), -1), 2)
    ht.fused_moe(x, w13, w2, wts, ids)
    assert ht.last_backend("fused_moe") == "reference"
    with pytest.raises(RuntimeError, match="act-order"):
        ht.fused_moe(x, w13, w2, wts, ids, backend="triton")
