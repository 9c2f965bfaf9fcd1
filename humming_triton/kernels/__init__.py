"""Triton kernels.  Importing this package imports triton but compiles and launches nothing."""
from __future__ import annotations

import torch

from ..formats.scheme import QuantScheme

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def supports(op: str, scheme: QuantScheme, dtype: torch.dtype) -> str | None:
    """None when the Triton backend implements ``op`` for this scheme and activation dtype, else why not."""
    if op not in ("quant_linear", "grouped_linear", "fused_moe"):
        return f"no Triton kernel for {op} yet (the reference backend runs it)"
    if scheme.act is not None:
        return "activation-quantized schemes (W8A8 / W4A8 / W4A4) have no Triton kernel yet"
    if dtype not in _DTYPES:
        return f"activations must be fp16, bf16 or fp32, got {dtype}"
    gk = scheme.scale.block_k
    if gk and 32 % scheme.bits == 0 and (gk & -gk) < 32 // scheme.bits:
        return f"group size {gk} does not align with {scheme.bits}-bit packed words"
    return None
