"""Grouped (MoE) GEMM over a 3-D ``[E, N, K]`` QuantWeight on Triton: rows of x sorted by expert, offsets
``[E+1]``.  Reads the canonical layout of every format, like the dense kernels (same decode helpers)."""
from __future__ import annotations

import torch
import triton

from ..calls import KernelConfig, interpreting
from ..formats.weight import QuantWeight
from . import configs
from ._grouped_tiled import grouped_tiled_kernel
from .dense import (PER_TOKEN, SCALED_KINDS, _format, _launch_format, act_block_k, act_kind, check_act_group,
                    int_decode_kind, split_buffers, triton_quantize_activation)
from .families import packed_int4
from .launch import post_scale

__all__ = ["triton_grouped_linear"]


def triton_grouped_linear(x: torch.Tensor, qw: QuantWeight, offsets: torch.Tensor, bias: torch.Tensor | None = None,
                          out_dtype: torch.dtype | None = None, block_m: int | None = None,
                          block_n: int | None = None, block_k: int | None = None, num_warps: int = 4,
                          num_stages: int = 3, out: torch.Tensor | None = None,
                          config: KernelConfig | None = None) -> torch.Tensor:
    """``y[r] = x[r] @ dequant(qw[e]).T (+ bias[e])`` for rows ``offsets[e] <= r < offsets[e+1]``; for an
    activation-quantized scheme x is quantized first (all rows at once, as the reference does) and the tiles
    run on its codes like the dense quantized-activation path.  ``config`` (family ``grouped``: tiles, warps,
    stages; or family ``grouped_swapab``: the swap-AB loop, 16-bit activations) is dispatch's measured choice;
    without one the tiles follow the rows per expert."""
    if qw.k_perm is not None and qw.scheme.act is not None:
        raise NotImplementedError(f"act-order (k_perm) experts with quantized activations ({qw.scheme.name}) have "
                                  f"no Triton grouped GEMM")
    t, k = x.shape
    n, e = qw.N, qw.num_experts
    out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = out if out is not None else torch.empty(t, n, dtype=out_dtype, device=x.device)
    if t == 0:
        return y
    if qw.scheme.act is not None:
        check_act_group(qw.scheme.act, k)
    # rows per expert on average decide the tile height (known on the host without a sync)
    bm, bn, bk = configs.grouped_tiles(t, e, qw.scheme.bits, qw.scheme.zero != "none")
    if config is not None:
        bm, bn, bk = config.block_m, config.block_n, config.block_k
        num_warps, num_stages = config.num_warps, config.num_stages
    act = qw.scheme.act
    swap = config is not None and config.family == "grouped_swapab"
    if swap and act is not None:
        raise ValueError(f"the swap-AB grouped loop takes 16-bit activations, not {qw.scheme.name}'s codes")
    bm, block_n = block_m or bm, block_n or bn
    kind = act_kind(act, bm)  # fp8 codes: fp8 mma.sync on 16-row tiles, a bf16 MMA on larger ones
    bk = configs.fit_block_k(block_k or bk, _format(qw)["GROUP_K"], k, qw.scheme.bits)
    if act is not None:
        bk = act_block_k(bk, qw.scheme, k)
    fmt = _launch_format(qw, bk)
    post = post_scale(fmt, bk) and not (swap and bm > 16)  # swap-AB above 16 rows: the scale before the dot
    if kind == 0 and packed_int4(fmt, post, x.dtype):
        kind = 6  # signed int4 with a scale per tile: the packed decode (_dense_tiled.tile_matmul)
    kind = int_decode_kind(kind, fmt, post, k, act, grouped=True) if act is not None else kind
    if kind in SCALED_KINDS and not post:
        raise ValueError(f"the quantized-activation path needs BLOCK_K ({bk}) to divide the weight group "
                         f"({fmt['GROUP_K']}) of {qw.scheme.name}")
    offsets = offsets.to(device=x.device, dtype=torch.int64)
    tiles = (offsets[1:] - offsets[:-1] + bm - 1) // bm
    tile_cum = torch.zeros(e + 1, dtype=torch.int32, device=x.device)
    tile_cum[1:] = torch.cumsum(tiles, 0)
    bias = qw.bias if bias is None else bias
    zeros = qw.zeros if qw.zeros is not None else qw.scales
    gscale, stride_ge, has_global = qw.global_scale, 1, fmt["HAS_GLOBAL"]
    xs, stride_xsm, act_group = x, 0, 1
    if act is not None:  # quantize the rows once (the reference quantizes the whole x too), then tile on codes
        q = triton_quantize_activation(x, act, qw.input_scale, scale_values=kind in SCALED_KINDS)
        x, xs, stride_xsm, act_group = q.codes, q.scales, q.scales.stride(0), act.group_k or PER_TOKEN
        if q.global_scale is not None:  # NV activations: both global scales multiply the accumulator once
            gscale = q.global_scale * qw.global_scale if has_global else q.global_scale.reshape(1)
            stride_ge, has_global = (1 if has_global else 0), True
    if gscale is None:
        gscale = qw.scales
    b = bias if bias is not None else y
    # act-order experts: the kernel gathers x's columns through k_perm ([K] shared or [E, K] per expert)
    perm, stride_pe = offsets, 0
    if qw.k_perm is not None:
        perm = qw.k_perm.contiguous()
        stride_pe = perm.stride(0) if perm.dim() == 2 else 0
    split = config.split_k if config is not None else 1
    grid = (triton.cdiv(t, bm) + e, triton.cdiv(n, block_n), split)
    ws, cnt = split_buffers(split, t, n, grid[0] * grid[1], x.device)
    grouped_tiled_kernel[grid](
        x, qw.data, qw.scales, zeros, gscale, b, y, offsets, tile_cum, xs, perm, ws, cnt, t, n, k, e, x.stride(0),
        qw.data.stride(0), qw.data.stride(1), qw.scales.stride(0), qw.scales.stride(1), qw.scales.stride(2),
        zeros.stride(0), zeros.stride(1), zeros.stride(2), b.stride(0) if bias is not None else 0, y.stride(0),
        stride_xsm, stride_ge, stride_pe, E_POW2=triton.next_power_of_2(e), BLOCK_M=bm, BLOCK_N=block_n, SPLIT_K=split,
        BLOCK_K=bk, POST_SCALE=post, DOT_F32=interpreting() or x.dtype == torch.float32, EVEN_K=k % bk == 0,
        HAS_BIAS=bias is not None, HAS_PERM=qw.k_perm is not None, ACT_KIND=kind, ACT_GROUP_K=act_group,
        SWAP_AB=swap, num_warps=num_warps, num_stages=num_stages, **{**fmt, "HAS_GLOBAL": has_global})
    return y
