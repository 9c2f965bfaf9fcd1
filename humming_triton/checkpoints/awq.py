"""AWQ GEMM (``quant_method: "awq"``, ``version``/``format`` ``"gemm"``), 4-bit with zero point.

Producer layout (K = in_features, N = out_features, G = group size):

* ``qweight`` int32 ``[K, N/8]`` packed along **N**: nibble slot ``i`` (bits ``4i..4i+3``) of word ``j`` holds
  column ``8j + [0, 2, 4, 6, 1, 3, 5, 7][i]`` (the order that lets AWQ's kernel dequantize pairs of columns with
  one shift);
* ``qzeros`` int32 ``[K/G, N/8]`` in the same order, true zeros; ``scales`` fp16 ``[K/G, N]``;
* ``w[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]``.

The packing axis differs from ours (K), so the codes are unpacked and repacked once at load.  Rank windows
(``ShardSpec``): a K window reads rows ``[a, b)`` of ``qweight``; an N window reads the 8-column words that hold
columns ``[a, b)`` (rounded out to whole words) and drops the extra columns after unpacking.  ``scales`` /
``qzeros`` are read whole.
"""
from __future__ import annotations

import torch

from ..formats.packing import pack_codes
from ..formats.weight import QuantWeight
from ._common import CheckpointFormatError, Tensors, ceil_div, check_shape, finish, int_weight, window_slices

FMT = "AWQ"
# nibble slot i holds column ORDER[i] of its 8-column group
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, N/8]`` -> uint codes ``[R, N]`` (int32)."""
    r, c = words.shape
    w = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.empty(r, c, 8, dtype=torch.int32)
    for slot, col in enumerate(ORDER):
        out[:, :, col] = ((w >> (4 * slot)) & 0xF).to(torch.int32)
    return out.reshape(r, c * 8)


def import_awq_layer(t: Tensors, prefix: str, group_size: int) -> QuantWeight:
    qweight = t.meta(f"{prefix}.qweight", FMT)
    if qweight.dim() != 2 or qweight.dtype != torch.int32:
        raise CheckpointFormatError(f"{FMT}: {prefix}.qweight must be 2-D int32 [K, N/8], got {qweight.dtype} "
                                    f"{list(qweight.shape)}")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    g = k if group_size <= 0 else group_size
    if k % g:
        raise CheckpointFormatError(f"{FMT}: group size {g} does not divide K={k} in {prefix}")
    scales = t.get(f"{prefix}.scales", FMT)
    qzeros = t.get(f"{prefix}.qzeros", FMT)
    check_shape(scales, (ceil_div(k, g), n), f"{prefix}.scales", FMT)
    check_shape(qzeros, (ceil_div(k, g), n // 8), f"{prefix}.qzeros", FMT, (torch.int32,))
    layer = int_weight(bits=4, n=n, k=k, scales=scales.t(), zeros=unpack_awq(qzeros).t(), block=(1, g),
                       bias=t.opt(f"{prefix}.bias"), fmt=f"{FMT} {prefix}")

    def read_words(win):
        q = t.read(f"{prefix}.qweight", FMT, window_slices(win, 2, {"n": 1, "k": 0}, {"n": (1, 8)}))
        codes = unpack_awq(q).t()  # [N, K]
        if win is not None and win[0] == "n":  # the window's words start at column 8 * (a // 8)
            codes = codes[win[1] % 8:win[1] % 8 + win[2] - win[1]]
        return pack_codes(codes, 4)

    return finish(t, prefix, layer, read_words, f"{FMT} {prefix}", unsigned=True)


def read(t: Tensors, qcfg: dict, hints: dict) -> dict[str, QuantWeight]:
    bits = int(qcfg.get("bits", qcfg.get("w_bit", 4)))
    version = str(qcfg.get("version", qcfg.get("format", "gemm"))).lower()
    if bits != 4:
        raise CheckpointFormatError(f"{FMT}: only 4-bit AWQ is defined, got bits={bits}")
    if version != "gemm":
        raise CheckpointFormatError(f"{FMT}: version {version!r} is not supported; only the 'gemm' packing is read "
                                    "('gemv' / 'marlin' / 'exllama' variants pack differently)")
    if not qcfg.get("zero_point", True):
        raise CheckpointFormatError(f"{FMT}: zero_point=false checkpoints are not supported (no documented layout)")
    group = int(qcfg.get("group_size", qcfg.get("q_group_size", 128)))
    return {key[:-8]: import_awq_layer(t, key[:-8], group) for key in sorted(t.keys) if key.endswith(".qweight")}
