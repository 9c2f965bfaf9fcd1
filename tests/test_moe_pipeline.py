"""The fused MoE's steps around its grouped GEMMs as Triton launches (kernels/_moe_pipeline.py, composed by
kernels/moe.pipelined_moe_forward; opt-in ``kernels.moe.ON``) against the torch pipeline
(``reference.moe_forward``).  CPU: interpreter; ``pytest -m gpu`` on CUDA."""
import pytest
import torch
import triton

import humming_triton as ht
from humming_triton.kernels import moe as moe_kernels
from humming_triton.kernels._moe_pipeline import combine_kernel, gated_activation_kernel, route_gather_kernel
from humming_triton.reference import moe_activation, moe_forward, reference_grouped_linear, route
from humming_triton.testing import poison_like


def _route(ids, wts, hidden, e):
    """The route kernel's outputs for ``ids [T, k]`` (poisoned first: every element must be written)."""
    rows, h = ids.numel(), hidden.shape[1]
    xs = poison_like(torch.empty(rows, h, dtype=hidden.dtype))
    row_w = poison_like(torch.empty(rows, dtype=torch.float32))
    inv = torch.full((rows,), -7, dtype=torch.int32)
    offsets = torch.full((e + 1,), -7, dtype=torch.int64)
    route_gather_kernel[(max(rows, e + 1),)](
        ids.reshape(-1).contiguous(), wts.reshape(-1).contiguous(), hidden, xs, row_w, inv, offsets, rows, e, h,
        hidden.stride(0), xs.stride(0), TOP_K=ids.shape[1], R_POW2=triton.next_power_of_2(rows), BLOCK_H=32)
    return xs, row_w, inv, offsets


