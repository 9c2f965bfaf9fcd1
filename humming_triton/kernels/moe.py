"""Fused MoE on Triton: the reference pipeline (``reference.moe_forward``: device-side routing, two grouped GEMMs,
activation, weighted top-k reduction) with the Triton grouped GEMM -- no host sync anywhere, so the whole call
can be captured in a CUDA graph (the reference backend's grouped GEMM syncs with the host)."""
from __future__ import annotations

import torch

from ..formats.weight import QuantWeight
from ..reference import moe_forward
from .grouped import triton_grouped_linear

__all__ = ["triton_fused_moe"]


def triton_fused_moe(hidden: torch.Tensor, w13: QuantWeight, w2: QuantWeight, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    return moe_forward(hidden, w13, w2, topk_weights, topk_ids, activation,
                       lambda x, qw, offsets: triton_grouped_linear(x, qw, offsets, out_dtype=torch.float32))
