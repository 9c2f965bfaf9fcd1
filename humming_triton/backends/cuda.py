"""The ``cuda`` backend: hand-written CUDA kernels from ``cutlass_ext`` (today the ``mma_decode`` family), called
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


register(CudaBackend())
