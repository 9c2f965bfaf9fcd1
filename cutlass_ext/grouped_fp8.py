"""The sm_90a CUTLASS grouped fp8 GEMM for MoE experts (``csrc_sm90_grouped_fp8/grouped_fp8_gemm.cu``) from
Python: the launch, and a float64 CPU emulation of what it computes.

``y[r] = bf16((xq[r] @ wq[e]^T) * sw[e] * sx[r])`` for rows ``offsets[e] <= r < offsets[e + 1]``: e4m3 activation
codes with fp32 per-token scales, e4m3 expert codes with fp32 per-row scales (W8A8-FP8 experts as stored, W4A8-MXFP4
experts as their exact e4m3 rows), fp32 accumulation promoted every 128 of K, bf16 output.  Offsets stay on the
device.  Built with ``python3 -m cutlass_ext.build --arch 80,90,90a``.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from .grouped_gemm import _sm_count
from .mixed_gemm import _workspace
from .native import current_stream, library

# variant -> (token tile, K tile, weight rows per tile): HT_SM90F8_VARIANTS (128-row tiles cooperative, 64 pingpong)
VARIANTS = {0: (64, 128, 128), 1: (128, 128, 128), 2: (256, 128, 128), 3: (128, 128, 64), 4: (32, 128, 128)}


def _symbol(what: str, variant: int) -> str:
    return f"ht_sm90_grouped_fp8_{what}_v{variant}"


@functools.lru_cache(maxsize=None)
def _bound(lib, what: str, variant: int):
    fn = getattr(lib, _symbol(what, variant), None)
    if fn is None:
        raise RuntimeError(f"the native library has no {_symbol(what, variant)}: build it with --arch ...,90a")
    i, p = ctypes.c_int, ctypes.c_void_p
    if what == "gemm":
        fn.argtypes = [p, p, p, p, p, i, p, i, i, i, i, p, ctypes.c_size_t, p]
        fn.restype = i
    else:
        fn.argtypes = [i, i]
        fn.restype = ctypes.c_size_t
    return fn


def built_variants() -> list[int]:
    """The variants the loaded native library holds ([] without the library)."""
    from .native import unavailable
    if unavailable():
        return []
    lib = library()
    return [v for v in sorted(VARIANTS) if hasattr(lib, _symbol("gemm", v))]


def available() -> str | None:
    """None when the loaded native library holds the grouped fp8 GEMM, else why not."""
    from .native import unavailable
    why = unavailable()
    if why:
        return why
    return None if built_variants() else \
        "the native library was built without the sm_90a CUTLASS grouped fp8 GEMM (build with --arch 80,90,90a)"


def shape_reason(n: int, k: int) -> str | None:
    """Why experts of N x K cannot run here (TMA: 16-byte rows of codes, of the bf16 output), or None."""
    if k % 16 or n % 8:
        return f"N={n}, K={k}: K a multiple of 16 (16-byte rows of e4m3 codes), N of 8 (16-byte bf16 rows)"
    return None


def run(xq: torch.Tensor, x_scales: torch.Tensor, wq: torch.Tensor, w_scales: torch.Tensor, offsets: torch.Tensor,
        out: torch.Tensor, variant: int) -> torch.Tensor:
    """``out[r] = bf16((xq[r] @ wq[e]^T) * w_scales[e] * x_scales[r])`` on torch's current stream.  ``xq``:
    contiguous e4m3 (or its uint8 bytes) [T, K]; ``x_scales``: contiguous fp32 [T] (or [T, 1]); ``wq``: contiguous
    e4m3 / uint8 [E, N, K]; ``w_scales``: contiguous fp32 [E, N]; ``offsets``: E + 1 int32 / int64 row offsets on
    the device (0 first, T last; not checked on the host); ``out``: contiguous bf16 [T, N]."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown grouped fp8 variant {variant} ({sorted(VARIANTS)})")
    t, k = xq.shape
    e, n, kw = wq.shape
    byte = (torch.uint8, torch.float8_e4m3fn)
    if xq.dtype not in byte or wq.dtype not in byte:
        raise ValueError(f"codes must be e4m3 (or their bytes), not {xq.dtype} / {wq.dtype}")
    if kw != k or out.shape != (t, n) or out.dtype != torch.bfloat16:
        raise ValueError(f"x {list(xq.shape)}, experts {list(wq.shape)}, out {list(out.shape)} {out.dtype}: "
                         f"want x [T, K], experts [E, N, K], out bf16 [T, N]")
    if x_scales.numel() != t or w_scales.shape != (e, n) or x_scales.dtype != torch.float32 or \
            w_scales.dtype != torch.float32:
        raise ValueError(f"scales must be fp32 [{t}] per token and [{e}, {n}] per expert row, not "
                         f"{x_scales.dtype} {list(x_scales.shape)} / {w_scales.dtype} {list(w_scales.shape)}")
    if not all(a.is_contiguous() for a in (xq, x_scales, wq, w_scales, out)):
        raise ValueError("x, experts, scales and out must be contiguous")
    if offsets.dtype not in (torch.int32, torch.int64) or offsets.numel() != e + 1 or offsets.device != xq.device:
        raise ValueError(f"offsets must be {e + 1} int32 / int64 row offsets on {xq.device}")
    why = shape_reason(n, k)
    if why:
        raise ValueError(why)
    if t == 0:
        return out
    offsets = offsets.contiguous()
    lib = library()
    index = xq.device.index if xq.device.index is not None else torch.cuda.current_device()
    sms = _sm_count(index)
    ws = _workspace(xq.device, max(_bound(lib, "workspace", variant)(e, sms), 1 << 20))
    err = _bound(lib, "gemm", variant)(
        wq.data_ptr(), w_scales.data_ptr(), xq.data_ptr(), x_scales.data_ptr(), offsets.data_ptr(),
        int(offsets.dtype == torch.int64), out.data_ptr(), e, n, k, sms, ws.data_ptr(), ws.numel(),
        current_stream(xq.device))
    if err:
        what = {-1: "cannot implement the problem", -2: "workspace too small", -3: "initialize failed",
                -4: "launch failed"}.get(err, f"code {err}")
        raise RuntimeError(f"CUTLASS grouped fp8 GEMM (variant {variant}, {e} experts of {n}x{k}, {t} rows): {what}")
    return out


def emulate(xq: torch.Tensor, x_scales: torch.Tensor, wq: torch.Tensor, w_scales: torch.Tensor,
            offsets: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64 on the CPU from the same operands (before the bf16 rounding)."""
    xv = xq.view(torch.float8_e4m3fn).double().cpu()
    wv = wq.view(torch.float8_e4m3fn).double().cpu()
    sx, sw, off = x_scales.double().cpu().reshape(-1), w_scales.double().cpu(), offsets.cpu().tolist()
    y = torch.zeros(xv.shape[0], wv.shape[1], dtype=torch.float64)
    for e in range(wv.shape[0]):
        rows = slice(off[e], off[e + 1])
        y[rows] = (xv[rows] @ wv[e].T) * sw[e] * sx[rows, None]
    return y
