"""``dequant_mm`` (torch backend): dequantize the weight once per call with our Triton kernel, then cuBLAS
(``F.linear``) -- for quantized-activation schemes x is quantized and dequantized first, as the scheme says.
Where prefill is compute-bound this is cuBLAS's speed plus one pass over the weight."""
from __future__ import annotations

from ...calls import Call, KernelConfig
from . import Family, register


class DequantMM(Family):
    name = "dequant_mm"
    backend = "torch"

    def reason(self, call: Call) -> str | None:
        from .. import supports
        if call.scheme.act is not None:
            a = call.scheme.act
            if str(a.dtype) not in ("e4m3fn", "int8", "e2m1"):
                return f"no Triton quantizer for {a.dtype} activations"
            return supports(call.op, call.scheme, call.dtype)
        return supports(call.op, call.scheme, call.dtype)

    def candidates(self, call: Call) -> list[KernelConfig]:
        return [KernelConfig("dequant_mm", 1, 32, 128)]

    def run(self, x, x2, qw, bias, out_dtype, cfg, out):
        from ..dense import dequant_linear
        return dequant_linear(x, x2, qw, bias, out_dtype, cfg, out)


register(DequantMM())
