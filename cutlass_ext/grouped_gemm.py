"""The sm_90a CUTLASS grouped mixed-input GEMM for MoE experts (``csrc_sm90_grouped/grouped_gemm.cu``) from
Python: which expert weights it takes, the one-time repack of a 3-D QuantWeight into its operands, the launch,
and a float64 CPU emulation of what it computes.

``y[r] = x[r] @ W[e]^T`` for rows ``offsets[e] <= r < offsets[e + 1]`` (rows sorted by expert, offsets on the
device, never read on the host): every expert is one problem of CUTLASS's pointer-array grouped kernel, whose
per-expert sizes and pointers a small kernel writes from the offsets on the same stream.  int4 experts with group
scales, or e4m3 rows with a power-of-two row scale (MXFP4 experts); bf16 activations and output.  Built with ``python3 -m cutlass_ext.build --arch 80,90,90a``.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from .mixed_gemm import _workspace, shuffle, unshuffle
from .native import current_stream, library

# format -> (weight codes, the scale type the mainloop multiplies by): 0 int4 x fp32 group scales (q * s exact, one
# rounding to bf16), 10 int4 x bf16 group scales (the scale rounded to bf16 at repack, the product again: two
# roundings, fewer instructions), 6 e4m3 x one bf16 scale per row (group = K; a power of two: exact)
FORMATS = {0: ("int4", torch.float32), 10: ("int4", torch.bfloat16), 11: ("int4", torch.bfloat16),
           6: ("e4m3fn", torch.bfloat16)}
# 11: format 10 with each expert's weight in the shuffled order (mixed_gemm.shuffle; N a multiple of 16)
SHUFFLED = {11}
ROW_EXPONENTS = (-124, 119)  # 2^e times any e4m3 value is a bf16 value (no overflow, no lost subnormal bit)
# variant -> (token tile, K tile, weight rows per tile): HT_SM90G_VARIANTS.  128-row tiles are split by two
# consumer warpgroups (cooperative), 64-row tiles go to one warpgroup at a time (pingpong)
VARIANTS = {0: (32, 128, 128), 1: (64, 128, 128), 2: (128, 64, 128), 3: (256, 64, 128), 4: (64, 128, 64),
            5: (128, 64, 64)}


def weight_reason(scheme, n: int, k: int, dtype: torch.dtype) -> str | None:
    """None when the int4 formats take experts of this scheme and shape with ``dtype`` activations, else why
    not."""
    from humming_triton.formats.dtypes import WideFloat
    if scheme.act is not None:
        return f"{scheme.name} quantizes its activations (this kernel takes bf16 activations)"
    if dtype != torch.bfloat16:
        return f"{dtype} activations (bf16 only)"
    sc = scheme.scale
    if str(scheme.weight) != "int4" or scheme.zero != "none":
        return f"weight {scheme.weight} with zero={scheme.zero} (signed int4 without zero points only)"
    if not isinstance(sc.dtype, WideFloat) or sc.global_scale or sc.block_n != 1 or sc.block_k == 0:
        return f"{scheme.name}: one fp16 / bf16 / fp32 scale per row and K group only"
    if k % 32:
        return f"K={k} is not a multiple of 32 (16-byte weight rows)"
    if n % 8:
        return f"N={n} is not a multiple of 8 (16-byte rows of y and the scales)"
    g = scheme.group_k(k)
    if k % g or g % 64:
        return f"scale group {g} (a multiple of the 64-wide K tile that divides K={k})"
    return None


def variant_reason(variant: int, group: int) -> str | None:
    if variant not in VARIANTS:
        return f"unknown variant {variant} (0..{len(VARIANTS) - 1})"
    if group % VARIANTS[variant][1]:
        return f"scale group {group} is not a multiple of the variant's K tile {VARIANTS[variant][1]}"
    return None


@dataclass
class PackedExperts:
    """Every expert as the kernel takes it (made once per weight, cached on it)."""
    fmt: int
    w: torch.Tensor       # uint8 [E, N, K * bits / 8]: int4 codes' bytes (K-major, low nibble first; SHUFFLED
    #                       formats: each expert's in the shuffled order) or e4m3 bytes
    scales: torch.Tensor  # [E, K / g, N] (N contiguous) in FORMATS[fmt][1]
    experts: int
    n: int
    k: int
    group: int


def repack_experts(qw, fmt: int) -> PackedExperts:
    """The kernel's operands for a 3-D canonical QuantWeight ``[E, N, K]``: the packed codes as they are (bytes of
    the kpack32 words), the scales transposed to N-major per expert and converted to the format's scale type."""
    from humming_triton.formats.weight import decode_scales
    if FORMATS.get(fmt, ("",))[0] != "int4":
        raise ValueError(f"unknown grouped int4 format {fmt} (int4 formats: "
                         f"{sorted(f for f, (w, _) in FORMATS.items() if w == 'int4')})")
    if qw.data.dim() != 3 or qw.k_perm is not None:
        raise ValueError("the CUTLASS grouped GEMM takes 3-D expert weights without act-order")
    e, n, k = qw.shape
    why = weight_reason(qw.scheme, n, k, torch.bfloat16)
    if why:
        raise ValueError(f"the CUTLASS grouped GEMM cannot take this weight: {why}")
    w = qw.data.contiguous().view(torch.uint8)
    if w.shape != (e, n, k // 2):
        raise ValueError(f"packed codes of shape {list(qw.data.shape)} are not {e} x {n} rows of {k // 2} bytes")
    if fmt in SHUFFLED:
        if n % 16:
            raise ValueError(f"format {fmt} stores whole 16-row blocks: N={n} is not a multiple of 16")
        w = shuffle(torch.stack([w & 15, w >> 4], -1).reshape(e, n, k))
    s = decode_scales(qw.scales, qw.scheme).to(torch.float32)  # [E, N, groups]
    return PackedExperts(fmt, w, s.transpose(1, 2).contiguous().to(FORMATS[fmt][1]), e, n, k, qw.scheme.group_k(k))


def pack_e4m3_rows(codes: torch.Tensor, row_scales: torch.Tensor) -> PackedExperts | str:
    """Format 6's operands from experts as e4m3 rows (``codes`` float8_e4m3fn [E, N, K], fp32 ``row_scales``
    [E, N], each a power of two or NaN -- ``scaled_grouped_mm.expert_e4m3_rows``), or why not: a row scale outside
    2^-124 .. 2^119 would make some code's bf16 product inexact."""
    e, n, k = codes.shape
    finite = row_scales[torch.isfinite(row_scales)]
    if finite.numel():
        exps = torch.frexp(finite)[1] - 1
        lo, hi = int(exps.min()), int(exps.max())
        if lo < ROW_EXPONENTS[0] or hi > ROW_EXPONENTS[1]:
            return (f"row scales from 2^{lo} to 2^{hi}: bf16 products are exact for 2^{ROW_EXPONENTS[0]} .. "
                    f"2^{ROW_EXPONENTS[1]} only")
    scales = row_scales.to(torch.bfloat16).reshape(e, 1, n).contiguous()
    return PackedExperts(6, codes.contiguous().view(torch.uint8), scales, e, n, k, k)


def _symbol(what: str, fmt: int, variant: int) -> str:
    return f"ht_sm90_grouped_{what}_{fmt}_v{variant}"


@functools.lru_cache(maxsize=None)
def _bound(lib, fmt: int, what: str, variant: int):
    fn = getattr(lib, _symbol(what, fmt, variant), None)
    if fn is None:
        raise RuntimeError(f"the native library has no {_symbol(what, fmt, variant)}: build it with --arch ...,90a")
    i, p = ctypes.c_int, ctypes.c_void_p
    if what == "gemm":
        fn.argtypes = [p, p, p, p, i, p, i, i, i, i, i, p, ctypes.c_size_t, p]
        fn.restype = i
    else:
        fn.argtypes = [i, i, i]
        fn.restype = ctypes.c_size_t
    return fn


def built_variants(fmt: int) -> list[int]:
    """The variants of ``fmt`` the loaded native library holds ([] without the library)."""
    from .native import unavailable
    if unavailable():
        return []
    lib = library()
    return [v for v in sorted(VARIANTS) if hasattr(lib, _symbol("gemm", fmt, v))]


def available(fmt: int | None = None) -> str | None:
    """None when the loaded native library holds a grouped kernel of ``fmt`` (None: of any format), else why not."""
    from .native import unavailable
    why = unavailable()
    if why:
        return why
    if any(built_variants(f) for f in ([fmt] if fmt is not None else FORMATS)):
        return None
    return (f"the native library was built without the sm_90a CUTLASS grouped GEMM"
            f"{'' if fmt is None else f' of format {fmt}'} (build with --arch 80,90,90a)")


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def run(x: torch.Tensor, p: PackedExperts, offsets: torch.Tensor, out: torch.Tensor, variant: int) -> torch.Tensor:
    """``out[r] = x[r] @ W[e]^T`` for ``offsets[e] <= r < offsets[e + 1]`` on torch's current stream.  ``x``:
    contiguous bf16 [T, K]; ``out``: contiguous bf16 [T, N]; ``offsets``: E + 1 int32 / int64 row offsets on the
    device (0 first, T last; not checked on the host)."""
    why = variant_reason(variant, p.group)
    if why:
        raise ValueError(why)
    t = x.shape[0]
    if x.dtype != torch.bfloat16 or out.dtype != torch.bfloat16:
        raise ValueError(f"the grouped GEMM takes bf16 activations and output (got {x.dtype} -> {out.dtype})")
    if x.shape[1] != p.k or out.shape != (t, p.n) or not x.is_contiguous() or not out.is_contiguous():
        raise ValueError(f"x {list(x.shape)} / out {list(out.shape)} must be contiguous [T, {p.k}] / [T, {p.n}]")
    if offsets.dtype not in (torch.int32, torch.int64) or offsets.numel() != p.experts + 1 or \
            offsets.device != x.device:
        raise ValueError(f"offsets must be {p.experts + 1} int32 / int64 row offsets on {x.device}")
    if t == 0:
        return out
    offsets = offsets.contiguous()
    lib = library()
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    sms = _sm_count(index)
    nbytes = _bound(lib, p.fmt, "workspace", variant)(p.experts, p.group, sms)
    ws = _workspace(x.device, max(nbytes, 1 << 20))  # sized once: a CUDA graph keeps the address it captured
    err = _bound(lib, p.fmt, "gemm", variant)(
        p.w.data_ptr(), p.scales.data_ptr(), x.data_ptr(), offsets.data_ptr(), int(offsets.dtype == torch.int64),
        out.data_ptr(), p.experts, p.n, p.k, p.group, sms, ws.data_ptr(), ws.numel(), current_stream(x.device))
    if err:
        what = {-1: "cannot implement the problem", -2: "workspace too small", -3: "initialize failed",
                -4: "launch failed"}.get(err, f"code {err}")
        raise RuntimeError(f"CUTLASS grouped GEMM (format {p.fmt}, variant {variant}, {p.experts} experts of "
                           f"{p.n}x{p.k}, {t} rows): {what}")
    return out


def emulate(x: torch.Tensor, p: PackedExperts, offsets: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64 from the packed operands alone: each expert's codes read as CUTLASS
    reads the bytes (low nibble first; e4m3 as they are), times the group scale in the format's scale type, rounded to bf16; the
    accumulator rounded to bf16 by the caller's comparison."""
    if p.fmt in SHUFFLED:
        codes = unshuffle(p.w, p.n, p.k).to(torch.int32)
        q = torch.where(codes >= 8, codes - 16, codes).to(p.scales.dtype)
    elif FORMATS[p.fmt][0] == "int4":
        raw = p.w.to(torch.int32)
        codes = torch.stack([raw & 15, raw >> 4], -1).reshape(p.experts, p.n, p.k)
        q = torch.where(codes >= 8, codes - 16, codes).to(p.scales.dtype)
    else:
        q = p.w.view(torch.float8_e4m3fn).to(p.scales.dtype)
    s = p.scales.transpose(1, 2).repeat_interleave(p.group, 2)  # [E, N, K]
    w = (q * s).to(torch.bfloat16).double()
    y = torch.zeros(x.shape[0], p.n, dtype=torch.float64, device=x.device)
    bounds = offsets.tolist()
    for e in range(p.experts):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            y[lo:hi] = x[lo:hi].double() @ w[e].t()
    return y
