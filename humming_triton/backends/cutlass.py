"""The ``cutlass`` backend: CUTLASS GEMMs from ``cutlass_ext`` (``cutlass_mixed``: the sm_90a mixed-input WGMMA
GEMMs), called through ctypes on torch's stream.  Needs the native library built with the CUTLASS sources
(``python3 -m cutlass_ext.build --arch 80,90,90a``); ``auto`` takes its candidates only from the device's measured
table, so an untimed kernel never becomes the default."""
from __future__ import annotations

from ..calls import Call
from . import register
from .cuda import CudaBackend


class CutlassBackend(CudaBackend):
    name = "cutlass"

    def reason(self, call: Call) -> str | None:
        if call.device_type == "cuda":
            from cutlass_ext.mixed_gemm import available
            why = available()
            if why:
                return why
        return super().reason(call)


register(CutlassBackend())
