"""``gemv``: the generic decode GEMV (``_dense_gemv.dense_gemv_kernel``), any bit width, M <= 8."""
from __future__ import annotations

import triton

from ...calls import Call, KernelConfig, m_bucket
from .._dense_gemv import dense_gemv_kernel
from ..launch import LaunchSpec
from . import Family, base_constexprs, register, sixteen_bit_reason

MAX_M = 8


class Gemv(Family):
    name = "gemv"

    def reason(self, call: Call) -> str | None:
        return sixteen_bit_reason(call)

    def candidates(self, call: Call) -> list[KernelConfig]:
        if call.m > MAX_M:
            return []
        bm = m_bucket(call.m)
        return [KernelConfig("gemv", bm, bn, bk, sk, num_warps=w, num_stages=1) for bn, bk, sk, w in
                [(8, 1024, 1, 4), (16, 512, 1, 4), (8, 256, 4, 4), (8, 512, 2, 4)] if bm * bn * bk <= 32768]

    def spec(self, fmt: dict, call: Call, cfg: KernelConfig, has_bias: bool) -> LaunchSpec:
        grid = (triton.cdiv(call.n, cfg.block_n), cfg.split_k, triton.cdiv(call.m, cfg.block_m))
        return LaunchSpec(dense_gemv_kernel, grid, base_constexprs(fmt, call, cfg, has_bias), cfg.num_warps,
                          cfg.num_stages, split=cfg.split_k)


register(Gemv())
