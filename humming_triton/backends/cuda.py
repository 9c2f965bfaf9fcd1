"""The ``cuda`` backend: hand-written CUDA kernels from ``cutlass_ext`` (``mma_decode`` for dense layers and
``mma_decode_grouped`` for MoE experts at decode batches), called
through ctypes on torch's stream.  Needs the native library built (``python3 -m cutlass_ext.build``); ``auto``
takes its candidates only from the device's measured table."""
from __future__ import annotations

from ..calls import Call
from . import register
from ._families import FamilyBackend


class CudaBackend(FamilyBackend):
    name = "cuda"

    def reason(self, call: Call) -> str | None:
        if call.device_type != "cuda":
            return f"the native CUDA kernels need CUDA tensors (x is on {call.device_type})"
        from cutlass_ext.native import unavailable
        why = unavailable()
        if why:
            return why
        return super().reason(call)

    def grouped_linear(self, x, qw, offsets, bias, out_dtype, cand):
        from ._families import config_of
        cand = cand or self.candidates(_grouped_call(x, qw))[0]
        return self.family(cand).run(x, offsets, qw, bias, out_dtype, config_of(cand), None)

    def plan_grouped(self, x, qw, offsets, bias, out_dtype, cand):
        if not x.is_contiguous() or x.data_ptr() % 16:  # no plan from an odd layout: it would replace a lean one
            return None
        from ._families import config_of
        cand = cand or self.candidates(_grouped_call(x, qw))[0]
        lean = self.family(cand).grouped_runner(x, offsets, qw, bias, out_dtype, config_of(cand))
        return lean if lean is not None else super().plan_grouped(x, qw, offsets, bias, out_dtype, cand)


def _grouped_call(x, qw) -> Call:
    from ..kernels.dense import call_of
    return call_of(x.reshape(-1, x.shape[-1]), qw, "grouped_linear")


register(CudaBackend())
