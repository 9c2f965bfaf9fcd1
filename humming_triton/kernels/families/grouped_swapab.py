"""``grouped_swapab``: the Triton grouped (MoE) GEMM with the swap-AB loop (``_grouped_tiled.py``, SWAP_AB): the
dequantized expert weight tile is wgmma's register-sourced A operand and the expert's rows its N side, where
``grouped`` stores the weight tile to shared memory as the B operand every K tile.  16-bit activations, every
weight format.  On the H200 the table picks it for the 4096-token Qwen3-MoE GEMMs (681 against dequantize +
grouped_mm's 777 us); below that the native grouped decode kernel stays faster."""
from __future__ import annotations

from ...calls import Call, KernelConfig
from . import Family, register, sixteen_bit_reason, swap_tile_fits, tile_mma


class GroupedSwapAB(Family):
    name = "grouped_swapab"
    op = "grouped_linear"

    def reason(self, call: Call) -> str | None:
        from .. import supports
        return sixteen_bit_reason(call) or supports(call.op, call.scheme, call.dtype)

    def mma(self, call: Call) -> str:
        return tile_mma(call)

    def candidates(self, call: Call) -> list[KernelConfig]:
        rows = call.m / max(1, call.experts)  # routed rows per expert, on average
        bms = [16] if rows <= 12 else [16, 32] if rows <= 24 else [32, 64] if rows <= 48 else \
            [64, 128] if rows <= 160 else [128, 256]
        # (BLOCK_N, BLOCK_K, warps, stages): 64 weight rows per warpgroup (wgmma's M side); swapab's candidates
        # say why no 32-wide K tile
        shapes = [(64, 128, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4), (128, 64, 8, 4), (128, 64, 4, 4)]
        heavy = call.scheme.zero != "none" or 32 % call.scheme.bits != 0
        out = []
        for bm in bms:
            for bn, bk, w, st in shapes:
                if not swap_tile_fits(bm, bn, bk, w, st, call.scheme.bits, heavy):
                    continue
                out.append(KernelConfig(self.name, bm, bn, bk, 1, 8, w, st))
        return out

    def run(self, x, offsets, qw, bias, out_dtype, cfg, out):
        from ..grouped import triton_grouped_linear
        return triton_grouped_linear(x, qw, offsets, bias, out_dtype, out=out, config=cfg)


register(GroupedSwapAB())
