"""The ``reference`` backend: float32/float64 torch math on any device -- the oracle every kernel is tested
against and the CPU fallback.  Never ``auto``'s choice on CUDA while a measured kernel can run."""
from __future__ import annotations

from ..calls import Call
from ..reference import reference_fused_moe, reference_grouped_linear, reference_linear
from . import Backend, register


class ReferenceBackend(Backend):
    name = "reference"
    auto = False

    def reason(self, call: Call) -> str | None:
        return None

    def quant_linear(self, x, qw, bias, out_dtype, cand):
        return reference_linear(x, qw, bias, out_dtype)

    def grouped_linear(self, x, qw, offsets, bias, out_dtype, cand):
        return reference_grouped_linear(x, qw, offsets, bias, out_dtype)

    def fused_moe(self, hidden, w13, w2, topk_weights, topk_ids, activation, cand):
        return reference_fused_moe(hidden, w13, w2, topk_weights, topk_ids, activation)


register(ReferenceBackend())
