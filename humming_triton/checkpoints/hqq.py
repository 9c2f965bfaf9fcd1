"""HQQ (``quant_method: "hqq"``), axis 1 (groups along K), 1/2/4/8-bit, float zero point.

Per layer: ``W_q`` uint8 holding the ``[N*K/G, G]`` code matrix (row ``r`` = group ``r % (K/G)`` of output row
``r // (K/G)``) packed *planar* along rows: with ``P = 8 // bits`` planes of ``R/P`` rows each, plane ``i``
sits at bit shift ``8 - bits*(i+1)`` -- for 4 bits ``W_q = rows[:R/2] << 4 | rows[R/2:]`` (first half in the
high nibble).  ``scale`` and ``zero`` float ``[N*K/G, 1]``; ``w = (W_q - zero) * scale`` reshaped to ``shape``.

That is a uint code with a *float* zero per group along K: scheme ``uint<bits>, <dtype>:g<G>, zero=float``.
The zeros share the scale's dtype (our storage rule); when the checkpoint's scale and zero dtypes differ,
both become fp32 (exact).  ``shape`` comes from a ``<prefix>.shape`` tensor when present, else from the
model skeleton.  3-bit (int32 planes) and ``axis=0`` are not supported and say so.

Rank windows (``ShardSpec``): the planar packing puts a row's codes in every plane, so no window of ``W_q`` is
a contiguous slice; the layer is read whole and cut in memory (``formats.shard.shard_range``).
"""
from __future__ import annotations

import torch

from ..formats.dtypes import IntType
from ..formats.packing import pack_codes
from ..formats.scheme import QuantScheme, ScaleSpec
from ..formats.weight import QuantWeight
from ._common import CheckpointFormatError, Tensors, check_shape, cut, wide_scale_type

FMT = "HQQ"


def unpack_planar(wq: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 ``[R/P, G]`` -> codes ``[R, G]`` (int32)."""
    planes = 8 // bits
    mask = (1 << bits) - 1
    w = wq.to(torch.int32)
    return torch.cat([(w >> (8 - bits * (i + 1))) & mask for i in range(planes)], dim=0)


def _meta(t: Tensors, name: str, default):
    v = t.opt(name)
    return default if v is None else v.reshape(-1).tolist()


def import_hqq_layer(t: Tensors, prefix: str, nbits: int, group: int, axis: int, shape=None) -> QuantWeight:
    nbits = int(_meta(t, f"{prefix}.nbits", [nbits])[0])
    group = int(_meta(t, f"{prefix}.group_size", [group])[0])
    axis = int(_meta(t, f"{prefix}.axis", [axis])[0])
    shape = _meta(t, f"{prefix}.shape", shape)
    if nbits not in (1, 2, 4, 8):
        raise CheckpointFormatError(f"{FMT}: {nbits}-bit layers are not supported (planar uint8 packing covers 1/2/4/8)")
    if axis != 1:
        raise CheckpointFormatError(f"{FMT}: axis={axis} is not supported; only axis=1 (groups along K)")
    if shape is None:
        raise CheckpointFormatError(f"{FMT}: the logical shape of {prefix} is unknown (no {prefix}.shape tensor and "
                                    "no model skeleton to ask)")
    n, k = (int(d) for d in shape)
    if k % group:
        raise CheckpointFormatError(f"{FMT}: group size {group} does not divide K={k} in {prefix}")
    rows = n * k // group
    wq = t.get(f"{prefix}.W_q", FMT)
    check_shape(wq, (rows * nbits // 8, group), f"{prefix}.W_q", FMT, (torch.uint8,))
    scale, zero = t.get(f"{prefix}.scale", FMT), t.get(f"{prefix}.zero", FMT)
    check_shape(scale, (rows, 1), f"{prefix}.scale", FMT)
    check_shape(zero, (rows, 1), f"{prefix}.zero", FMT)
    if scale.dtype != zero.dtype:
        scale, zero = scale.float(), zero.float()
    sdt = wide_scale_type(scale, f"{prefix}.scale", FMT)
    codes = unpack_planar(wq, nbits).reshape(n, k)
    scheme = QuantScheme(IntType(nbits, False), ScaleSpec(sdt, 1, group if group < k else 0), "float")
    return cut(t, prefix, QuantWeight(pack_codes(codes, nbits), scale.reshape(n, k // group).contiguous(), scheme,
                                      (n, k), zero.reshape(n, k // group).contiguous(), bias=t.opt(f"{prefix}.bias")))


def settings(qcfg: dict) -> tuple[int, int, int]:
    p = ((qcfg.get("quant_config") or {}).get("weight_quant_params")) or qcfg
    return int(p.get("nbits", 4)), int(p.get("group_size", 64)), int(p.get("axis", 1))


def read(t: Tensors, qcfg: dict, hints: dict) -> dict[str, QuantWeight]:
    nbits, group, axis = settings(qcfg)
    return {k[:-4]: import_hqq_layer(t, k[:-4], nbits, group, axis, hints.get(k[:-4])) for k in sorted(t.keys)
            if k.endswith(".W_q")}
