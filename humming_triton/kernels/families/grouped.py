"""``grouped``: the Triton grouped (MoE) GEMM over rows sorted by expert (``_grouped_tiled.py``), every weight
format, 16-bit or quantized activations."""
from __future__ import annotations

from ...calls import Call, KernelConfig
from . import Family, tile_mma, register

C = KernelConfig


class Grouped(Family):
    name = "grouped"
    op = "grouped_linear"

    def reason(self, call: Call) -> str | None:
        from .. import supports
        if call.act_order and call.scheme.act is not None:
            return f"act-order (k_perm) experts with quantized activations ({call.scheme.name})"
        return supports(call.op, call.scheme, call.dtype)

    def mma(self, call: Call) -> str:
        return tile_mma(call)

    def candidates(self, call: Call) -> list[KernelConfig]:
        from .. import configs
        bm, bn, bk = configs.grouped_tiles(call.m, call.experts, call.scheme.bits, call.scheme.zero != "none")
        heavy = call.scheme.zero != "none" or 32 % call.scheme.bits != 0
        out = [C("grouped", bm, bn, bk, 1, 8, 4, 3)]
        # decode-sized batches (16-row tiles): few rows per expert, so split K to put enough programs in flight
        splits = [C("grouped", 16, bn, 128, sk, 8, 4, st) for bn, sk, st in
                  [(64, 2, 3), (64, 4, 3), (64, 8, 2), (32, 4, 3), (128, 4, 3)]] if bm == 16 and not heavy else []
        tiles = [(16, 64, 128, 4, 3), (16, 128, 64, 4, 3), (16, 64, 64, 4, 4)] if bm == 16 else \
            [(64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (64, 128, 64, 8, 4), (128, 64, 64, 4, 3)]
        if call.scheme.act is not None and str(call.scheme.act.dtype) == "e4m3fn" and bm == 16:
            tiles = [(16, 64, 128, 4, 3), (16, 128, 128, 4, 3)]
        for t in tiles:
            if not (heavy and t[1] * t[2] > 4096):
                out.append(C("grouped", t[0], t[1], t[2], 1, 8, t[3], t[4]))
        return list(dict.fromkeys(out + splits))

    def run(self, x, offsets, qw, bias, out_dtype, cfg, out):
        from ..grouped import triton_grouped_linear
        return triton_grouped_linear(x, qw, offsets, bias, out_dtype, out=out, config=cfg)


register(Grouped())
