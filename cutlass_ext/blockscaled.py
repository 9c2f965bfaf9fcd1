"""The sm_100a CUTLASS block-scaled GEMMs (``csrc_sm100/blockscaled_gemm.cu``) from Python.

Compiled for Blackwell only (``python3 -m cutlass_ext.build --arch 90,100a``) and never run here (no Blackwell
GPU): CI proves the instantiations compile to tcgen05 block-scaled MMAs; nothing routes to them yet -- dispatch
will once the activation quantizer writes CUTLASS's scale layout and a Blackwell run has timed them.
"""
from __future__ import annotations

import ctypes

import torch

from .native import library

KINDS = {"nvfp4": 0, "mxfp4": 1, "mxfp8_mxfp4": 2, "mxfp8": 3}  # A (activations) x B (weights)


def _lib():
    lib = library()
    if not hasattr(lib, "ht_sm100_blockscaled_gemm"):
        raise RuntimeError("this native library was built without the sm_100a GEMMs (build with --arch ...,100a)")
    i, p, f = ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    lib.ht_sm100_blockscaled_gemm.argtypes = [i, p, p, p, p, p, i, i, i, f, p, ctypes.c_size_t, p]
    lib.ht_sm100_blockscaled_workspace.argtypes = [i, i, i, i]
    lib.ht_sm100_blockscaled_workspace.restype = ctypes.c_size_t
    lib.ht_sm100_sf_elements.argtypes = [i, i, i, i, ctypes.POINTER(ctypes.c_longlong), ctypes.POINTER(ctypes.c_longlong)]
    return lib


def sf_elements(kind: str, m: int, n: int, k: int) -> tuple[int, int]:
    """Bytes of SFA and SFB in the instruction's scale layout for an M x N x K problem."""
    a, b = ctypes.c_longlong(), ctypes.c_longlong()
    if _lib().ht_sm100_sf_elements(KINDS[kind], m, n, k, ctypes.byref(a), ctypes.byref(b)):
        raise ValueError(f"unknown kind {kind!r}")
    return a.value, b.value


def gemm(kind: str, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, m: int, n: int, k: int,
         alpha: float = 1.0) -> torch.Tensor:
    """``bf16 [M, N] = alpha * (A x SFA) @ (B x SFB)^T`` with K-major packed codes and CUTLASS-layout scales."""
    lib = _lib()
    d = torch.empty(m, n, dtype=torch.bfloat16, device=a.device)
    ws_bytes = lib.ht_sm100_blockscaled_workspace(KINDS[kind], m, n, k)
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=a.device)
    err = lib.ht_sm100_blockscaled_gemm(KINDS[kind], a.data_ptr(), sfa.data_ptr(), b.data_ptr(), sfb.data_ptr(),
                                        d.data_ptr(), m, n, k, alpha, ws.data_ptr(), ws_bytes,
                                        torch.cuda.current_stream(a.device).cuda_stream)
    if err:
        raise RuntimeError(f"the CUTLASS sm_100a GEMM refused the problem ({m}x{n}x{k}, {kind}): code {err}")
    return d
