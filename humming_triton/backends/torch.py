"""The ``torch`` backend: torch's own GEMMs composed around our Triton quantize / dequantize kernels --
dequantize + cuBLAS (``dequant_mm``), dequantize + ``torch._grouped_mm`` (``dequant_grouped_mm``) and
``torch._scaled_mm`` on our e4m3 codes (``scaled_mm``).  First-class candidates of the measured table: where
cuBLAS is faster than our kernels, ``auto`` takes it."""
from __future__ import annotations

from ..calls import Call, Candidate, interpreting
from . import register
from ._families import FamilyBackend, config_of


class TorchBackend(FamilyBackend):
    name = "torch"

    def reason(self, call: Call) -> str | None:
        if call.device_type != "cuda" and not interpreting():
            return f"the torch-composed paths run our Triton dequantize kernel: CUDA tensors (x is on {call.device_type})"
        if call.op == "fused_moe":
            return "fused_moe runs on the triton or reference backend"
        return super().reason(call)

    def default(self, call: Call) -> Candidate | None:
        """Used only when no Triton family can run a call on an untuned device (dispatch step 3)."""
        cands = self.candidates(call)
        return cands[0] if cands else None

    def quant_linear(self, x, qw, bias, out_dtype, cand):
        return super().quant_linear(x, qw, bias, out_dtype, cand or self.candidates(_call(x, qw))[0])

    def grouped_linear(self, x, qw, offsets, bias, out_dtype, cand):
        cand = cand or self.candidates(_call(x, qw, "grouped_linear"))[0]
        return self.family(cand).run(x, offsets, qw, bias, out_dtype, config_of(cand), None)


def _call(x, qw, op: str = "quant_linear") -> Call:
    from ..kernels.dense import call_of
    return call_of(x.reshape(-1, x.shape[-1]), qw, op)


register(TorchBackend())
