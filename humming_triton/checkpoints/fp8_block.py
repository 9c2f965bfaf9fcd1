"""FP8 with block scales (``quant_method: "fp8"``; DeepSeek-V3 / Qwen3-FP8 style).

Per layer: ``weight`` e4m3fn ``[N, K]`` and ``weight_scale_inv`` ``[ceil(N/bn), ceil(K/bk)]`` for
``weight_block_size: [bn, bk]`` (``[1]`` without it: per tensor).  Despite its name the scale *multiplies*:
``w = fp8 * weight_scale_inv[n // bn, k // bk]``.  ``scale_fmt: "ue8m0"`` checkpoints hold power-of-two
scales: stored as fp32 they stay fp32 (exact, and the common fp32 block kernels apply); stored as e8m0 bytes
(uint8 / ``float8_e8m0fnu``) they become e8m0 scale codes.  Activations: ``activation_scheme: "dynamic"``
= per-token groups of ``bk`` (e8m0 group scales with ue8m0, fp32 otherwise); ``"static"`` = per-tensor
``input_scale``.  The codes are imported byte for byte (no re-rounding), so dequantization is bit-exact.
Rank windows (``ShardSpec``): an N window reads rows of ``weight``, a K window its columns (split points sit
on scale blocks); ``weight_scale_inv`` is read whole.
"""
from __future__ import annotations

import torch

from ..formats.dtypes import WideFloat, parse_element_type
from ..formats.scheme import ActQuant
from ..formats.weight import QuantWeight
from ._common import (CheckpointFormatError, Tensors, byte_words, ceil_div, check_shape, e8m0_codes, finish,
                      float_weight)

FMT = "FP8 (block)"


def import_fp8_layer(t: Tensors, prefix: str, qcfg: dict) -> QuantWeight:
    weight = t.meta(f"{prefix}.weight", FMT)
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise CheckpointFormatError(f"{FMT}: {prefix}.weight must be 2-D float8_e4m3fn, got {weight.dtype} "
                                    f"{list(weight.shape)}")
    n, k = weight.shape
    s = t.get(f"{prefix}.weight_scale_inv", FMT)
    block = qcfg.get("weight_block_size")
    if block:
        bn, bk = (int(b) for b in block)
        check_shape(s, (ceil_div(n, bn), ceil_div(k, bk)), f"{prefix}.weight_scale_inv", FMT)
    else:
        if s.numel() != 1:
            raise CheckpointFormatError(f"{FMT}: without weight_block_size, {prefix}.weight_scale_inv must hold one "
                                        f"value, got shape {list(s.shape)}")
        bn = bk = 0
        s = s.reshape(1, 1)
    ue8m0 = str(qcfg.get("scale_fmt", "")).lower() == "ue8m0"
    if s.dtype.is_floating_point and s.dtype.itemsize > 1:
        scales, sdt = s, None
    else:
        scales, sdt = e8m0_codes(s, f"{prefix}.weight_scale_inv", FMT), "e8m0"
    scheme = str(qcfg.get("activation_scheme", "dynamic")).lower()
    input_scale = None
    act_sd = parse_element_type("e8m0") if ue8m0 else WideFloat("fp32")
    if scheme == "dynamic":
        act = ActQuant(parse_element_type("e4m3fn"), act_sd, per_token=True, group_k=bk if bk < k else 0)
    elif scheme == "static":
        act = ActQuant(parse_element_type("e4m3fn"), WideFloat("fp32"), per_token=False, static=True)
        input_scale = t.get(f"{prefix}.input_scale", FMT)
    else:
        raise CheckpointFormatError(f"{FMT}: unknown activation_scheme {scheme!r}; expected 'dynamic' or 'static'")
    layer = float_weight(elem="e4m3fn", scales=scales, scale_dtype=sdt, n=n, k=k, block=(bn, bk), act=act,
                         input_scale=input_scale, bias=t.opt(f"{prefix}.bias"), fmt=f"{FMT} {prefix}")
    return finish(t, prefix, layer, byte_words(t, f"{prefix}.weight", FMT), f"{FMT} {prefix}")


def read(t: Tensors, qcfg: dict, hints: dict) -> dict[str, QuantWeight]:
    fmt = str(qcfg.get("fmt", "e4m3")).lower()
    if fmt not in ("e4m3", "e4m3fn", "float8_e4m3fn"):
        raise CheckpointFormatError(f"{FMT}: fmt {fmt!r} is not supported; expected 'e4m3'")
    suffix = ".weight_scale_inv"
    return {k[: -len(suffix)]: import_fp8_layer(t, k[: -len(suffix)], qcfg) for k in sorted(t.keys)
            if k.endswith(suffix)}
