"""``gemv_words``: the word-major decode GEMV (``_dense_gemv.dense_gemv_words_kernel``) for codes that never
straddle a word, ROWS activation rows per program."""
from __future__ import annotations

import triton

from ...calls import Call, KernelConfig, interpreting, m_bucket
from .._dense_gemv import dense_gemv_words_kernel
from ..launch import LaunchSpec
from . import Family, base_constexprs, register, sixteen_bit_reason

MAGIC_2_23 = 0x4B000000  # fp32 bits of 2**23; a runtime kernel argument on purpose (_dense_gemv.py says why)
MAX_M = 16


def words_fit(bits: int, group_k: int, k: int) -> bool:
    """Whole codes in each word, and each word inside one scale group."""
    return 32 % bits == 0 and (group_k % (32 // bits) == 0 or group_k >= k)


class GemvWords(Family):
    name = "gemv_words"

    def reason(self, call: Call) -> str | None:
        why = sixteen_bit_reason(call)
        if why:
            return why
        s = call.scheme
        if not words_fit(s.bits, s.group_k(call.k), call.k):
            return f"{s.bits}-bit codes straddle words or a word spans two scale groups ({s.name})"
        return None

    def candidates(self, call: Call) -> list[KernelConfig]:
        if call.m > MAX_M:
            return []
        bm = m_bucket(call.m)
        if bm == 1:  # num_stages 2 = the register prefetch of the next tile
            grid = [(4, 1024, 1, 4, 1), (4, 1024, 1, 4, 2), (8, 1024, 1, 4, 2), (4, 512, 1, 4, 2),
                    (4, 2048, 1, 8, 1), (4, 1024, 2, 4, 2), (8, 512, 2, 4, 2)]
        else:  # rows share each decoded tile; the K tile shrinks as rows grow (registers)
            bk = max(128, 1024 // bm)
            grid = [(4, bk, 1, 4, 1), (4, bk, 1, 4, 2), (2, 2 * bk, 1, 4, 1), (8, bk, 1, 4, 1)]
        return [KernelConfig("gemv_words", bm, bn, bk, sk, num_warps=w, num_stages=st) for bn, bk, sk, w, st in grid]

    def spec(self, fmt: dict, call: Call, cfg: KernelConfig, has_bias: bool) -> LaunchSpec:
        if not words_fit(call.scheme.bits, fmt["GROUP_K"], call.k):
            # an explicit gemv_words config for codes that straddle words: the generic GEMV, same tiles
            from .gemv import Gemv
            return Gemv().spec(fmt, call, cfg, has_bias)
        common = base_constexprs(fmt, call, cfg, has_bias)
        consts = {key: v for key, v in common.items() if key not in ("BLOCK_M", "BLOCK_K", "EVEN_K")}
        consts.update(ROWS=cfg.block_m, BLOCK_W=max(1, cfg.block_k // (32 // call.scheme.bits)),
                      PREFETCH=cfg.num_stages > 1, FUSED_FMA=not interpreting())
        grid = (triton.cdiv(call.n, cfg.block_n), cfg.split_k, triton.cdiv(call.m, cfg.block_m))
        return LaunchSpec(dense_gemv_words_kernel, grid, consts, cfg.num_warps, cfg.num_stages,
                          scalars={"magic": MAGIC_2_23}, split=cfg.split_k)


register(GemvWords())
