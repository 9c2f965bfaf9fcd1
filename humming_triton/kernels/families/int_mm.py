"""``int_mm`` (torch backend): W8A8-INT8 on cuBLASLt's int8 GEMM (``torch._int_mm``, exact int32 sums) on the
weight's own int8 codes, then one Triton epilogue pass applying the per-token and per-channel fp32 scales and
the bias (``_scale_epilogue.py``).

Why: above M = 16 the int8 scheme had no int8 tensor-core path (dequantize both operands + bf16 cuBLAS, slower
than unquantized bf16 at M = 256 / 4096); int8 MMAs run at twice the bf16 rate and sum exactly.  The canonical
layout packs 4 codes per int32 word in K order, two's complement, so the words viewed as bytes *are* the [N, K]
int8 matrix (no copy).  ``torch._int_mm`` takes M > 16 and K, N multiples of 8; the decode kernels own M <= 16."""
from __future__ import annotations

import torch
import triton

from ...calls import Call, KernelConfig
from .._scale_epilogue import scale_rows_cols_kernel
from . import Family, register

EPILOGUE_TILE = (32, 128)  # rows x columns of one epilogue program: 16 KB of int32 sums


class IntMM(Family):
    name = "int_mm"
    backend = "torch"

    def reason(self, call: Call) -> str | None:
        s, a = call.scheme, call.scheme.act
        if call.device_type != "cuda":
            return "torch._int_mm needs a CUDA GPU"
        if a is None or str(a.dtype) != "int8" or str(a.scale_dtype) != "fp32" or not a.per_token or a.group_k \
                or a.static or a.global_scale:
            return f"{s.name}: _int_mm takes dynamic per-token int8 activations (fp32 scales)"
        if str(s.weight) != "int8" or str(s.scale.dtype) != "fp32" or s.scale.block_n != 1 or s.scale.block_k \
                or s.scale.global_scale or s.zero != "none":
            return f"{s.name}: _int_mm takes int8 weights with fp32 per-channel scales"
        if call.act_order:
            return "act-order weights"
        if call.m <= 16:
            return f"torch._int_mm needs M > 16 (got M={call.m}; the decode kernels run that)"
        if call.k % 8 or call.n % 8:
            return f"torch._int_mm needs N and K multiples of 8 (got N={call.n}, K={call.k})"
        return None

    def mma(self, call: Call) -> str:
        return "int8"

    def candidates(self, call: Call) -> list[KernelConfig]:
        return [KernelConfig(self.name)]

    def run(self, x, x2, qw, bias, out_dtype, cfg, out):
        from ..dense import triton_quantize_activation
        q = triton_quantize_activation(x2, qw.scheme.act, qw.input_scale)
        w = qw.data.view(torch.int8)  # [N, K] int8 codes, K-contiguous
        acc = torch._int_mm(q.codes.view(torch.int8), w.t())
        m, n = acc.shape
        y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=acc.device)
        bm, bn = EPILOGUE_TILE
        scale_rows_cols_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
            acc, q.scales, qw.scales, bias if bias is not None else qw.scales, y, m, n, acc.stride(0), y.stride(0),
            HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn)
        return y


register(IntMM())
