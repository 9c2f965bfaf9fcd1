"""The ``reference`` backend: float32/float64 torch math on any device -- the oracle every kernel is tested
against and the CPU fallback.  Never ``auto``'s choice on CUDA while a measured kernel can run."""
from __future__ import annotations

import torch

from ..calls import Call
from ..reference import reference_fused_moe, reference_grouped_linear, reference_linear
from . import Backend, register


class ReferenceBackend(Backend):
    name = "reference"
    auto = False

    def reason(self, call: Call) -> str | None:
        return None

    def quant_linear(self, x, qw, bias, out_dtype, cand):
        from ..batch_invariant import is_batch_invariant
        if is_batch_invariant():  # one row at a time: a BLAS GEMM's blocking may depend on M
            x2 = x.reshape(-1, x.shape[-1])
            rows = [reference_linear(x2[i:i + 1], qw, bias, out_dtype) for i in range(x2.shape[0])]
            y = torch.cat(rows) if rows else reference_linear(x2, qw, bias, out_dtype)
            return y.reshape(*x.shape[:-1], qw.N)
        return reference_linear(x, qw, bias, out_dtype)

    def grouped_linear(self, x, qw, offsets, bias, out_dtype, cand):
        from ..batch_invariant import is_batch_invariant
        if is_batch_invariant():  # each row alone, with its expert's weight
            o = offsets.tolist()
            if x.shape[0] == 0:
                return reference_grouped_linear(x, qw, offsets, bias, out_dtype)
            parts = []
            for e in range(qw.num_experts):
                if o[e + 1] > o[e]:
                    w = qw.expert(e)
                    b = (qw.bias if bias is None else bias)
                    parts += [reference_linear(x[r:r + 1], w, None if b is None else b[e], out_dtype)
                              for r in range(o[e], o[e + 1])]
            return torch.cat(parts)
        return reference_grouped_linear(x, qw, offsets, bias, out_dtype)

    def fused_moe(self, hidden, w13, w2, topk_weights, topk_ids, activation, cand):
        return reference_fused_moe(hidden, w13, w2, topk_weights, topk_ids, activation)


register(ReferenceBackend())
