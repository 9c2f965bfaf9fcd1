"""``tiled``: tensor-core ``tl.dot`` with the weight dequantized in registers (``_dense_tiled.py``),
16-bit activations, optional split-K."""
from __future__ import annotations

import triton

from ...calls import Call, KernelConfig, interpreting
from .._dense_tiled import dense_tiled_kernel
from ..launch import LaunchSpec, post_scale
from . import Family, base_constexprs, packed_int4, register, sixteen_bit_reason, tile_mma

C = KernelConfig


class Tiled(Family):
    name = "tiled"

    def reason(self, call: Call) -> str | None:
        return sixteen_bit_reason(call)

    def mma(self, call: Call) -> str:
        return tile_mma(call)

    def candidates(self, call: Call) -> list[KernelConfig]:
        m = call.m
        if m <= 16:
            grid = [(16, 64, 128, 1, 4, 4), (16, 64, 128, 1, 4, 2), (16, 64, 128, 2, 4, 4), (16, 64, 128, 2, 4, 2),
                    (16, 64, 128, 4, 4, 2), (16, 64, 128, 4, 4, 3), (16, 32, 128, 2, 2, 3), (16, 32, 128, 4, 2, 2),
                    (16, 64, 256, 1, 4, 4), (16, 128, 128, 2, 4, 4), (16, 32, 256, 4, 4, 3), (16, 128, 64, 4, 4, 4)]
        elif m <= 64:
            bm = 32 if m <= 32 else 64
            grid = [(bm, 64, 128, 1, 4, 4), (bm, 64, 128, 1, 4, 6), (bm, 128, 64, 2, 4, 4), (bm, 64, 128, 2, 4, 4),
                    (bm, 64, 128, 2, 4, 6), (bm, 64, 128, 4, 4, 3), (bm, 128, 128, 1, 8, 3), (bm, 128, 128, 1, 8, 5)]
        elif m <= 512:
            grid = [(128, 128, 64, 1, 8, 4), (64, 128, 64, 1, 4, 4), (128, 64, 64, 1, 4, 4), (64, 64, 128, 1, 4, 4),
                    (64, 128, 64, 2, 4, 4), (128, 256, 64, 1, 8, 3), (64, 128, 128, 1, 4, 5)]  # 128x128x128: spills
        else:
            grid = [(128, 128, 64, 1, 8, 4), (128, 128, 64, 1, 8, 3), (64, 128, 64, 1, 4, 4), (64, 256, 64, 1, 8, 4),
                    (128, 256, 64, 1, 8, 3)]
        if 32 % call.scheme.bits:  # codes gathered from two words: smaller tiles keep the registers in bounds
            grid = [g for g in grid if g[1] * g[2] <= 8192] or [(16 if m <= 16 else 64, 64, 64, 1, 4, 2)]
        return [C("tiled", bm, bn, bk, sk, 8, w, st) for bm, bn, bk, sk, w, st in grid]

    def spec(self, fmt: dict, call: Call, cfg: KernelConfig, has_bias: bool) -> LaunchSpec:
        consts = base_constexprs(fmt, call, cfg, has_bias)
        post = post_scale(fmt, cfg.block_k)
        consts.update(ACT_KIND=6 if packed_int4(fmt, post, call.dtype) else 0, ACT_GROUP_K=1, GROUP_M=cfg.group_m,
                      POST_SCALE=post, DOT_F32=interpreting() or call.dtype.itemsize == 4)
        grid = (triton.cdiv(call.m, cfg.block_m) * triton.cdiv(call.n, cfg.block_n), cfg.split_k)
        return LaunchSpec(dense_tiled_kernel, grid, consts, cfg.num_warps, cfg.num_stages,
                          scalars={"stride_xsm": 0}, split=cfg.split_k)


register(Tiled())
