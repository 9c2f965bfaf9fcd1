"""GPTQ (``quant_method: "gptq"``), formats v1 (``"gptq"``) and v2 (``"gptq_v2"``), 2/3/4/8-bit.

Producer layout (per linear layer ``<prefix>``; K = in_features, N = out_features, G = group size):

* ``qweight`` int32 ``[K*bits/32, N]``: each column ``n`` is a dense LSB-first bit stream of its K codes, 3-bit
  values crossing word boundaries.  That is *exactly* our canonical K-packed stream, transposed: a layer
  without act-order imports as ``qweight.T`` with no unpacking at all.
* ``qzeros`` int32 ``[K/G, N*bits/32]``, the same stream packed along N.  v1 stores ``zero - 1`` (a stored
  all-ones code therefore means ``2**bits``: v1 cannot express zero 0 and consumers add 1 without wrapping;
  we keep that literal semantics), v2 stores the zero.
* ``scales`` fp16 ``[K/G, N]``; ``g_idx`` int32 ``[K]`` (scale row of each input column; optional when it is
  ``k // G``); optional ``bias [N]``.
* ``w[k, n] = scales[g_idx[k], n] * (q[k, n] - z[g_idx[k], n])``.

Act-order (``desc_act``): ``g_idx`` is a permuted map.  We sort K by group once at load
(:func:`regroup_by_g_idx`), store the permuted codes with ordinary contiguous groups and record the
permutation in ``QuantWeight.k_perm``; kernels then gather x's columns instead of scales per element.
Symmetric checkpoints (every zero ``2**(bits-1)``) become signed codes without a zero tensor.

Rank windows (``ShardSpec``): an N window reads columns ``[a, b)`` of ``qweight`` (with act-order too: the
permutation is along K); a K window reads its rows (split points sit on word boundaries).  Act-order layers
cannot be cut along K (``split_quantum``).  ``scales`` / ``qzeros`` / ``g_idx`` are read whole.
"""
from __future__ import annotations

import torch

from ..formats.packing import pack_codes, packed_words
from ..formats.weight import QuantWeight
from ._common import (CheckpointFormatError, Tensors, check_shape, finish, int_weight, regroup_by_g_idx, unpack_along,
                      window_slices)

FMT = "GPTQ"
BITS = (2, 3, 4, 8)


def gptq_settings(qcfg: dict) -> tuple[int, int, bool]:
    """-> (bits, group size or -1, v2?) from a ``quantization_config``."""
    bits = int(qcfg.get("bits", 4))
    if bits not in BITS:
        raise CheckpointFormatError(f"{FMT}: bits={bits} is not supported; expected one of {BITS}")
    fmt = str(qcfg.get("checkpoint_format") or qcfg.get("format") or "gptq").lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise CheckpointFormatError(f"{FMT}: unknown checkpoint format {fmt!r}; expected 'gptq' (v1) or 'gptq_v2' "
                                    "(other GPTQ-family formats such as 'marlin' are repacked and not read here)")
    return bits, int(qcfg.get("group_size", 128)), fmt == "gptq_v2"


def import_gptq_layer(t: Tensors, prefix: str, bits: int, group_size: int, v2: bool,
                      k_hint: int | None = None) -> QuantWeight:
    qweight = t.meta(f"{prefix}.qweight", FMT)
    scales = t.get(f"{prefix}.scales", FMT)
    qzeros = t.get(f"{prefix}.qzeros", FMT)
    g_idx = t.opt(f"{prefix}.g_idx")
    if qweight.dim() != 2 or qweight.dtype != torch.int32:
        raise CheckpointFormatError(f"{FMT}: {prefix}.qweight must be 2-D int32, got {qweight.dtype} "
                                    f"{list(qweight.shape)}")
    n = qweight.shape[1]
    k = g_idx.numel() if g_idx is not None else (k_hint or qweight.shape[0] * 32 // bits)
    check_shape(qweight, (packed_words(k, bits), n), f"{prefix}.qweight", FMT)
    if g_idx is None:
        g_idx = torch.arange(k) // (k if group_size <= 0 else group_size)
    k_perm, size, gs = regroup_by_g_idx(g_idx, k, FMT)
    ngroups = int(gs.max()) + 1 if k else 0
    if scales.dim() != 2 or scales.shape[1] != n or scales.shape[0] < ngroups:
        raise CheckpointFormatError(f"{FMT}: {prefix}.scales must be [>= {ngroups}, {n}] for g_idx with {ngroups} "
                                    f"groups, got {list(scales.shape)}")
    check_shape(qzeros, (scales.shape[0], packed_words(n, bits)), f"{prefix}.qzeros", FMT, (torch.int32,))
    zeros = unpack_along(qzeros, bits, n, dim=1).to(torch.int64) + (0 if v2 else 1)  # [groups, N]
    if size is not None:
        block, s, z = (1, size), scales[:ngroups].t(), zeros[:ngroups].t()
    else:  # uneven groups: one scale per (stored) column, still exact
        block, s, z = (1, 1), scales[gs].t(), zeros[gs].t()
    layer = int_weight(bits=bits, n=n, k=k, scales=s, zeros=z, block=block, k_perm=k_perm,
                       bias=t.opt(f"{prefix}.bias"), fmt=f"{FMT} {prefix}")

    def read_words(win):
        q = t.read(f"{prefix}.qweight", FMT, window_slices(win, 2, {"n": 1, "k": 0}, {"k": (bits, 32)}))
        if k_perm is None and size is not None:
            return q.t()  # the canonical stream already (module doc)
        kw = k if win is None or win[0] != "k" else win[2] - win[1]
        codes = unpack_along(q, bits, kw, dim=0).t()  # [N, K] logical order
        return pack_codes(codes if k_perm is None else codes[:, k_perm], bits)

    return finish(t, prefix, layer, read_words, f"{FMT} {prefix}", unsigned=True)


def read(t: Tensors, qcfg: dict, hints: dict) -> dict[str, QuantWeight]:
    bits, group, v2 = gptq_settings(qcfg)
    out = {}
    for key in sorted(t.keys):
        if key.endswith(".qweight"):
            p = key[: -len(".qweight")]
            out[p] = import_gptq_layer(t, p, bits, group, v2, (hints.get(p) or (None, None))[1])
    return out
