"""Triton kernels.  Importing this package imports triton but compiles and launches nothing."""
from __future__ import annotations

import functools

import torch

from ..formats.dtypes import parse_element_type
from ..formats.scheme import QuantScheme

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def supports(op: str, scheme: QuantScheme, dtype: torch.dtype) -> str | None:
    """None when the Triton backend implements ``op`` for this scheme and activation dtype, else why not."""
    if op not in ("quant_linear", "grouped_linear", "fused_moe"):
        return f"no Triton kernel for {op} yet (the reference backend runs it)"
    if scheme.act is not None:
        return fp8_path_reason(op, scheme)
    if dtype not in _DTYPES:
        return f"activations must be fp16, bf16 or fp32, got {dtype}"
    gk = scheme.scale.block_k
    if gk and 32 % scheme.bits == 0 and (gk & -gk) < 32 // scheme.bits:
        return f"group size {gk} does not align with {scheme.bits}-bit packed words"
    return None


@functools.lru_cache(maxsize=None)
def fp8_path_reason(op: str, scheme: QuantScheme) -> str | None:
    """The quantized-activation paths: e4m3 or int8 activations (dynamic, per token or per group of K) with
    weights whose values are all exact in that type (int4/e2m1/e4m3 in e4m3; int1-8 in int8), no zero point,
    weight groups of >= 32; e2m1 activations (MX / NV block scales) with any weight."""
    a = scheme.act
    if str(a.dtype) == "e2m1":  # W4A4: the e2m1 quantizer, then dequantize both operands for cuBLAS (dequant_mm)
        mx = str(a.scale_dtype) == "e8m0" and not a.global_scale
        nv = str(a.scale_dtype) == "e4m3fn" and a.global_scale
        if not a.group_k or not (mx or nv) or (a.static and not a.global_scale):
            return f"activation quantization {a} has no Triton kernel yet (dynamic e2m1 with e8m0 block scales, or " \
                   f"e4m3 block scales and a global scale)"
        if a.group_k & (a.group_k - 1):
            return f"activation group {a.group_k} must be a power of two"
        return None
    mx8 = str(a.dtype) == "e4m3fn" and str(a.scale_dtype) == "e8m0" and a.group_k  # MXFP8 block scales
    if str(a.dtype) not in ("e4m3fn", "int8") or (str(a.scale_dtype) != "fp32" and not mx8) or a.static \
            or a.global_scale or not a.per_token:
        return f"activation quantization {a} has no Triton kernel yet (e4m3 / int8 with fp32 per-token or group " \
               f"scales, or e4m3 with e8m0 group scales, only)"
    if a.group_k and (a.group_k < 32 or a.group_k & (a.group_k - 1)):
        return f"activation group {a.group_k} must be a power of two >= 32"
    grid = set(parse_element_type(str(a.dtype)).value_table().tolist())
    vals = scheme.weight.value_table()
    if scheme.zero != "none" or not set(vals[torch.isfinite(vals)].tolist()) <= grid:
        return f"weight {scheme.weight} (zero={scheme.zero}) is not exactly representable in {a.dtype}"
    gk = scheme.scale.block_k
    if gk and gk < 32:
        return f"weight groups of {gk} are below the MMA's K tile of 32"
    return None
