"""NVIDIA ModelOpt (``quant_method: "modelopt"`` / ``hf_quant_config.json``), ``quant_algo`` NVFP4 or FP8.

NVFP4 per layer: ``weight`` uint8 ``[N, K/2]`` (two e2m1 codes per byte, low nibble = even k -- our 4-bit
stream), ``weight_scale`` e4m3fn ``[N, K/16]``, ``weight_scale_2`` fp32 scalar and ``input_scale`` fp32
scalar.  ``w = fp4 * weight_scale * weight_scale_2``: the same multiply convention as our global scale, so the
import is bit-exact.  ``input_scale`` (= amax / (448 * 6)) is the static NVFP4 activation global scale (W4A4).
FP8 per layer: ``weight`` e4m3fn, ``weight_scale`` scalar, ``input_scale`` scalar (static per-tensor W8A8).

Fused layers: a checkpoint stores each shard (q/k/v, gate/up) with its own ``weight_scale_2``.  Hugging Face
dense layers are never fused, but MoE experts are (``gate_up_proj``); the loader folds differing shard global
scales into the block scales when that is exact (``loader.fuse_experts``) and otherwise says so.

Rank windows (``ShardSpec``): ``weight`` stores rows of N, so an N window reads rows and a K window reads
columns (bytes; split points sit on word boundaries); ``weight_scale`` and the scalars are read whole.
"""
from __future__ import annotations

import torch

from ..formats.dtypes import WideFloat, parse_element_type
from ..formats.scheme import ActQuant
from ..formats.weight import QuantWeight
from ._common import (CheckpointFormatError, Tensors, byte_words, ceil_div, check_shape, finish, float_weight,
                      fp4_words, packed_fp4)

FMT = "ModelOpt"
ALGOS = ("NVFP4", "FP8")


def _scalar(t: Tensors, name: str) -> torch.Tensor:
    v = t.get(name, FMT).float()
    if v.numel() != 1:
        raise CheckpointFormatError(f"{FMT}: {name} must be a scalar, got shape {list(v.shape)}")
    return v.reshape(())


def import_nvfp4_layer(t: Tensors, prefix: str, group: int = 16) -> QuantWeight:
    _, n, k = packed_fp4(t, f"{prefix}.weight", f"{FMT} NVFP4")
    s = t.get(f"{prefix}.weight_scale", FMT)
    check_shape(s, (n, ceil_div(k, group)), f"{prefix}.weight_scale", FMT, (torch.float8_e4m3fn,))
    input_scale = t.opt(f"{prefix}.input_scale")
    act = None
    if input_scale is not None:
        act = ActQuant(parse_element_type("e2m1"), parse_element_type("e4m3fn"), True, group, global_scale=True,
                       static=True)
        input_scale = _scalar(t, f"{prefix}.input_scale")
    layer = float_weight(elem="e2m1", scales=s.view(torch.uint8), scale_dtype="e4m3fn", n=n, k=k, block=(1, group),
                         global_scale=_scalar(t, f"{prefix}.weight_scale_2"), act=act, input_scale=input_scale,
                         bias=t.opt(f"{prefix}.bias"), fmt=f"{FMT} {prefix}")
    return finish(t, prefix, layer, fp4_words(t, f"{prefix}.weight", FMT), f"{FMT} {prefix}")


def import_fp8_layer(t: Tensors, prefix: str) -> QuantWeight:
    w = t.meta(f"{prefix}.weight", FMT)
    if w.dtype != torch.float8_e4m3fn or w.dim() != 2:
        raise CheckpointFormatError(f"{FMT}: FP8 {prefix}.weight must be 2-D float8_e4m3fn, got {w.dtype}")
    n, k = w.shape
    s = _scalar(t, f"{prefix}.weight_scale").reshape(1, 1)
    act = input_scale = None
    if f"{prefix}.input_scale" in t:
        act = ActQuant(parse_element_type("e4m3fn"), WideFloat("fp32"), per_token=False, static=True)
        input_scale = _scalar(t, f"{prefix}.input_scale")
    layer = float_weight(elem="e4m3fn", scales=s, n=n, k=k, block=(0, 0), act=act, input_scale=input_scale,
                         bias=t.opt(f"{prefix}.bias"), fmt=f"{FMT} {prefix}")
    return finish(t, prefix, layer, byte_words(t, f"{prefix}.weight", FMT), f"{FMT} {prefix}")


def read(t: Tensors, qcfg: dict, hints: dict) -> dict[str, QuantWeight]:
    algo = str(qcfg.get("quant_algo", "")).upper()
    if algo not in ALGOS:
        raise CheckpointFormatError(f"{FMT}: quant_algo {algo!r} is not supported; expected one of {ALGOS}")
    out = {}
    if algo == "NVFP4":
        group = int(qcfg.get("group_size", 16))
        for key in sorted(t.keys):
            if key.endswith(".weight_scale_2"):
                out[key[:-15]] = import_nvfp4_layer(t, key[:-15], group)
    else:
        for key in sorted(t.keys):
            if key.endswith(".weight_scale") and key[:-13] + ".weight" in t:
                out[key[:-13]] = import_fp8_layer(t, key[:-13])
    return out