@pytest.mark.interpret
@pytest.mark.parametrize("t,k,e", [(1, 1, 4), (1, 8, 16), (7, 2, 5), (33, 4, 3), (5, 3, 40)])
def test_route_kernel_is_the_stable_sort(t, k, e, rng):
    """Offsets, the expert-sorted order (stable, as torch.argsort), the gathered hidden rows and the routing
    weights in that order -- exactly the torch pipeline's."""
    ids = torch.randint(0, e, (t, k), generator=rng)
    wts = torch.rand(t, k, generator=rng)
    hidden = torch.randn(t, 72, generator=rng).bfloat16()  # 72: not a multiple of the 32-wide copy block
    xs, row_w, inv, offsets = _route(ids, wts, hidden, e)
    order, want_offsets = route(ids, e)
    assert torch.equal(offsets, want_offsets)
    assert torch.equal(inv.long()[order], torch.arange(t * k))  # inv is order's inverse
    assert torch.equal(xs, hidden[order // k])
    assert torch.equal(row_w, wts.reshape(-1)[order])


@pytest.mark.interpret
def test_route_kernel_drops_ids_out_of_range(rng):
    """Ids outside [0, E) (another rank's experts) sort after every expert: offsets count only the others."""
    e = 4
    # 2**32 + 1 and -(2**32) + 3 are out of range too (an int32 cast before the test would wrap them to 1 and 3)
    ids = torch.tensor([[0, -1], [4, 2], [2, 9], [1, 0], [2 ** 32 + 1, -(2 ** 32) + 3]])
    xs, row_w, inv, offsets = _route(ids, torch.rand(5, 2, generator=rng), torch.randn(5, 16, generator=rng), e)
    keep = (ids >= 0) & (ids < e)
    assert offsets.tolist() == [0, 2, 3, 5, 5]
    assert sorted(inv[keep.reshape(-1)].tolist()) == list(range(5)) and (inv[~keep.reshape(-1)] >= 5).all()


@pytest.mark.interpret
@pytest.mark.parametrize("kind", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gated_activation_kernel(kind, dtype, rng):
    rows, inter = 6, 40
    h = torch.randn(rows, 2 * inter, generator=rng) * 4  # past swiglu_oai's clamps
    h[1, :4] = float("nan")  # gate and up of a few columns (either layout): NaN stays NaN, as torch.clamp keeps it
    a = poison_like(torch.empty(rows, inter, dtype=dtype))
    gated_activation_kernel[(rows, 2)](h, a, inter, h.stride(0), a.stride(0), KIND={"silu": 0, "swiglu_oai": 1}[kind],
                                       BLOCK=32)
    want = moe_activation(h, kind).double()  # fp32, as the kernel computes
    # fp32 arithmetic in another order than torch's: a few fp32 ulps, then one rounding to dtype
    tol = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -20
    assert torch.equal(a.isnan(), want.isnan()) and want.isnan().any()
    scale = want.nan_to_num(0).abs().max().item()
    torch.testing.assert_close(a.double(), want, rtol=tol, atol=tol * scale, equal_nan=True)


@pytest.mark.interpret
def test_combine_kernel_sums_each_tokens_slots_in_order(rng):
    t, k, e, h = 5, 3, 4, 48
    ids = torch.randint(0, e, (t, k), generator=rng)
    ids[2, 1] = -1  # dropped
    wts = torch.rand(t, k, generator=rng)
    xs, row_w, inv, offsets = _route(ids, wts, torch.randn(t, 8, generator=rng), e)
    y = torch.randn(t * k, h, generator=rng)
    routed = int(offsets[-1])
    y[routed:] = float("nan")  # rows no GEMM wrote: never read
    out = poison_like(torch.empty(t, h))
    combine_kernel[(t, 2)](y, inv, row_w, offsets, out, h, e, y.stride(0), out.stride(0), TOP_K=k, BLOCK_H=32)
    want = torch.zeros(t, h, dtype=torch.float64)
    for tok in range(t):
        for j in range(k):
            if 0 <= ids[tok, j] < e:
                want[tok] += wts[tok, j].double() * y[inv[tok * k + j]].double()
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)


def _experts(rng, e, h, i, kind):
    n13 = 2 * i
    w13 = ht.quantize_weight(torch.randn(e, n13, h, generator=rng) / 8, "w4a16")
    w2 = ht.quantize_weight(torch.randn(e, h, i, generator=rng) / 8, "w4a16")
    return w13, w2


def _grouped(x, qw, offsets):  # the exact GEMM both pipelines share: the comparison is about the steps around it
    return reference_grouped_linear(x.float(), qw, offsets, out_dtype=torch.float32)


@pytest.mark.interpret
@pytest.mark.parametrize("t,k", [(1, 8), (7, 2), (19, 4)])
@pytest.mark.parametrize("kind", ["silu", "swiglu_oai"])
def test_pipelined_moe_forward_matches_the_torch_pipeline(t, k, kind, rng):
    e, h, i = 8, 128, 128
    w13, w2 = _experts(rng, e, h, i, kind)
    hidden = torch.randn(t, h, generator=rng).bfloat16()
    wts, ids = torch.topk(torch.softmax(torch.randn(t, e, generator=rng), -1), k)
    got = moe_kernels.pipelined_moe_forward(hidden, w13, w2, wts, ids, kind, _grouped)
    want = moe_forward(hidden, w13, w2, wts, ids, kind, _grouped)
    assert got.dtype == want.dtype == torch.bfloat16
    # the same fp32 products summed in another order, then one bf16 rounding: at most a bf16 ulp apart
    torch.testing.assert_close(got.float(), want.float(), rtol=2.0 ** -7, atol=1e-3 * want.float().abs().max().item())
    again = moe_kernels.pipelined_moe_forward(hidden, w13, w2, wts, ids, kind, _grouped)
    assert torch.equal(got, again)  # no atomics: deterministic


@pytest.mark.interpret
def test_pipeline_is_opt_in_and_bounded(rng, monkeypatch):
    """``triton_fused_moe`` takes the pipeline only with the opt-in set, and above PIPELINE_MAX_ROWS routed rows
    the pipeline hands the call to the torch one."""
    e, h, i, t, k = 4, 128, 128, 3, 2
    w13, w2 = _experts(rng, e, h, i, "silu")
    hidden = torch.randn(t, h, generator=rng)
    wts, ids = torch.topk(torch.softmax(torch.randn(t, e, generator=rng), -1), k)
    seen = []
    monkeypatch.setattr(moe_kernels, "ON", False)
    real = moe_kernels.pipelined_moe_forward
    monkeypatch.setattr(moe_kernels, "pipelined_moe_forward", lambda *a: seen.append(1) or real(*a))
    moe_kernels.triton_fused_moe(hidden, w13, w2, wts, ids, measured=False)
    assert not seen
    monkeypatch.setattr(moe_kernels, "ON", True)
    got = moe_kernels.triton_fused_moe(hidden, w13, w2, wts, ids, measured=False)
    assert seen
    want = ht.fused_moe(hidden, w13, w2, wts, ids, backend="reference")
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    monkeypatch.setattr(moe_kernels, "PIPELINE_MAX_ROWS", t * k - 1)
    torch_steps = []
    monkeypatch.setattr(moe_kernels, "moe_forward", lambda *a: torch_steps.append(1) or moe_forward(*a))
    real(hidden, w13, w2, wts, ids, "silu", _grouped)
    assert torch_steps
    with pytest.raises(ValueError, match="activation"):
        real(hidden, w13, w2, wts, ids, "gelu", _grouped)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_pipelined_moe_on_gpu(tokens, rng, monkeypatch):
    """QuantMoE on ``auto`` with the opt-in set: against the torch pipeline (same GEMMs), eager and replayed from
    a CUDA graph."""
    from humming_triton.nn import QuantMoE
    e, h, i, k = 64, 1024, 384, 8
    w13 = ht.quantize_weight(torch.randn(e, 2 * i, h, generator=rng).cuda() / 8, "w4a16")
    w2 = ht.quantize_weight(torch.randn(e, h, i, generator=rng).cuda() / 8, "w4a16")
    mod = QuantMoE(w13, w2, backend="auto")
    x = torch.randn(tokens, h, generator=rng).cuda().bfloat16()
    wts, ids = torch.topk(torch.softmax(torch.randn(tokens, e, generator=rng), -1), k)
    wts, ids = wts.cuda(), ids.cuda()
    with torch.no_grad():
        monkeypatch.setattr(moe_kernels, "ON", False)  # the torch steps (a device's table may turn the pipeline on)
        want = mod(x, ids, wts)
        monkeypatch.setattr(moe_kernels, "ON", True)
        mod(x, ids, wts)  # first call: plans, kernel compiles
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # the pipeline never waits on the device
        try:
            got = mod(x, ids, wts)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=2 ** -7 * want.abs().max().item())
        static = x.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = mod(static, ids, wts)
        static.copy_(x * 2)
        graph.replay()
        # the combine is deterministic; a grouped GEMM's split of K (stream-K) need not be: one bf16 rounding apart
        torch.testing.assert_close(captured, mod(x * 2, ids, wts), rtol=2 ** -7, atol=2 ** -7)
