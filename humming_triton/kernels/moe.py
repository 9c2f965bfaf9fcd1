"""Fused MoE on Triton: route, two grouped GEMMs, activation, weighted top-k reduction.

Every step stays on the device with shapes known up front -- no ``.item()``, ``bincount`` or boolean masks --
so the whole call can be captured in a CUDA graph (the reference ``fused_moe`` syncs with the host).
"""
from __future__ import annotations

import torch

from ..formats.weight import QuantWeight
from ..reference import moe_activation
from .grouped import triton_grouped_linear

__all__ = ["triton_fused_moe", "route"]


def route(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (order of the flattened (token, slot) pairs sorted by expert, offsets [E+1]) without a host sync."""
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return order, offsets


def triton_fused_moe(hidden: torch.Tensor, w13: QuantWeight, w2: QuantWeight, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    t, k = topk_ids.shape
    order, offsets = route(topk_ids, w13.num_experts)
    tokens = order // k
    h = triton_grouped_linear(hidden[tokens], w13, offsets, out_dtype=torch.float32)
    a = moe_activation(h, activation).to(hidden.dtype)
    y = triton_grouped_linear(a, w2, offsets, out_dtype=torch.float32)
    y = y * topk_weights.reshape(-1)[order].float()[:, None]
    out = torch.zeros(t, w2.N, dtype=torch.float32, device=hidden.device)
    out.index_add_(0, tokens, y)
    return out.to(hidden.dtype)
