"""The sm_90a CUTLASS mixed-input GEMMs (``csrc_sm90/mixed_gemm.cu``) from Python: which weights they take, the
one-time repack of a QuantWeight into their operands, the launch, and a float64 CPU emulation of what they
compute (the tests check the repack with it; a GPU test checks the kernels against the reference).

``y[T, N] = x[T, K] @ W^T + bias`` runs as ``D[N, T] = W @ x^T`` with D column-major (= y row-major): the weight is
the register-sourced WGMMA operand, converted in registers; the tokens are the MMA's N side.  Built with
``python3 -m cutlass_ext.build --arch 80,90,90a``.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from .native import current_stream, library

# id -> (weight type, activation dtype, scaling): the HT_SM90_FORMATS table of csrc_sm90/mixed_gemm.cu
# (tests/test_cutlass_sm90.py checks the two agree).  "group": the mainloop multiplies by the group scale
# ("group_zero": and adds the folded zero -z * s); "channel": the fp32 row scale multiplies the accumulator.
FORMATS = {
    0: ("int4", torch.bfloat16, "group"), 1: ("int4", torch.float16, "group"),
    2: ("uint4", torch.bfloat16, "group_zero"), 3: ("uint4", torch.float16, "group_zero"),
    4: ("int8", torch.bfloat16, "channel"), 5: ("int8", torch.float16, "channel"),
    6: ("e4m3fn", torch.bfloat16, "channel"), 7: ("e4m3fn", torch.float16, "channel"),
    8: ("int4", torch.bfloat16, "channel"), 9: ("int4", torch.float16, "channel"),
    10: ("int4", torch.bfloat16, "group"),  # bf16 scales: never format_of's choice (two roundings), a family's
    11: ("int4", torch.bfloat16, "group"),  # format 10 with the weight in SHUFFLED order
}
# formats whose weight is stored in the order the mainloop consumes it (``shuffle``), not row-major
SHUFFLED = {11}
# the group-scale type of each format: fp32 for bf16 activations (exact q * s + z', one rounding to bf16),
# the activation's fp16 for fp16 (exact only for fp16 scheme scales without zero points)
GROUP_SCALE_DTYPE = {0: torch.float32, 1: torch.float16, 2: torch.float32, 3: torch.float32, 10: torch.bfloat16,
                     11: torch.bfloat16}
# formats format_of never picks: the same weight runs exactly on another, these trade a rounding for speed
INEXACT_FORMATS = {10: 0, 11: 0}
# variant -> (token tile, K tile, stream-K, weight rows per tile): HT_SM90_VARIANTS.  128-row tiles are split by
# two consumer warpgroups (cooperative), 64-row tiles go to one warpgroup at a time (pingpong)
VARIANTS = {0: (16, 128, False, 128), 1: (32, 128, False, 128), 2: (64, 128, False, 128), 3: (128, 64, False, 128),
            4: (256, 64, False, 128), 5: (16, 128, True, 128), 6: (128, 64, True, 128),
            7: (16, 128, False, 64), 8: (32, 128, False, 64), 9: (64, 128, False, 64),
            10: (256, 64, True, 128), 11: (256, 64, False, 64), 12: (64, 128, True, 128), 13: (32, 128, True, 128)}


def format_of(scheme, dtype: torch.dtype) -> tuple[int | None, str | None]:
    """(format id, None) for a weight scheme and activation dtype these kernels run, else (None, why not)."""
    from humming_triton.formats.dtypes import WideFloat
    if scheme.act is not None:
        return None, f"{scheme.name} quantizes its activations (these kernels take 16-bit activations)"
    if dtype not in (torch.bfloat16, torch.float16):
        return None, f"{dtype} activations (bf16 / fp16 only)"
    sc = scheme.scale
    if not isinstance(sc.dtype, WideFloat) or sc.global_scale:
        return None, f"{sc.dtype} scales{' with a global scale' if sc.global_scale else ''} (fp16 / bf16 / fp32 only)"
    if sc.block_n != 1:
        return None, f"scale blocks of {sc.block_n or 'all'} rows (one scale per row and group only)"
    w, zero = str(scheme.weight), scheme.zero
    scaling = "channel" if sc.block_k == 0 else ("group_zero" if zero == "int" else "group")
    if zero == "float" or (zero == "int" and (w != "uint4" or scaling == "channel")):
        return None, f"weight {w} with zero={zero} (integer zero points on uint4 group-scaled weights only)"
    if zero == "none" and w == "uint4":
        return None, "uint4 without a zero point"
    for fmt, (fw, fd, fs) in FORMATS.items():
        if (fw, fd, fs) == (w, dtype, scaling) and fmt not in INEXACT_FORMATS:
            if fmt == 1 and str(sc.dtype) != "fp16":
                return None, f"{sc.dtype} group scales with fp16 activations (fp16 scales only: exact products)"
            return fmt, None
    return None, f"weight {w} with {scaling.replace('_', ' + ')} scales and {dtype} activations (no such kernel)"


def weight_reason(scheme, n: int, k: int, dtype: torch.dtype) -> str | None:
    """None when a kernel takes this weight and activation dtype, else why not (shape rules: TMA needs 16-byte
    rows of W, x, y and the [K / g, N] scales; groups span whole K tiles)."""
    fmt, why = format_of(scheme, dtype)
    if why:
        return why
    bits = scheme.bits
    if k % (128 // bits) or k % 8:
        return f"K={k} is not a multiple of {max(128 // bits, 8)} (16-byte weight and activation rows)"
    if n % 8:
        return f"N={n} is not a multiple of 8 (16-byte rows of y and the scales)"
    if FORMATS[fmt][2] != "channel":
        g = scheme.group_k(k)
        if k % g or g % 64:
            return f"scale group {g} (a multiple of the 64-wide K tile that divides K={k})"
    return None


def variant_reason(variant: int, group: int) -> str | None:
    """Why a variant cannot take a weight whose scale groups are ``group`` wide (0: channel scales)."""
    if variant not in VARIANTS:
        return f"unknown variant {variant} (0..{len(VARIANTS) - 1})"
    if group and group % VARIANTS[variant][1]:
        return f"scale group {group} is not a multiple of the variant's K tile {VARIANTS[variant][1]}"
    return None


def _block_offsets(device=None) -> torch.Tensor:
    """[16, 16] int64: where (row, k) of a 16 x 16 weight block lies in the shuffled order (``ShuffleBlock`` of
    csrc_sm90/mixed_gemm.cu): lane ``4 (row % 8) + (k % 8) / 2`` of the warp holds its 8 values of one k-block in
    32 contiguous bits, fragment value ``v = k % 2 + 2 (row / 8) + 4 (k / 8)`` at position ``4 (v % 2) + v / 2``."""
    r = torch.arange(16, device=device).view(16, 1)
    k = torch.arange(16, device=device).view(1, 16)
    return 32 * (r % 8) + r // 8 + 4 * (k % 2) + 8 * ((k // 2) % 4) + 2 * (k // 8)


def shuffle(codes: torch.Tensor) -> torch.Tensor:
    """int4 codes (``[..., N, K]`` uint8 nibbles 0..15, N and K multiples of 16; leading dims: experts, each
    shuffled on its own) -> the shuffled order's bytes (uint8 ``[..., N, K / 2]``; two values per byte, the lower
    offset in the low nibble): 16 x 16 blocks tiled rows first (block (r, c) at value offset 256 (r + c N / 16)),
    each block's values placed by ``_block_offsets``."""
    *lead, n, k = codes.shape
    if n % 16 or k % 16:
        raise ValueError(f"the shuffled order takes whole 16 x 16 blocks (got N={n}, K={k})")
    d = len(lead)
    blocks = codes.reshape(*lead, n // 16, 16, k // 16, 16)
    blocks = blocks.permute(*range(d), d + 2, d, d + 1, d + 3).reshape(*lead, k // 16, n // 16, 256)
    flat = torch.empty_like(blocks)
    flat[..., _block_offsets(codes.device).reshape(-1)] = blocks
    flat = flat.reshape(*lead, n * k)
    return (flat[..., 0::2] | (flat[..., 1::2] << 4)).reshape(*lead, n, k // 2)


def unshuffle(data: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """``shuffle``'s inverse: the shuffled bytes (``[..., N, K / 2]``) -> ``[..., N, K]`` uint8 nibbles in row-major
    order."""
    lead = data.shape[:-2]
    d = len(lead)
    flat = torch.stack([data & 15, data >> 4], -1).reshape(*lead, k // 16, n // 16, 256)
    blocks = flat[..., _block_offsets(data.device).reshape(-1)].reshape(*lead, k // 16, n // 16, 16, 16)
    return blocks.permute(*range(d), d + 1, d + 2, d, d + 3).reshape(*lead, n, k)


@dataclass
class Packed:
    """One weight as the kernels take it (made once per weight and activation dtype, cached on the weight)."""
    fmt: int
    w: torch.Tensor              # uint8 [N, K * bits / 8]: the canonical codes' bytes (K-major, low nibble first),
    #                              or for SHUFFLED formats the same bytes in the shuffled order
    scales: torch.Tensor         # group: [K / g, N] (N contiguous) in GROUP_SCALE_DTYPE; channel: fp32 [N]
    zeros: torch.Tensor | None   # group_zero: -z * s, like scales
    n: int
    k: int
    group: int                   # 0: channel scales


def repack(qw, dtype: torch.dtype, fmt: int | None = None) -> Packed:
    """The kernels' operands for a 2-D canonical QuantWeight: the packed codes are used as they are (the kpack32
    words viewed as bytes are the K-major sub-byte layout CUTLASS reads); only the scales are transposed (the
    mixed-input mainloop reads them N-major) and converted.  ``fmt``: an INEXACT_FORMATS format in place of the
    exact one format_of picks."""
    from humming_triton.formats.weight import decode_scales
    why = weight_reason(qw.scheme, qw.N, qw.K, dtype)
    if why or qw.data.dim() != 2 or qw.k_perm is not None:
        raise ValueError(f"the CUTLASS mixed-input GEMM cannot take this weight: "
                         f"{why or ('a 3-D (expert) weight' if qw.data.dim() != 2 else 'act-order (k_perm)')}")
    exact, _ = format_of(qw.scheme, dtype)
    if fmt is not None and INEXACT_FORMATS.get(fmt) != exact:
        raise ValueError(f"format {fmt} is no faster twin of this weight's format {exact} "
                         f"(twins: {INEXACT_FORMATS})")
    fmt = exact if fmt is None else fmt
    n, k, bits = qw.N, qw.K, qw.scheme.bits
    w = qw.data.contiguous().view(torch.uint8)
    if w.shape != (n, k * bits // 8):
        raise ValueError(f"packed codes of shape {list(qw.data.shape)} are not {n} rows of {k * bits // 8} bytes")
    if fmt in SHUFFLED:
        if n % 16:
            raise ValueError(f"format {fmt} stores whole 16-row blocks: N={n} is not a multiple of 16")
        w = shuffle(torch.stack([w & 15, w >> 4], -1).reshape(n, k))
    s = decode_scales(qw.scales, qw.scheme).to(torch.float32)  # [N, groups]
    if FORMATS[fmt][2] == "channel":
        return Packed(fmt, w, s.reshape(n).contiguous(), None, n, k, 0)
    g = qw.scheme.group_k(k)
    sdt = GROUP_SCALE_DTYPE[fmt]
    zeros = None
    if FORMATS[fmt][2] == "group_zero":
        zeros = (-qw.zeros.to(torch.float32) * s).t().contiguous().to(sdt)
    return Packed(fmt, w, s.t().contiguous().to(sdt), zeros, n, k, g)


def _lib():
    lib = library()
    return lib


def _symbols(fmt: int, what: str, variant: int) -> tuple[str, str]:
    """The exported names that can hold a (format, variant): one unit per kernel (``--split-variants``), or one
    per format."""
    return f"ht_sm90_mixed_{what}_{fmt}_v{variant}", f"ht_sm90_mixed_{what}_{fmt}"


def _fn(fmt: int, what: str, variant: int):
    """The C function of a (format, variant) in the loaded library, its ctypes signature set once per library
    (not on every call)."""
    return _bound(_lib(), fmt, what, variant)


@functools.lru_cache(maxsize=None)
def _bound(lib, fmt: int, what: str, variant: int):
    names = _symbols(fmt, what, variant)
    fn = next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
    if fn is None:
        raise RuntimeError(f"the native library has no {' / '.join(names)}: build it with --arch ...,90a")
    i, p = ctypes.c_int, ctypes.c_void_p
    if what == "gemm":
        fn.argtypes = [i, p, p, p, p, p, p, i, i, i, i, p, ctypes.c_size_t, p]
        fn.restype = i
    else:
        fn.argtypes = [i, i, i, i, i]
        fn.restype = ctypes.c_size_t
    return fn


def available(fmt: int | None = None) -> str | None:
    """None when the loaded native library has the sm_90a mixed-input GEMM of format ``fmt`` (None: any of them),
    else why not."""
    from .native import unavailable
    why = unavailable()
    if why:
        return why
    lib = _lib()
    have = [f for f in FORMATS if any(hasattr(lib, n) for v in VARIANTS for n in _symbols(f, "gemm", v))]
    if (fmt is None and have) or fmt in have:
        return None
    return (f"the native library was built without the sm_90a CUTLASS GEMM{'s' if fmt is None else f' of format {fmt}'}"
            f" (build with --arch 80,90,90a)")


def built_variants(fmt: int) -> list[int]:
    """The variants of ``fmt`` the loaded library holds (all of them for a per-format unit; a partial
    ``--split-variants`` build may hold fewer); [] without the library."""
    from .native import unavailable
    if unavailable():
        return []
    lib = _lib()
    if hasattr(lib, f"ht_sm90_mixed_gemm_{fmt}"):
        return sorted(VARIANTS)
    return [v for v in sorted(VARIANTS) if hasattr(lib, f"ht_sm90_mixed_gemm_{fmt}_v{v}")]


_WORKSPACES: dict = {}
_OUTGROWN: list = []  # buffers a larger one replaced: kept, since a captured CUDA graph may still use them


def _workspace(device, nbytes: int) -> torch.Tensor:
    """A per-device scratch buffer that only grows (stream-K's partial tiles, the grouped GEMM's per-expert
    arrays; reused across calls on the stream)."""
    ws = _WORKSPACES.get(device)
    if ws is None or ws.numel() < nbytes:
        if ws is not None:
            _OUTGROWN.append(ws)
        ws = _WORKSPACES[device] = torch.empty(max(nbytes, 256), dtype=torch.uint8, device=device)
    return ws


def run(x2: torch.Tensor, p: Packed, bias: torch.Tensor | None, out: torch.Tensor, variant: int = 0) -> torch.Tensor:
    """``out[T, N] = x2[T, K] @ W^T (+ bias)`` on torch's current stream.  ``x2``: contiguous [T, K] in the
    format's activation dtype; ``out``: contiguous [T, N] in the same dtype; ``bias``: [N] or None."""
    _, dtype, _ = FORMATS[p.fmt]
    t = x2.shape[0]
    why = variant_reason(variant, p.group)
    if why:
        raise ValueError(why)
    if x2.dtype != dtype or out.dtype != dtype:
        raise ValueError(f"format {p.fmt} takes {dtype} activations and output (got {x2.dtype} -> {out.dtype})")
    if x2.shape[1] != p.k or out.shape != (t, p.n) or not x2.is_contiguous() or not out.is_contiguous():
        raise ValueError(f"x {list(x2.shape)} / out {list(out.shape)} must be contiguous [T, {p.k}] / [T, {p.n}]")
    if bias is not None and (bias.dtype != dtype or bias.shape != (p.n,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous {dtype} [{p.n}]")
    if t == 0:
        return out
    nbytes = _fn(p.fmt, "workspace", variant)(variant, p.n, t, p.k, p.group or p.k)
    ws = _workspace(x2.device, nbytes)
    err = _fn(p.fmt, "gemm", variant)(variant, p.w.data_ptr(), p.scales.data_ptr(),
                             None if p.zeros is None else p.zeros.data_ptr(), x2.data_ptr(),
                             None if bias is None else bias.data_ptr(), out.data_ptr(), p.n, t, p.k,
                             p.group or p.k, ws.data_ptr(), ws.numel(), current_stream(x2.device))
    if err:
        what = {-1: "cannot implement the problem", -2: "workspace too small", -3: "initialize failed",
                -4: "launch failed", -9: "unknown variant"}.get(err, f"code {err}")
        raise RuntimeError(f"CUTLASS mixed-input GEMM (format {p.fmt}, variant {variant}, {t}x{p.n}x{p.k}): {what}")
    return out


def emulate(x2: torch.Tensor, p: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the kernel computes, in float64 from the packed operands alone: the codes read as CUTLASS reads the
    bytes (sub-byte elements low bits first), converted and scaled in the mainloop's types (group formats: the
    product ``q * s (+ z')`` in the scale type, rounded to the activation type) or exactly (channel formats: the
    row scale multiplies the accumulator), the accumulator rounded to the activation type after bias."""
    from humming_triton.formats.dtypes import parse_element_type
    wname, dtype, scaling = FORMATS[p.fmt]
    raw = p.w.to(torch.int32)
    if p.fmt in SHUFFLED:
        codes = unshuffle(p.w, p.n, p.k).to(torch.int32)
        q = torch.where(codes >= 8, codes - 16, codes).to(torch.float64)
    elif wname in ("int4", "uint4"):
        codes = torch.stack([raw & 15, raw >> 4], -1).reshape(p.n, p.k)
        q = torch.where(codes >= 8, codes - 16, codes) if wname == "int4" else codes
        q = q.to(torch.float64)
    elif wname == "int8":
        q = torch.where(raw >= 128, raw - 256, raw).to(torch.float64)
    else:
        q = parse_element_type(wname).decode(raw).to(torch.float64)
    if scaling == "channel":
        acc = x2.double() @ q.to(dtype).double().t()  # the conversion is exact
        acc = acc * p.scales.double()[None, :]
    else:
        sdt = p.scales.dtype
        s = p.scales.t().repeat_interleave(p.group, 1)  # [N, K]
        w = q.to(sdt) * s
        if p.zeros is not None:
            w = w + p.zeros.t().repeat_interleave(p.group, 1)
        acc = x2.double() @ w.to(dtype).double().t()
    if bias is not None:
        acc = acc + bias.double()[None, :]
    return acc
