"""The canonical bit packing of QuantWeight codes.

Codes of ``bits`` bits are packed **along K** (the last axis) into little-endian ``int32`` words as one dense
bit stream per row: element ``k`` of a row occupies stream bits ``[k*bits, (k+1)*bits)``, bit ``i`` of the
stream is bit ``i % 32`` of word ``i // 32``.  For 1/2/4/8 bits this is the familiar "LSB first, 32/bits
values per word"; for 3/5/6/7 bits values cross word boundaries (no padding).  A row of K elements takes
``ceil(K*bits/32)`` words; unused high bits of the last word are zero.

Why along K: decode kernels stream each weight row contiguously, and K-packing keeps a group's codes in a
few adjacent words.  Kernel-specific layouts (interleaving, transposition) are cached views made from this.
"""
from __future__ import annotations

import torch

__all__ = ["packed_words", "pack_codes", "unpack_codes"]


def packed_words(k: int, bits: int) -> int:
    """Number of int32 words that hold ``k`` codes of ``bits`` bits."""
    return (k * bits + 31) // 32


_CHUNK_ROWS = 1024  # bounds temporary memory when packing large (e.g. 8192x8192) weights


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``[..., K]`` integer codes in ``[0, 2**bits)`` -> ``[..., ceil(K*bits/32)]`` int32 words."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError(f"codes must be an integer tensor, got {codes.dtype}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= (1 << bits)):
        raise ValueError(f"codes out of range for {bits}-bit packing: [{int(codes.min())}, {int(codes.max())}]")
    *lead, k = codes.shape
    nwords = packed_words(k, bits)
    flat = codes.reshape(-1, k)
    pos = torch.arange(k, device=codes.device, dtype=torch.int64) * bits
    word, shift = pos // 32, pos % 32
    spill = (shift + bits) > 32  # codes whose high bits continue in the next word
    out = torch.empty(flat.shape[0], nwords, dtype=torch.int32, device=codes.device)
    for r0 in range(0, flat.shape[0], _CHUNK_ROWS):
        c = flat[r0:r0 + _CHUNK_ROWS].to(torch.int64)
        acc = torch.zeros(c.shape[0], nwords + 1, dtype=torch.int64, device=c.device)
        # bit fields never overlap, so adding them is OR-ing them
        acc.index_add_(1, word, (c << shift) & 0xFFFFFFFF)
        acc.index_add_(1, word[spill] + 1, c[:, spill] >> (32 - shift[spill]))
        acc = acc[:, :nwords]
        out[r0:r0 + _CHUNK_ROWS] = torch.where(acc >= (1 << 31), acc - (1 << 32), acc).to(torch.int32)
    return out.reshape(*lead, nwords)


def unpack_codes(words: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``[..., W]`` int32 words -> ``[..., k]`` int32 codes."""
    if words.dtype != torch.int32:
        raise TypeError(f"packed words must be int32, got {words.dtype}")
    need = packed_words(k, bits)
    if words.shape[-1] != need:
        raise ValueError(f"{k} codes of {bits} bits need {need} int32 words on the last axis, got {words.shape[-1]}")
    *lead, _ = words.shape
    flat = words.reshape(-1, need)
    pos = torch.arange(k, device=words.device, dtype=torch.int64) * bits
    word, shift = pos // 32, pos % 32
    nxt = (word + 1).clamp(max=need - 1)
    mask = (1 << bits) - 1
    out = torch.empty(flat.shape[0], k, dtype=torch.int32, device=words.device)
    for r0 in range(0, flat.shape[0], _CHUNK_ROWS):
        w = flat[r0:r0 + _CHUNK_ROWS].to(torch.int64) & 0xFFFFFFFF
        lo = w[:, word] >> shift
        hi = torch.where(shift + bits > 32, w[:, nxt] << (32 - shift), torch.zeros_like(lo))
        out[r0:r0 + _CHUNK_ROWS] = ((lo | hi) & mask).to(torch.int32)
    return out.reshape(*lead, k)
