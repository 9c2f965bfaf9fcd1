"""Finding, loading and calling the native library (``_build/libht_native.so``, made by ``cutlass_ext.build``)."""
from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

__all__ = ["library_path", "library", "unavailable", "check", "DecodeCall"]

ABI = 8  # ht_decode_mma_abi() of the library this module calls; a stale build is refused, not mis-called


_I, _P, _F = ctypes.c_int, ctypes.c_void_p, ctypes.c_float


class DecodeCall(ctypes.Structure):
    """``HtDecodeCall`` of decode_mma.cu, field for field: one launch of the decode kernel."""
    _fields_ = [(name, _I) for name in ("device", "dtype", "bits", "zero", "unroll", "kw", "tw")] + \
        [(name, _P) for name in ("w", "x", "scales", "zeros", "fp4_scales", "bias")] + \
        [("bias_dtype", _I), ("y", _P)] + \
        [(name, _I) for name in ("out_dtype", "M", "N", "K", "ldx", "ldy", "group_chunks", "groups",
                                 "chunks_per_warp")] + \
        [("out_scale", _F), ("row_scales", _P), ("act_scales", _P), ("act_ld", _I), ("offsets", _P),
         ("offsets_i64", _I), ("experts", _I), ("out_scales", _P), ("routed_rows", _I), ("grid", _I), ("stream", _P)]


def library_path() -> Path:
    return Path(os.environ.get("HT_NATIVE_LIB", Path(__file__).resolve().parent / "_build" / "libht_native.so"))


@functools.lru_cache(maxsize=None)
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    path = library_path()
    if not path.exists():
        return None, f"the native library is not built ({path}; build it with: python3 -m cutlass_ext.build)"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return None, f"the native library {path} does not load: {e}"
    if lib.ht_decode_mma_abi() != ABI:
        return None, f"the native library {path} is stale (ABI {lib.ht_decode_mma_abi()}, need {ABI}): rebuild it"
    lib.ht_decode_mma.argtypes = [ctypes.POINTER(DecodeCall)]
    lib.ht_decode_mma.restype = ctypes.c_int
    lib.ht_error_string.argtypes = [ctypes.c_int]
    lib.ht_error_string.restype = ctypes.c_char_p
    return lib, None


def unavailable() -> str | None:
    """None when the native library is built and loads, else why not."""
    return _load()[1]


def library() -> ctypes.CDLL:
    lib, why = _load()
    if lib is None:
        raise RuntimeError(why)
    return lib


def current_stream(device) -> int:
    """The raw handle of torch's current stream on ``device`` -- without building a ``torch.cuda.Stream`` object
    per launch (Triton's launcher reads it the same way); torch builds without the private call use the public
    one."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def check(err: int, what: str) -> None:
    if err:
        raise RuntimeError(f"{what} failed: CUDA error {err} ({library().ht_error_string(err).decode()})")
