"""``swapab``: small-M tensor-core GEMM with the tokens on the MMA's N side (``_dense_swapab.py``), 16-bit
activations, M <= 16 (one 16-token tile; tl.dot needs N >= 16)."""
from __future__ import annotations

import triton

from ...calls import Call, KernelConfig, interpreting
from .._dense_swapab import dense_swapab_kernel
from ..launch import LaunchSpec, post_scale
from . import Family, base_constexprs, packed_int4, register, sixteen_bit_reason, tile_mma

MAX_M = 16


class SwapAB(Family):
    name = "swapab"

    def reason(self, call: Call) -> str | None:
        return sixteen_bit_reason(call)

    def mma(self, call: Call) -> str:
        return tile_mma(call)

    def candidates(self, call: Call) -> list[KernelConfig]:
        if call.m > MAX_M:
            return []
        # (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages).  Measured on the H200 (w4a16, M <= 16): deeper pipelines do
        # not help (stages 6 / 8 = 4), more resident warps do -- a lone warpgroup per CTA waits on its own
        # instruction latencies -- so the sweep favours split-K and shallow, small-footprint pipelines
        grid = [(64, 128, 1, 4, 4), (64, 128, 1, 4, 2), (64, 128, 2, 4, 4), (64, 128, 2, 4, 2), (64, 128, 4, 4, 4),
                (64, 128, 4, 4, 3), (64, 128, 4, 4, 2), (64, 128, 8, 4, 2), (64, 128, 8, 4, 3), (64, 64, 8, 4, 3),
                (64, 64, 16, 4, 2), (64, 128, 4, 8, 3), (64, 128, 2, 8, 3), (64, 256, 1, 4, 4),
                (128, 128, 1, 4, 4), (128, 128, 4, 4, 3), (128, 128, 2, 8, 3)]
        if 32 % call.scheme.bits:
            grid = [g for g in grid if g[0] * g[1] <= 8192]
        return [KernelConfig("swapab", 16, bn, bk, sk, 8, w, st) for bn, bk, sk, w, st in grid]

    def spec(self, fmt: dict, call: Call, cfg: KernelConfig, has_bias: bool) -> LaunchSpec:
        consts = base_constexprs(fmt, call, cfg, has_bias)
        post = post_scale(fmt, cfg.block_k)
        consts.update(BLOCK_M=16, POST_SCALE=post, DOT_F32=interpreting() or call.dtype.itemsize == 4,
                      INT4_16=packed_int4(fmt, post, call.dtype), ASM=not interpreting())
        grid = (triton.cdiv(call.n, cfg.block_n), cfg.split_k, triton.cdiv(call.m, 16))
        return LaunchSpec(dense_swapab_kernel, grid, consts, cfg.num_warps, cfg.num_stages, split=cfg.split_k)


register(SwapAB())
