"""Fused MoE on the GPU: the reference pipeline (``reference.moe_forward``: device-side routing, two grouped GEMMs,
activation, weighted top-k reduction) with each grouped GEMM the one dispatch measured fastest for it (the native
decode kernel at a few rows per expert, Triton's grouped tiles, dequantize + ``torch._grouped_mm``), or Triton's
where the caller asked for ``backend="triton"`` -- no host sync anywhere, so the whole call can be captured in a CUDA
graph (the reference backend's grouped GEMM syncs with the host)."""
from __future__ import annotations

import torch

from ..formats.weight import QuantWeight
from ..reference import moe_forward

__all__ = ["triton_fused_moe"]


def triton_fused_moe(hidden: torch.Tensor, w13: QuantWeight, w2: QuantWeight, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, activation: str = "silu", backend: str = "auto") -> torch.Tensor:
    """``backend``: what runs the two grouped GEMMs (``auto``: the measured table's choice for each)."""
    from ..linear import grouped_linear
    return moe_forward(hidden, w13, w2, topk_weights, topk_ids, activation,
                       lambda x, qw, offsets: grouped_linear(x, qw, offsets, backend=backend, out_dtype=torch.float32))
