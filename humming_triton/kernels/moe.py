"""Fused MoE on the GPU: the reference pipeline (``reference.moe_forward``: device-side routing, two grouped GEMMs,
activation, weighted top-k reduction) with each grouped GEMM the one dispatch measured fastest for it (the native
decode kernel at a few rows per expert, Triton's grouped tiles, dequantize + ``torch._grouped_mm``), or Triton's
grouped tiles where the caller asked for ``backend="triton"`` -- no host sync anywhere, so the whole call can be
captured in a CUDA graph (the reference backend's grouped GEMM syncs with the host).

A switch (``ON``, humming_triton/switches.py: on where the device's measured table says so -- the H100's, from
session 35 -- or by ``HUMMING_TRITON_MOE_PIPELINE=1`` / ``set_enabled``): the steps around the GEMMs as three
Triton launches (``_moe_pipeline.py``: route + gather, gated activation, weighted combine) instead of ~15 torch
kernels, for up to ``PIPELINE_MAX_ROWS`` routed rows."""
from __future__ import annotations

import torch
import triton

from .. import switches
from ..formats.weight import QuantWeight
from ..reference import moe_forward
from ._moe_pipeline import combine_kernel, gated_activation_kernel, route_gather_kernel
from .grouped import triton_grouped_linear

__all__ = ["triton_fused_moe", "pipelined_moe_forward", "ENV", "ON", "set_enabled", "PIPELINE_MAX_ROWS"]

ENV = "HUMMING_TRITON_MOE_PIPELINE"
ON = switches.from_env(ENV)  # the pipeline switch (switches.py; a module global, as cutlass_ext.native_op's)
PIPELINE_MAX_ROWS = 4096  # the route kernel holds every routed row's expert id in one vector per program
_ACTIVATIONS = {"silu": 0, "swiglu_oai": 1}


def set_enabled(on: bool | None) -> None:
    """True / False: the pipeline on / off from now on; None: as the device's measured table says."""
    global ON
    ON = None if on is None else bool(on)


def _table_tokens(scheme: str) -> int:
    return switches.table_tokens("moe_pipeline", scheme)


# folded at trace time (one device kind per process)
table_tokens = torch._dynamo.assume_constant_result(_table_tokens)


def enabled(tokens: int, scheme: str) -> bool:
    """Whether a fused MoE call of ``tokens`` tokens of ``scheme`` runs the pipeline: the switch if set, else the
    device's table (the schemes and token counts its A/B timed: the pipeline's kernels change with the rows)."""
    return ON if ON is not None else 0 < tokens <= table_tokens(scheme)


def pipelined_moe_forward(hidden: torch.Tensor, w13: QuantWeight, w2: QuantWeight, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor, activation: str, grouped) -> torch.Tensor:
    """``reference.moe_forward`` with its routing, gather, activation, weighting and reduction as three Triton
    launches around the two grouped GEMMs (``grouped(x_sorted, qw, offsets) -> float32 [rows, N]``).  Same
    result up to the fp32 summation order of the top-k combine (here slot by slot, deterministic).  Ids outside
    ``[0, E)`` contribute nothing (``_moe_pipeline``'s docstring)."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown MoE activation {activation!r}; expected one of {sorted(_ACTIVATIONS)}")
    t, k = topk_ids.shape
    rows, e, h = t * k, w13.num_experts, hidden.shape[-1]
    if rows == 0 or rows > PIPELINE_MAX_ROWS:
        return moe_forward(hidden, w13, w2, topk_weights, topk_ids, activation, grouped)
    dev = hidden.device
    hidden = hidden if hidden.stride(-1) == 1 else hidden.contiguous()
    ids, wts = topk_ids.reshape(-1).contiguous(), topk_weights.reshape(-1).contiguous()
    xs = torch.empty(rows, h, dtype=hidden.dtype, device=dev)
    row_w = torch.empty(rows, dtype=torch.float32, device=dev)
    inv = torch.empty(rows, dtype=torch.int32, device=dev)
    offsets = torch.empty(e + 1, dtype=torch.int64, device=dev)
    route_gather_kernel[(max(rows, e + 1),)](
        ids, wts, hidden, xs, row_w, inv, offsets, rows, e, h, hidden.stride(0), xs.stride(0), TOP_K=k,
        R_POW2=triton.next_power_of_2(rows), BLOCK_H=min(1024, triton.next_power_of_2(h)), num_warps=4)
    gate_up = grouped(xs, w13, offsets)
    inter = w2.K
    a = torch.empty(rows, inter, dtype=hidden.dtype, device=dev)
    block = min(1024, triton.next_power_of_2(inter))
    gated_activation_kernel[(rows, triton.cdiv(inter, block))](
        gate_up, a, inter, gate_up.stride(0), a.stride(0), KIND=_ACTIVATIONS[activation], BLOCK=block, num_warps=4)
    y = grouped(a, w2, offsets)
    out = torch.empty(t, w2.N, dtype=hidden.dtype, device=dev)
    block_h = min(1024, triton.next_power_of_2(w2.N))
    combine_kernel[(t, triton.cdiv(w2.N, block_h))](
        y, inv, row_w, offsets, out, w2.N, e, y.stride(0), out.stride(0), TOP_K=k, BLOCK_H=block_h, num_warps=4)
    return out


def triton_fused_moe(hidden: torch.Tensor, w13: QuantWeight, w2: QuantWeight, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, activation: str = "silu", measured: bool = True) -> torch.Tensor:
    """``measured``: each grouped GEMM is the measured table's choice (``backend="auto"``); False: Triton's
    grouped tiles with the built-in config, what ``backend="triton"`` names."""
    from cutlass_ext import native_op

    from ..linear import grouped_linear
    from ..ops import weight_args
    tokens, scheme = topk_ids.shape[0], w13.scheme.name
    if measured and native_op.enabled(tokens, scheme):  # each planned grouped call's host path in C++
        gemm = lambda x, qw, offsets: torch.ops.humming_triton.grouped_linear_native(  # noqa: E731
            x, *weight_args(qw), offsets, None, "auto", torch.float32)
    elif measured:
        gemm = lambda x, qw, offsets: grouped_linear(x, qw, offsets, out_dtype=torch.float32)  # noqa: E731
    else:
        gemm = lambda x, qw, offsets: triton_grouped_linear(x, qw, offsets, out_dtype=torch.float32)  # noqa: E731
    # the pipeline as timed: around the measured GEMMs (backend "auto"); forced on (ON), around any
    forward = pipelined_moe_forward if (measured or ON) and enabled(tokens, scheme) else moe_forward
    return forward(hidden, w13, w2, topk_weights, topk_ids, activation, gemm)
