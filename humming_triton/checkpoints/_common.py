"""Shared pieces of the checkpoint importers: tensor access with clear errors, bit helpers, scheme builders.

Every importer builds its layer in two steps: one of two builders here (``int_weight`` / ``float_weight``)
makes the layer from its small tensors (scales, zeros, g_idx, bias, global scales -- read whole, so that every
data-dependent choice below is the whole layer's), with a zero-stride placeholder for the packed codes; then
:func:`finish` reads the codes -- all of them, or only one tensor-parallel rank's window when the ``Tensors``
view carries a ``ShardSpec`` (checkpoints/sharding.py) -- and cuts the small tensors with ``formats.shard``.  One
code path for both is what makes a rank's read equal ``shard(<whole read>, ...)`` exactly.  The builders keep
the choices that make an import *exact* in one place:

* integer codes with a zero point that is the same ``2**(bits-1)`` everywhere are turned into signed codes
  (``q - 2**(bits-1)`` is the two's complement code ``q ^ 2**(bits-1)``, an exact bitwise flip), so symmetric
  GPTQ / compressed-tensors checkpoints need no zero tensor; any other integer zero stays a ``uint8`` zero
  (``zero=int``) or, when a zero does not fit a byte (GPTQ v1's ``2**bits`` quirk at 8 bits), a float zero in
  the scale's dtype (integers up to 2048 are exact in fp16/fp32);
* scales keep the producer's dtype (fp16 / bf16 / fp32) or e8m0 / e4m3 byte codes, never re-rounded.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

import torch

from ..formats.dtypes import FloatType, IntType, WideFloat, parse_element_type
from ..formats.packing import pack_codes, packed_words, unpack_codes
from ..formats.scheme import ActQuant, QuantScheme, ScaleSpec
from ..formats.shard import shard_range
from ..formats.weight import QuantWeight

__all__ = ["CheckpointFormatError", "Tensors", "unpack_along", "bytes_to_words", "e8m0_codes", "wide_scale_type",
           "regroup_by_g_idx", "int_weight", "float_weight", "check_shape", "placeholder", "window_slices", "finish",
           "cut", "ROWS", "fp4_words", "byte_words"]


class CheckpointFormatError(ValueError):
    """A checkpoint does not follow the producer's documented format (missing tensor, wrong shape/dtype...)."""


# safetensors header dtype names (``get_slice(name).get_dtype()``) of the tensors importers ask ``meta`` about
_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


class Tensors:
    """Name -> tensor access over a mapping (or a loader callable) that names what is missing and for which
    layer, instead of a bare KeyError deep inside an importer.

    ``slicer(name)`` gives an object that reads part of a tensor (safetensors ``safe_open(...).get_slice``: its
    ``[index]`` reads only those bytes); ``meta`` and ``read`` use it.  ``shard`` (a ``ShardSpec``) makes this
    one rank's view: the other ranks' per-expert layers are left out of ``keys`` and :func:`finish` reads each
    layer's window."""

    def __init__(self, source: Mapping[str, torch.Tensor] | Callable[[str], torch.Tensor], keys=None, *,
                 slicer: Callable | None = None, shard=None):
        self._get = source.__getitem__ if isinstance(source, Mapping) else source
        self._slice = slicer or self._get
        self.keys = set(source.keys() if keys is None else keys)
        self.shard = shard
        if shard is not None:
            self.keys = shard.select(self.keys)

    def __contains__(self, name: str) -> bool:
        return name in self.keys

    def _need(self, name: str, fmt: str) -> None:
        if name not in self.keys:
            near = sorted(k for k in self.keys if k.rsplit(".", 1)[0] == name.rsplit(".", 1)[0])
            raise CheckpointFormatError(f"{fmt} checkpoint is missing tensor {name!r}"
                                        + (f" (this layer has {near})" if near else ""))

    def get(self, name: str, fmt: str) -> torch.Tensor:
        self._need(name, fmt)
        return self._get(name)

    def opt(self, name: str) -> torch.Tensor | None:
        return self._get(name) if name in self.keys else None

    def meta(self, name: str, fmt: str) -> torch.Tensor:
        """Shape and dtype of a tensor (on the meta device) without reading its data."""
        self._need(name, fmt)
        src = self._slice(name)
        if isinstance(src, torch.Tensor):
            return torch.empty(src.shape, dtype=src.dtype, device="meta")
        dtype = _ST_DTYPES.get(src.get_dtype())
        if dtype is None:  # a dtype this table does not name: safetensors maps it (its tensors are mmap views)
            return self._get(name).to("meta")
        return torch.empty(src.get_shape(), dtype=dtype, device="meta")

    def read(self, name: str, fmt: str, index: tuple | None = None) -> torch.Tensor:
        """``tensor[index]`` reading only those elements where the source can (safetensors ``get_slice``)."""
        self._need(name, fmt)
        return self._get(name) if index is None else self._slice(name)[index]

    def window(self, prefix: str, qw: QuantWeight) -> tuple[str, int, int] | None:
        """``(dim, start, stop)`` of layer ``prefix`` (whole layer ``qw``) this view reads; None: all of it."""
        return None if self.shard is None else self.shard.window(prefix, qw)


