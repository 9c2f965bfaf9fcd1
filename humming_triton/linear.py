"""User-facing ops: quant_linear, grouped_linear, fused_moe -- one signature, any backend."""
from __future__ import annotations

import torch

from . import plans
from .dispatch import select
from .formats.weight import QuantWeight
from .reference import check_linear_inputs

__all__ = ["quant_linear", "grouped_linear", "fused_moe"]


def quant_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None, backend: str = "auto",
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x [..., K] @ dequant(qw).T + bias`` -> ``[..., N]`` in ``out_dtype`` (default: x's dtype).

    A repeated call signature runs its plan (plans.py): the checks and the dispatch below ran on its first call."""
    planned = plans.usable(x)
    if planned:
        key = plans.linear_key(x, backend, out_dtype)
        run = plans.find(qw, key, bias)
        if run is not None:
            y = run(x, bias)
            if y is not None:
                return y
    check_linear_inputs(x, qw, bias)
    choice = select("quant_linear", x, qw, backend)
    b, cand = choice
    if x.numel() == 0:
        return x.new_empty(*x.shape[:-1], qw.N, dtype=out_dtype or x.dtype)
    y = b.quant_linear(x, qw, bias, out_dtype, cand)
    if planned:
        plans.offer(qw, key, bias, choice, lambda: b.plan_linear(x, qw, bias, out_dtype, cand))
    return y


def grouped_linear(x: torch.Tensor, qw: QuantWeight, offsets: torch.Tensor, bias: torch.Tensor | None = None,
                   backend: str = "auto", out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Rows of ``x [T, K]`` sorted by expert, ``offsets [E+1]``; ``qw [E, N, K]`` -> ``[T, N]``.

    ``backend="auto"``: the measured fastest of the Triton grouped kernel and dequantize + torch._grouped_mm on
    CUDA, the torch reference elsewhere."""
    if isinstance(offsets, torch.Tensor) and not offsets.is_contiguous():  # kernels read offsets[e] at base + e
        offsets = offsets.contiguous()
    planned = plans.usable(x)
    if planned:  # a repeated signature: checks and dispatch ran on its first call (plans.py)
        key = plans.grouped_key(x, offsets, backend, out_dtype)
        run = plans.find(qw, key, bias)
        if run is not None:
            y = run(x, offsets, bias)
            if y is not None:
                return y
    choice = select("grouped_linear", x, qw, backend)
    b, cand = choice
    if b.name != "reference":
        check_linear_inputs(x, qw, bias, experts=True)
        if x.dim() != 2 or offsets.dim() != 1 or offsets.numel() != qw.num_experts + 1:
            raise ValueError(f"grouped linear takes x [T, K] and offsets [E+1={qw.num_experts + 1}], got "
                             f"{list(x.shape)} and {list(offsets.shape)}")
    y = b.grouped_linear(x, qw, offsets, bias, out_dtype, cand)
    if planned and b.name != "reference":  # after the call: only a signature whose full call succeeded is planned
        plans.offer(qw, key, bias, choice, lambda: b.plan_grouped(x, qw, offsets, bias, out_dtype, cand))
    return y


def fused_moe(hidden: torch.Tensor, w13: QuantWeight, w2: QuantWeight, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, activation: str = "silu", backend: str = "auto") -> torch.Tensor:
    """Top-k mixture of experts over quantized expert weights ``w13 [E, 2I, H]`` and ``w2 [E, H, I]``.

    On CUDA (``auto`` or ``triton``) two grouped GEMMs run with device-side routing and no host sync, so the
    op can be captured in a CUDA graph; the reference syncs (it sorts tokens on the host's schedule)."""
    b, cand = select("fused_moe", hidden, w13, backend, w2)
    if b.name != "reference":
        if hidden.dim() != 2 or topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != hidden.shape[0]:
            raise ValueError(f"fused_moe takes hidden [T, H] and topk_ids / topk_weights [T, top_k], got "
                             f"{list(hidden.shape)}, {list(topk_ids.shape)}, {list(topk_weights.shape)}")
        if w2.num_experts != w13.num_experts or 2 * w2.K != w13.N or w2.N != hidden.shape[-1] or w13.K != w2.N:
            raise ValueError(f"expert weights do not fit: gate_up {list(w13.shape)}, down {list(w2.shape)}, "
                             f"hidden {list(hidden.shape)}; expected [E, 2I, H] and [E, H, I]")
    return b.fused_moe(hidden, w13, w2, topk_weights, topk_ids, activation, cand)
