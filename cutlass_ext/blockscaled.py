"""The sm_100a CUTLASS block-scaled GEMMs (``csrc_sm100/blockscaled_gemm.cu``) from Python, and the writer of the
scale-factor layout they read.

Compiled for Blackwell only (``python3 -m cutlass_ext.build --arch 90,100a``) and never run here (no Blackwell
GPU): CI proves the instantiations compile to tcgen05 block-scaled MMAs (tests/test_cutlass_sm100.py) and that
``sf_offsets`` places every scale where CUTLASS's layout reads it (tests/test_blockscaled_layout.py, against
``Sm1xxBlockScaledConfig::tile_atom_to_shape_SFA / SFB`` evaluated on the host).  The ``blockscaled_cutlass``
kernel family (humming_triton/kernels/families/blockscaled_cutlass.py) routes quant_linear to them, opt-in.

The scale-factor layout (``sf_offsets``; the PTX ISA's "tcgen05 matrix scale factor layout", the 128 x 4 atom
of the block-scaled MMA).  A scale matrix ``S [rows, G]`` (one byte per scale: an e8m0 code for MX, an e4m3 code
for NV; ``G = ceil(K / vec)`` groups of ``vec`` elements along K) is cut into atoms of 128 rows x 4 scale
columns, 512 bytes each.  Atoms are stored K-atom fastest: atom ``(rt, ct)`` starts at byte
``(rt * ceil(G / 4) + ct) * 512``.  Inside an atom, row ``r`` (0..127) = ``32 * r1 + r0`` and column ``c`` (0..3)
sit at ``16 * r0 + 4 * r1 + c``: the four scales of one row in one 32-bit word, the words of rows r0, r0 + 32,
r0 + 64, r0 + 96 adjacent (16 bytes per r0).  Rows are padded to a multiple of 128 and columns to a multiple of 4;
``to_sf_layout`` fills the padding with the code of 1.0 (e8m0 127, e4m3 0x38: ``PAD_CODE``), so a padded scale
can never turn the zeros CUTLASS's TMA loads past M, N or K into a NaN.
"""
from __future__ import annotations

import ctypes

import torch

from . import native

KINDS = {"nvfp4": 0, "mxfp4": 1, "mxfp8_mxfp4": 2, "mxfp8": 3}  # A (activations) x B (weights)
VEC = {"nvfp4": 16, "mxfp4": 32, "mxfp8_mxfp4": 32, "mxfp8": 32}  # K elements per scale
SF_ROWS, SF_COLS = 128, 4  # the scale-factor atom: 128 rows x 4 scale columns
SF_ATOM = SF_ROWS * SF_COLS
PAD_CODE = {"e8m0": 127, "e4m3fn": 0x38}  # 1.0 in each scale format: what padding holds
ABI = 2  # ht_sm100_blockscaled_abi() of the signatures this module calls (1: the unversioned first ones)


def _native():
    """(the native library or None, why not): the getter tests replace with a fake library."""
    why = native.unavailable()
    return (None, why) if why else (native.library(), None)


def unavailable() -> str | None:
    """None when the native library is built with the sm_100a GEMMs of this module's ABI, else why not."""
    lib, why = _native()
    if why:
        return why
    if not hasattr(lib, "ht_sm100_blockscaled_gemm"):
        return ("the native library was built without the sm_100a GEMMs (build with: python3 -m cutlass_ext.build "
                "--arch 90,100a)")
    have = lib.ht_sm100_blockscaled_abi() if hasattr(lib, "ht_sm100_blockscaled_abi") else 1
    if have != ABI:
        return f"the native library's sm_100a GEMMs are stale (ABI {have}, need {ABI}): rebuild it"
    return None


def _lib():
    why = unavailable()
    if why:
        raise RuntimeError(why)
    lib = _native()[0]
    i, p, f = ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    lib.ht_sm100_blockscaled_gemm.argtypes = [i, p, p, p, p, p, p, p, i, i, i, f, p, ctypes.c_size_t, p]
    lib.ht_sm100_blockscaled_gemm.restype = i
    lib.ht_sm100_blockscaled_workspace.argtypes = [i, i, i, i]
    lib.ht_sm100_blockscaled_workspace.restype = ctypes.c_size_t
    lib.ht_sm100_sf_elements.argtypes = [i, i, i, i, ctypes.POINTER(ctypes.c_longlong), ctypes.POINTER(ctypes.c_longlong)]
    return lib


# ---- the scale-factor layout (pure torch, no CUDA) ---------------------------------------------------------------

