"""``swapab``: tensor-core GEMM with the tokens on the MMA's N side (``_dense_swapab.py``), 16-bit activations.

M <= 16: one 16-token tile (tl.dot needs N >= 16), the scale on the fp32 partial where a group spans the K tile.
M > 16: 32..256-token tiles.  Why: with the weight on the MMA's M side the dequantized tile is wgmma's
register-sourced A operand; in ``tiled`` it is the B operand, which wgmma reads only from shared memory, so every
K tile is stored there and waited on.  Above 16 tokens the scale multiplies the weight before the dot (an extra
product per weight element, shared by BLOCK_M tokens), so the loop is one plain accumulate and keeps no second
[BLOCK_N, BLOCK_M] fp32 partial live.  Timed on the H200 (session 19) with 64 / 128-wide K tiles: 1.4-2.2x
``tiled`` at M >= 256, yet behind CUTLASS and dequantize + cuBLAS -- ptxas serialized the register-A wgmma across
K tiles (C7515).  32-wide K tiles with a broadcast code split compiled without that serialization but ran 2-4x
slower still (session 20); they are not offered."""
from __future__ import annotations

import triton

from ...calls import Call, KernelConfig, interpreting
from .._dense_swapab import dense_swapab_kernel
from ..launch import LaunchSpec, post_scale
from . import Family, base_constexprs, packed_int4, register, sixteen_bit_reason, swap_tile_fits, tile_mma

MAX_M = 16


class SwapAB(Family):
    name = "swapab"

    def reason(self, call: Call) -> str | None:
        return sixteen_bit_reason(call)

    def mma(self, call: Call) -> str:
        return tile_mma(call)

    def candidates(self, call: Call) -> list[KernelConfig]:
        if call.m > MAX_M:
            return self._wide_candidates(call)
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

    @staticmethod
    def _wide_candidates(call: Call) -> list[KernelConfig]:
        """Token tiles of 32..256 (the MMA's N side), weight tiles of 64 rows per warpgroup."""
        m = call.m
        bms = [32] if m <= 32 else [64] if m <= 64 else [64, 128] if m <= 128 else [128, 256]
        # (BLOCK_N, BLOCK_K, warps, stages): 64 weight rows per warpgroup (wgmma's M).  ptxas waits on every
        # wgmma of this loop (C7515, measured 1.4-2.2x `tiled`, short of cuBLAS); 32-wide K tiles, which it keeps
        # one wgmma in flight for, measured 2-4x slower still on the H200 (session 20): not offered
        shapes = [(64, 64, 4, 4), (64, 128, 4, 3), (128, 64, 8, 4), (128, 128, 8, 3), (128, 64, 4, 4), (256, 64, 8, 3)]
        out = []
        for bm in bms:
            for bn, bk, w, st in shapes:
                if not swap_tile_fits(bm, bn, bk, w, st, call.scheme.bits, heavy=bool(32 % call.scheme.bits)):
                    continue
                sk = 2 if m <= 64 and bn == 64 else 1  # 64 tokens make few tiles: split K to fill the SMs
                out.append(KernelConfig("swapab", bm, bn, bk, sk, 8, w, st))
        return out

    def spec(self, fmt: dict, call: Call, cfg: KernelConfig, has_bias: bool) -> LaunchSpec:
        consts = base_constexprs(fmt, call, cfg, has_bias)
        block_m = 16 if call.m <= MAX_M else cfg.block_m
        post = post_scale(fmt, cfg.block_k) and block_m <= MAX_M
        consts.update(BLOCK_M=block_m, POST_SCALE=post, DOT_F32=interpreting() or call.dtype.itemsize == 4,
                      INT4_16=packed_int4(fmt, post, call.dtype), ASM=not interpreting())
        grid = (triton.cdiv(call.n, cfg.block_n), cfg.split_k, triton.cdiv(call.m, block_m))
        return LaunchSpec(dense_swapab_kernel, grid, consts, cfg.num_warps, cfg.num_stages, split=cfg.split_k)


register(SwapAB())