def check_shape(t: torch.Tensor, shape, name: str, fmt: str, dtypes=None) -> None:
    if tuple(t.shape) != tuple(shape):
        raise CheckpointFormatError(f"{fmt}: {name} must have shape {list(shape)}, got {list(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise CheckpointFormatError(f"{fmt}: {name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")


def packed_fp4(t, name: str, fmt: str) -> tuple[torch.Tensor, int, int]:
    """uint8 ``[N, K/2]`` bytes of two e2m1 codes (low nibble = even k) -> (their shape on the meta device, N, K)."""
    packed = t.meta(name, fmt)
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise CheckpointFormatError(f"{fmt}: {name} must be uint8 [N, K/2] (two e2m1 codes a byte), got "
                                    f"{packed.dtype} {list(packed.shape)}")
    return packed, packed.shape[0], packed.shape[1] * 2


def unpack_along(words: torch.Tensor, bits: int, count: int, dim: int) -> torch.Tensor:
    """Dense LSB-first int32 bit stream along ``dim`` -> ``count`` codes along ``dim`` (int32)."""
    w = words.to(torch.int32).movedim(dim, -1).contiguous()
    return unpack_codes(w, bits, count).movedim(-1, dim)


def bytes_to_words(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., B]`` -> int32 ``[..., ceil(B/4)]`` with byte ``i`` at bits ``8*(i%4)`` (little-endian by
    arithmetic, not by ``view``, so it holds on any host).  A byte stream of 4-bit codes with the low nibble
    first (nvfp4 / mxfp4 / gpt-oss) is then exactly our canonical K-packed stream."""
    *lead, nb = b.shape
    pad = (-nb) % 4
    x = torch.nn.functional.pad(b.to(torch.int64), (0, pad)).reshape(*lead, -1, 4)
    w = x[..., 0] | (x[..., 1] << 8) | (x[..., 2] << 16) | (x[..., 3] << 24)
    return torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32)


def e8m0_codes(t: torch.Tensor, what: str, fmt: str) -> torch.Tensor:
    """e8m0 scales as uint8 codes: from uint8 bytes, ``torch.float8_e8m0fnu``, or float powers of two."""
    if t.dtype == torch.uint8:
        return t
    if getattr(torch, "float8_e8m0fnu", None) is not None and t.dtype == torch.float8_e8m0fnu:
        return t.view(torch.uint8)
    if t.dtype.is_floating_point:
        v = t.double()
        e = torch.log2(v)
        if not bool(((v > 0) & (e == e.round()) & (e >= -127) & (e <= 127)).all()):
            raise CheckpointFormatError(f"{fmt}: {what} is declared e8m0 (ue8m0) but holds values that are not "
                                        "powers of two in [2^-127, 2^127]")
        return (e.round() + 127).to(torch.uint8)
    raise CheckpointFormatError(f"{fmt}: {what} must be e8m0 (uint8 / float8_e8m0fnu / powers of two), got {t.dtype}")


def wide_scale_type(t: torch.Tensor, what: str, fmt: str) -> WideFloat:
    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    if t.dtype not in names:
        raise CheckpointFormatError(f"{fmt}: {what} must be float32/float16/bfloat16, got {t.dtype}")
    return WideFloat(names[t.dtype])


def regroup_by_g_idx(g_idx: torch.Tensor, k: int, fmt: str) -> tuple[torch.Tensor | None, int | None, torch.Tensor]:
    """Act-order support.  ``g_idx[k]`` names the scale row of input column ``k``.  Sorting K by group (stable)
    makes every group contiguous; when the sorted map is ``j // G`` for one ``G`` (true for GPTQ act-order
    and for plain ``k // G``), the layer is an ordinary group-``G`` layer over permuted K.

    Returns ``(k_perm or None when already sorted, G or None when groups are uneven, sorted g_idx)``.  Uneven
    groups (hand-made g_idx) are still exact: the caller then gives every column its own scale (group 1)."""
    g = g_idx.reshape(-1).long()
    if g.numel() != k:
        raise CheckpointFormatError(f"{fmt}: g_idx must have K={k} entries, got {g.numel()}")
    if g.numel() and int(g.min()) < 0:
        raise CheckpointFormatError(f"{fmt}: g_idx has negative entries")
    perm = torch.argsort(g, stable=True)
    gs = g[perm]
    k_perm = None if torch.equal(perm, torch.arange(k)) else perm
    size = int((gs == gs[0]).sum()) if k else 1
    uniform = int(gs[0]) == 0 and torch.equal(gs, torch.arange(k) // size)
    return k_perm, (size if uniform else None), gs


def _spec(dtype, bn: int, bk: int, n: int, k: int, global_scale: bool = False) -> ScaleSpec:
    """(rows, cols) covered by one scale -> ScaleSpec: (0, 0) tensor, (1, 0) or (1, >=K) channel, else block."""
    if (bn, bk) == (0, 0):
        return ScaleSpec(dtype, 0, 0, global_scale)
    if bn == 1 and (bk == 0 or bk >= k):
        return ScaleSpec(dtype, 1, 0, global_scale)
    return ScaleSpec(dtype, bn, bk, global_scale)


def placeholder(shape) -> torch.Tensor:
    """int32 zeros of ``shape`` that take no memory (stride 0): a layer's codes until :func:`finish` reads them."""
    return torch.zeros((), dtype=torch.int32).expand(*shape)


def int_weight(*, bits: int, n: int, k: int, scales: torch.Tensor, zeros: torch.Tensor | None,
               signed: bool = False, block: tuple[int, int] = (1, 0), k_perm: torch.Tensor | None = None, bias=None,
               act: ActQuant | None = None, input_scale=None, fmt: str = "") -> QuantWeight:
    """Float scales ``[N/bn, K/bk]`` + optional integer zeros of the same shape -> the QuantWeight of an ``[N, K]``
    integer layer with placeholder codes (:func:`finish` reads them).  ``signed`` says the stored codes are
    two's complement (then ``zeros`` must be None).  A zero of ``2**(bits-1)`` everywhere makes a signed scheme:
    ``finish(..., unsigned=True)`` then flips the stored codes (exact, see module doc)."""
    sdt = wide_scale_type(scales, "scales", fmt)
    half = 1 << (bits - 1)
    zero_kind = "none"
    if zeros is not None:
        zeros = zeros.to(torch.int64)
        if signed:
            raise ValueError("int_weight: signed codes take no zero point")
        if bool((zeros == half).all()):
            signed, zeros = True, None
        elif int(zeros.min()) >= 0 and int(zeros.max()) <= 255:
            zero_kind, zeros = "int", zeros.to(torch.uint8)
        elif int(zeros.abs().max()) <= 2048:
            zero_kind, zeros = "float", zeros.to(scales.dtype)
        else:
            raise CheckpointFormatError(f"{fmt}: zero points up to {int(zeros.abs().max())} cannot be represented")
    elif not signed:
        raise ValueError("int_weight: unsigned codes need zero points")
    scheme = QuantScheme(IntType(bits, signed), _spec(sdt, *block, n, k), zero_kind, act)
    return QuantWeight(placeholder((n, packed_words(k, bits))), scales.contiguous(), scheme, (n, k), zeros, None,
                       _scalar(input_scale), bias, k_perm=k_perm)


def float_weight(*, elem: str | FloatType, scales: torch.Tensor, n: int, k: int, lead: tuple[int, ...] = (),
                 scale_dtype=None, block: tuple[int, int] = (1, 0), global_scale: torch.Tensor | None = None,
                 bias=None, act: ActQuant | None = None, input_scale=None, fmt: str = "") -> QuantWeight:
    """Scales (wide float tensor, or uint8 e8m0/e4m3 codes with ``scale_dtype`` naming them) -> the QuantWeight of
    a ``[*lead, N, K]`` float-element layer with placeholder codes (:func:`finish` reads them)."""
    et = parse_element_type(elem) if isinstance(elem, str) else elem
    sdt = parse_element_type(scale_dtype) if scale_dtype else wide_scale_type(scales, "scales", fmt)
    spec = _spec(sdt, *block, n, k, global_scale is not None)
    scheme = QuantScheme(et, spec, "none", act)
    return QuantWeight(placeholder((*lead, n, packed_words(k, et.bits))), scales.contiguous(), scheme,
                       (*lead, n, k), None, global_scale, _scalar(input_scale), bias)


def window_slices(win: tuple[str, int, int] | None, ndim: int, axes: Mapping[str, int],
                  units: Mapping[str, tuple[int, int]] | None = None) -> tuple[slice, ...]:
    """The index of a stored ``ndim``-axis tensor that holds window ``win = (dim, start, stop)`` of the layer
    (everything for None).  ``axes`` maps ``"n"`` / ``"k"`` / ``"expert"`` to the stored axis; ``units[dim] =
    (bits of a code, bits of a stored element)`` for a dense stream of codes along that axis (default one code an
    element).  A start inside a stored element rounds down: the caller trims the extra codes (AWQ's N-packing);
    along K, split points sit on word boundaries (``split_quantum``), so nothing is extra there."""
    idx = [slice(None)] * ndim
    if win is not None:
        dim, a, b = win
        code_bits, unit_bits = (units or {}).get(dim, (1, 1))
        idx[axes[dim]] = slice(a * code_bits // unit_bits, -(-b * code_bits // unit_bits))
    return tuple(idx)


ROWS = {"n": 0, "k": 1}  # the axes of a window in codes stored as rows of N: [N, K words / bytes]


def fp4_words(t: Tensors, name: str, fmt: str) -> Callable:
    """``read_words`` of uint8 ``[N, K/2]`` bytes of two e2m1 codes (low nibble = even k): our 4-bit stream."""
    return lambda win: bytes_to_words(t.read(name, fmt, window_slices(win, 2, ROWS, {"k": (4, 8)})))


def byte_words(t: Tensors, name: str, fmt: str) -> Callable:
    """``read_words`` of ``[N, K]`` one-byte codes (fp8 / int8 bytes, stored as is)."""
    return lambda win: pack_codes(t.read(name, fmt, window_slices(win, 2, ROWS)).view(torch.uint8), 8)


def _windowed(t: Tensors, prefix: str, qw: QuantWeight) -> tuple[tuple[str, int, int] | None, QuantWeight]:
    win = t.window(prefix, qw)
    return win, (qw if win is None else shard_range(qw, *win))


def cut(t: Tensors, prefix: str, qw: QuantWeight) -> QuantWeight:
    """``qw`` (a whole layer, read whole), or the window of it that ``t`` reads: for layouts whose codes cannot
    be read in windows."""
    return _windowed(t, prefix, qw)[1]


def finish(t: Tensors, prefix: str, layer: QuantWeight, read_words: Callable, fmt: str,
           unsigned: bool = False) -> QuantWeight:
    """The layer (``layer``: a builder's result, placeholder codes) or the window of it that ``t`` reads.

    ``read_words(win)`` reads the packed codes of window ``win`` (``(dim, start, stop)``, or None for all) from
    the checkpoint -- only those bytes where the layout allows -- and returns them as canonical K-packed int32
    words of the stored codes; ``unsigned`` says those are offset codes that a signed scheme flips."""
    win, out = _windowed(t, prefix, layer)
    words = read_words(win)
    check_shape(words, out.data.shape, "packed codes", fmt, (torch.int32,))
    s = out.scheme
    if unsigned and isinstance(s.weight, IntType) and s.weight.signed:
        words = words ^ pack_codes(torch.full((1, out.K), 1 << (s.bits - 1), dtype=torch.int32), s.bits)
    return dataclasses.replace(out, data=words.contiguous(), cache={})


def _scalar(t):
    if t is None:
        return None
    t = torch.as_tensor(t, dtype=torch.float32)
    if t.numel() != 1:
        raise CheckpointFormatError(f"input_scale must hold one value (per-tensor), got shape {list(t.shape)}")
    return t.reshape(())


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def is_pow2(x: float) -> bool:
    return x > 0 and math.frexp(x)[0] == 0.5