def sf_groups(k: int, vec: int) -> int:
    return -(-k // vec)


def sf_padded(rows: int, k: int, vec: int) -> tuple[int, int]:
    """(rows, scale columns) of the layout for ``rows`` x ``K``: padded to multiples of 128 and 4."""
    return -(-rows // SF_ROWS) * SF_ROWS, -(-sf_groups(k, vec) // SF_COLS) * SF_COLS


def sf_size(rows: int, k: int, vec: int) -> int:
    """Bytes of a scale tensor in the layout (``sf_elements`` says the same for SFA with rows = M, SFB with N)."""
    r, c = sf_padded(rows, k, vec)
    return r * c


def sf_offsets(rows: int, cols: int) -> torch.Tensor:
    """int64 ``[rows, cols]``: the byte offset of scale ``(row, column)`` in the layout (module docstring); ``rows``
    / ``cols`` may include padding (offsets of padding cells), the atom grid is sized from them rounded up."""
    col_atoms = -(-cols // SF_COLS)
    r = torch.arange(rows, dtype=torch.int64)[:, None]
    c = torch.arange(cols, dtype=torch.int64)[None, :]
    atom = (r // SF_ROWS) * col_atoms + c // SF_COLS
    return atom * SF_ATOM + (r % 32) * 16 + (r // 32 % 4) * 4 + c % SF_COLS


def to_sf_layout(scales: torch.Tensor, k: int, vec: int, pad_code: int) -> torch.Tensor:
    """``scales`` (uint8 codes ``[rows, ceil(K / vec)]``, row-major) -> the flat uint8 layout CUTLASS reads,
    padding holding ``pad_code``.  Two device ops (a padded copy, a permuted copy); no host sync."""
    rows, g = scales.shape
    if g != sf_groups(k, vec):
        raise ValueError(f"{g} scale columns for K={k} in groups of {vec} (want {sf_groups(k, vec)})")
    pr, pc = sf_padded(rows, k, vec)
    padded = torch.full((pr, pc), pad_code, dtype=torch.uint8, device=scales.device)
    padded[:rows, :g] = scales
    # row = 128 rt + 32 r1 + r0, column = 4 ct + c  ->  ((rt, ct), r0, r1, c)
    return padded.view(pr // SF_ROWS, 4, 32, pc // SF_COLS, SF_COLS).permute(0, 3, 2, 1, 4).reshape(-1)


def from_sf_layout(flat: torch.Tensor, rows: int, k: int, vec: int) -> torch.Tensor:
    """The inverse of ``to_sf_layout``: the ``[rows, ceil(K / vec)]`` scales, padding dropped."""
    pr, pc = sf_padded(rows, k, vec)
    if flat.numel() != pr * pc:
        raise ValueError(f"{flat.numel()} bytes, the layout of {rows} x K={k} (vec {vec}) has {pr * pc}")
    blocks = flat.reshape(pr // SF_ROWS, pc // SF_COLS, 32, 4, SF_COLS).permute(0, 3, 2, 1, 4)
    return blocks.reshape(pr, pc)[:rows, :sf_groups(k, vec)]


# ---- the GEMM --------------------------------------------------------------------------------------------------

def sf_elements(kind: str, m: int, n: int, k: int) -> tuple[int, int]:
    """Bytes of SFA and SFB in the instruction's scale layout for an M x N x K problem (the library's answer)."""
    a, b = ctypes.c_longlong(), ctypes.c_longlong()
    if _lib().ht_sm100_sf_elements(KINDS[kind], m, n, k, ctypes.byref(a), ctypes.byref(b)):
        raise ValueError(f"unknown kind {kind!r}")
    return a.value, b.value


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def gemm(kind: str, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, m: int, n: int, k: int,
         alpha: float | torch.Tensor = 1.0, bias: torch.Tensor | None = None,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """``bf16 [M, N] = alpha * (A x SFA) @ (B x SFB)^T + bias`` with K-major packed codes and scales in the layout
    of ``to_sf_layout``.  ``alpha``: a host float or a device fp32 one-element tensor (read by the epilogue on
    the GPU: no host sync); ``bias``: device fp32 ``[N]`` or None; ``out``: a contiguous bf16 ``[M, N]`` to write."""
    lib = _lib()
    dev = a.device
    d = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    if d.dtype != torch.bfloat16 or tuple(d.shape) != (m, n) or not d.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{m}, {n}] tensor")
    if bias is not None and (bias.dtype != torch.float32 or bias.numel() != n or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous fp32 [{n}] tensor")
    alpha_t = alpha if isinstance(alpha, torch.Tensor) else None
    if alpha_t is not None and (alpha_t.dtype != torch.float32 or alpha_t.numel() != 1):
        raise ValueError("a tensor alpha must be one fp32 element")
    for name, t in (("a", a), ("sfa", sfa), ("b", b), ("sfb", sfb), ("out", d), ("bias", bias)):
        if t is not None and t.data_ptr() % 16:  # TMA descriptors need 16-byte aligned bases
            raise ValueError(f"{name} must start on a 16-byte boundary (TMA)")
    ws_bytes = lib.ht_sm100_blockscaled_workspace(KINDS[kind], m, n, k)
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=dev)
    err = lib.ht_sm100_blockscaled_gemm(KINDS[kind], a.data_ptr(), sfa.data_ptr(), b.data_ptr(), sfb.data_ptr(),
                                        d.data_ptr(), _ptr(bias), _ptr(alpha_t), m, n, k,
                                        1.0 if alpha_t is not None else float(alpha), ws.data_ptr(), ws_bytes,
                                        native.current_stream(dev))
    if err:
        raise RuntimeError(f"the CUTLASS sm_100a GEMM refused the problem ({m}x{n}x{k}, {kind}): code {err}")
    return d
