"""Triton kernels around a fused MoE's two grouped GEMMs: routing with the gather of the hidden rows, the gated
activation, and the weighted top-k combine -- one launch each where ``reference.moe_forward`` runs ~15 small torch
kernels (argsort, scatter_add, cumsum, index arithmetic, gathers, the activation's pieces, the weighting, an atomic
index_add, the final cast).  At decode sizes those launches, not the GEMMs, are most of a MoE layer's GPU time in a
CUDA graph and most of its host time in eager mode.  ``kernels/moe.py`` composes them; the torch pipeline is the
reference each is tested against.

Rows are the (token, slot) pairs of ``topk_ids`` in row-major order; row ``r`` goes to position ``p`` of the
expert-sorted order: the rows of lower experts, then the rows of its own expert that come before it (a stable
sort, as ``torch.argsort(stable=True)``).  An id outside ``[0, E)`` sorts after every expert: no GEMM reads its row
and it contributes nothing (expert parallelism's convention for another rank's experts)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def route_gather_kernel(ids_ptr, wts_ptr, hidden_ptr, xs_ptr, row_w_ptr, inv_ptr, offsets_ptr, R, E, H, stride_h,
                        stride_xs, TOP_K: tl.constexpr, R_POW2: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program ``q``: for a row ``q < R``, its sorted position ``p`` (``inv[q] = p``), its routing weight at ``p``
    and its token's hidden row copied to ``xs[p]``; for ``q <= E``, ``offsets[q]`` = the rows of experts below q."""
    q = tl.program_id(0)
    idx = tl.arange(0, R_POW2)
    live = idx < R
    ids = tl.load(ids_ptr + idx, mask=live, other=0)
    # out of range (tested in the ids' own dtype: an int64 id cast first could wrap into range): after every expert
    ids = tl.where(live & (ids >= 0) & (ids < E), ids, E).to(tl.int32)
    if q < R:
        e = tl.load(ids_ptr + q)
        e = tl.where((e >= 0) & (e < E), e, E).to(tl.int32)
        before = live & ((ids < e) | ((ids == e) & (idx < q)))
        p = tl.sum(before.to(tl.int32), axis=0)
        tl.store(inv_ptr + q, p)
        tl.store(row_w_ptr + p, tl.load(wts_ptr + q).to(tl.float32))
        src = hidden_ptr + (q // TOP_K).to(tl.int64) * stride_h
        dst = xs_ptr + p.to(tl.int64) * stride_xs
        for h0 in range(0, H, BLOCK_H):
            cols = h0 + tl.arange(0, BLOCK_H)
            tl.store(dst + cols, tl.load(src + cols, mask=cols < H), mask=cols < H)
    if q <= E:
        tl.store(offsets_ptr + q, tl.sum((live & (ids < q)).to(tl.int64), axis=0))


@triton.jit
def gated_activation_kernel(h_ptr, a_ptr, I, stride_h, stride_a, KIND: tl.constexpr, BLOCK: tl.constexpr):
    """``a[r] = act(h[r])`` in fp32, rounded to a's dtype.  KIND 0, silu: gate = h[:, :I], up = h[:, I:],
    ``silu(gate) * up``; KIND 1, gpt-oss's swiglu: gate / up interleaved, ``(up + 1) * gate * sigmoid(1.702
    gate)`` with gate clamped to 7 and up to [-7, 7] (``reference.moe_activation``)."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    row = h_ptr + r * stride_h
    if KIND == 0:
        gate = tl.load(row + cols, mask=m, other=0.0)
        up = tl.load(row + I + cols, mask=m, other=0.0)
        a = gate / (1.0 + tl.exp(-gate)) * up
    else:
        nan = tl.PropagateNan.ALL  # as torch.clamp: a NaN stays NaN (the GPU's min / max would drop it)
        gate = tl.minimum(tl.load(row + 2 * cols, mask=m, other=0.0), 7.0, propagate_nan=nan)
        up = tl.minimum(tl.maximum(tl.load(row + 2 * cols + 1, mask=m, other=0.0), -7.0, propagate_nan=nan), 7.0,
                        propagate_nan=nan)
        a = (up + 1.0) * gate * (1.0 / (1.0 + tl.exp(-1.702 * gate)))
    tl.store(a_ptr + r * stride_a + cols, a.to(a_ptr.dtype.element_ty), mask=m)


@triton.jit
def combine_kernel(y_ptr, inv_ptr, row_w_ptr, offsets_ptr, out_ptr, H, E, stride_y, stride_o, TOP_K: tl.constexpr,
                   BLOCK_H: tl.constexpr):
    """``out[t] = sum_j w[t, j] * y[inv[t * TOP_K + j]]`` in fp32, slots in order (deterministic, no atomics),
    rounded to out's dtype; a row past ``offsets[E]`` (an id out of range) is skipped."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = cols < H
    routed = tl.load(offsets_ptr + E)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        p = tl.load(inv_ptr + t * TOP_K + j)
        ok = p < routed
        w = tl.where(ok, tl.load(row_w_ptr + p), 0.0)
        y = tl.load(y_ptr + p.to(tl.int64) * stride_y + cols, mask=m & ok, other=0.0)
        acc += w * y
    tl.store(out_ptr + t.to(tl.int64) * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=m)
