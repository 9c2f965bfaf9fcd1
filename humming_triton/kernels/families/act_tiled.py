"""``act_tiled``: the quantized-activation tile loop (fused activation quantizer, then fp8 / int8 tensor cores
with both scales on partial products, or e2m1 activations decoded to bf16) -- ``dense.act_linear``."""
from __future__ import annotations

from ...calls import Call, KernelConfig
from . import Family, tile_mma, register

C = KernelConfig


class ActTiled(Family):
    name = "act_tiled"

    def reason(self, call: Call) -> str | None:
        if call.scheme.act is None:
            return f"{call.scheme.name} has 16-bit activations (this family quantizes them)"
        from .. import fp8_path_reason
        return fp8_path_reason(call.op, call.scheme)

    def mma(self, call: Call) -> str:
        return tile_mma(call)

    def candidates(self, call: Call) -> list[KernelConfig]:
        from ..dense import act_config
        base = act_config(call.m, call.n, call.k, call.scheme)
        if base.family != "act_tiled":  # the heuristic's regime ends here (dequantize + cuBLAS from M = 512)
            base = C("act_tiled", 128, 128, 64, 1, 8, 8, 3)
        bm = base.block_m
        out = [base]
        if str(call.scheme.act.dtype) == "e4m3fn" and call.m <= 16:
            out += [C("act_tiled", 16, 128, 128, base.split_k, 8, 4, 3), C("act_tiled", 16, 64, 128, 1, 8, 4, 4),
                    C("act_tiled", 64, 64, 128, base.split_k, 8, 4, 3)]  # 64 rows: the bf16-MMA e4m3 variant
        elif bm <= 64:
            out += [C("act_tiled", bm, 128, 64, base.split_k, 8, 4, 3), C("act_tiled", bm, 64, 64, 1, 8, 4, 4),
                    C("act_tiled", 64, 128, 128, 1, 8, 4, 3)]
        else:  # 128-wide K tiles: one per group of g128 weights; the int32-accumulating loop (ACT_KIND 9) fits them
            out += [C("act_tiled", 128, 64, 64, 1, 8, 4, 4), C("act_tiled", 64, 128, 64, 1, 8, 4, 4),
                    C("act_tiled", 128, 256, 64, 1, 8, 8, 3), C("act_tiled", 128, 128, 128, 1, 8, 8, 3),
                    C("act_tiled", 128, 256, 128, 1, 8, 8, 3), C("act_tiled", 64, 128, 128, 1, 8, 4, 3),
                    C("act_tiled", 64, 128, 128, 1, 8, 4, 4), C("act_tiled", 64, 256, 128, 1, 8, 8, 3),
                    C("act_tiled", 128, 64, 128, 1, 8, 4, 3)]
        return list(dict.fromkeys(out))

    def run(self, x, x2, qw, bias, out_dtype, cfg, out):
        from ..dense import act_linear
        return act_linear(x, x2, qw, bias, out_dtype, cfg, out)


register(ActTiled())
