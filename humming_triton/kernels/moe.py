"""Fused MoE on the GPU: the reference pipeline (``reference.moe_forward``: device-side routing, two grouped GEMMs,
activation, weighted top-k reduction) with each grouped GEMM the one dispatch measured fastest for it (the native
decode kernel at a few rows per expert, Triton's grouped tiles, dequantize + ``torch._grouped_mm``), or Triton's
grouped tiles where the caller asked for ``backend="triton"`` -- no host sync anywhere, so the whole call can be
captured in a CUDA graph (the reference backend's grouped GEMM syncs with the host)."""
from __future__ import annotations

import torch

from ..formats.weight import QuantWeight
from ..reference import moe_forward
from .grouped import triton_grouped_linear

__all__ = ["triton_fused_moe"]


def triton_fused_moe(hidden: torch.Tensor, w13: QuantWeight, w2: QuantWeight, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, activation: str = "silu", measured: bool = True) -> torch.Tensor:
    """``measured``: each grouped GEMM is the measured table's choice (``backend="auto"``); False: Triton's
    grouped tiles with the built-in config, what ``backend="triton"`` names."""
    from ..linear import grouped_linear
    if measured:
        gemm = lambda x, qw, offsets: grouped_linear(x, qw, offsets, out_dtype=torch.float32)  # noqa: E731
    else:
        gemm = lambda x, qw, offsets: triton_grouped_linear(x, qw, offsets, out_dtype=torch.float32)  # noqa: E731
    return moe_forward(hidden, w13, w2, topk_weights, topk_ids, activation, gemm)
