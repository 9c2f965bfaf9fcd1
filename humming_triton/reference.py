"""Pure-torch reference ops: the oracle of every backend and the CPU fallback.

All math is float32 on dequantized values, and exact about the scheme's activation quantization: when the
scheme quantizes activations, the reference quantizes them exactly as ``quantize_activation`` does and
multiplies the dequantized result.
"""
from __future__ import annotations

import torch

from .formats.activation import dequantize_activation, quantize_activation
from .formats.quantize import dequantize_weight
from .formats.weight import QuantWeight

__all__ = ["reference_linear", "reference_grouped_linear", "reference_fused_moe", "check_linear_inputs", "route",
           "moe_forward", "moe_activation"]


def check_linear_inputs(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None, *, experts: bool = False) -> None:
    """Clear errors for the mistakes users make most (shape, dtype, device)."""
    if not isinstance(qw, QuantWeight):
        raise TypeError(f"expected a QuantWeight, got {type(qw).__name__}; make one with ht.quantize_weight")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if experts != (qw.num_experts is not None):
        want = "a 3-D [E, N, K]" if experts else "a 2-D [N, K]"
        raise ValueError(f"this op needs {want} QuantWeight, got logical shape {list(qw.shape)}")
    if x.dim() < 1 or x.shape[-1] != qw.K:
        raise ValueError(f"x's last dim must equal the weight's K={qw.K}, got x shape {list(x.shape)}")
    if x.device != qw.device:
        raise ValueError(f"x is on {x.device} but the weight is on {qw.device}")
    if bias is not None:
        if tuple(bias.shape) != (qw.N,) and tuple(bias.shape) != (*qw.lead, qw.N):
            raise ValueError(f"bias must have shape [{qw.N}], got {list(bias.shape)}")
        if bias.device != x.device:
            raise ValueError(f"bias is on {bias.device} but x is on {x.device}")


def _effective_x(x: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    if qw.scheme.act is None:
        return x.float()
    return dequantize_activation(quantize_activation(x, qw.scheme.act, qw.input_scale))


def _tensor_key(t: torch.Tensor | None) -> tuple:
    if t is None:
        return ()
    try:
        version = t._version
    except RuntimeError:  # inference tensors have no version counter (and cannot change outside inference mode)
        version = -2
    return (t.data_ptr(), version, tuple(t.shape))


def _weight_key(qw: QuantWeight) -> tuple:
    """What the dequantized weight depends on: every tensor's storage and version counter (an in-place edit such
    as ``qw.scales.mul_(2)`` bumps the counter, a reassigned field changes the pointer), the scheme and shape."""
    return (qw.scheme, qw.shape, *(_tensor_key(t) for t in (qw.data, qw.scales, qw.zeros, qw.global_scale,
                                                           qw.k_perm)))


def _weight_f32(qw: QuantWeight) -> torch.Tensor:
    # the dequantized weight is cached: as CPU fallback this op runs every forward; keyed so that an in-place
    # edit of the QuantWeight's tensors is never answered from a stale copy
    key = _weight_key(qw)
    hit = qw.cache.get("reference_f32")
    if hit is not None and hit[0] == key:
        return hit[1]
    w = dequantize_weight(qw)
    qw.cache["reference_f32"] = (key, w)
    return w


def reference_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``y = x @ w.T + bias`` with ``w = dequantize_weight(qw)``; ``x [..., K]`` -> ``[..., N]``."""
    check_linear_inputs(x, qw, bias)
    bias = qw.bias if bias is None else bias
    y = _effective_x(x, qw).reshape(-1, qw.K) @ _weight_f32(qw).T
    if bias is not None:
        y = y + bias.float()
    return y.reshape(*x.shape[:-1], qw.N).to(out_dtype or x.dtype)


def _check_offsets(offsets: torch.Tensor, rows: int, experts: int) -> None:
    if offsets.dim() != 1 or offsets.numel() != experts + 1:
        raise ValueError(f"expert offsets must be 1-D of length E+1={experts + 1}, got shape {list(offsets.shape)}")
    o = offsets.cpu()
    if int(o[0]) != 0 or int(o[-1]) != rows or bool((o[1:] < o[:-1]).any()):
        raise ValueError(f"expert offsets must rise from 0 to the row count {rows}, got {o.tolist()}")


def reference_grouped_linear(x: torch.Tensor, qw: QuantWeight, offsets: torch.Tensor,
                             bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Rows of ``x [T, K]`` sorted by expert; rows ``offsets[e]:offsets[e+1]`` use expert ``e`` of
    ``qw [E, N, K]``.  Returns ``[T, N]``."""
    check_linear_inputs(x, qw, bias, experts=True)
    if x.dim() != 2:
        raise ValueError(f"grouped linear takes x [T, K], got {list(x.shape)}")
    _check_offsets(offsets, x.shape[0], qw.num_experts)
    bias = qw.bias if bias is None else bias
    w = _weight_f32(qw)
    xe = _effective_x(x, qw)
    y = torch.zeros(x.shape[0], qw.N, dtype=torch.float32, device=x.device)
    o = offsets.tolist()
    for e in range(qw.num_experts):
        if o[e + 1] > o[e]:
            y[o[e]:o[e + 1]] = xe[o[e]:o[e + 1]] @ w[e].T
            if bias is not None:
                y[o[e]:o[e + 1]] += bias[e].float()
    return y.to(out_dtype or x.dtype)


def moe_activation(h: torch.Tensor, kind: str) -> torch.Tensor:
    """``silu``: SwiGLU with gate = first half, up = second half (Qwen3-MoE, Mixtral, DeepSeek).
    ``swiglu_oai``: gpt-oss -- gate/up interleaved (even/odd), clamp 7, ``(up + 1) * g * sigmoid(1.702 g)``."""
    h = h.float()
    if kind == "silu":
        gate, up = h.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    if kind == "swiglu_oai":
        gate, up = h[..., 0::2].clamp(max=7.0), h[..., 1::2].clamp(-7.0, 7.0)
        return (up + 1) * gate * torch.sigmoid(1.702 * gate)
    raise ValueError(f"unknown MoE activation {kind!r}; expected 'silu' or 'swiglu_oai'")


def route(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (order of the flattened (token, slot) pairs sorted by expert, offsets [E+1]), computed without a host
    sync (no ``bincount`` / ``.item()``), so the Triton MoE path built on it stays CUDA-graph capturable."""
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return order, offsets


def moe_forward(hidden: torch.Tensor, w13: QuantWeight, w2: QuantWeight, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, activation: str, grouped) -> torch.Tensor:
    """The MoE pipeline around a grouped GEMM ``grouped(x_sorted, qw, offsets) -> float32 [rows, N]``: route,
    gate_up GEMM, activation (rounded to the activation dtype, as a kernel would), down GEMM, weighted top-k
    reduction.  The reference and the Triton backend differ only in ``grouped``."""
    t, k = topk_ids.shape
    order, offsets = route(topk_ids, w13.num_experts)
    tokens = order // k
    h = grouped(hidden[tokens], w13, offsets)
    a = moe_activation(h, activation).to(hidden.dtype)
    y = grouped(a, w2, offsets) * topk_weights.reshape(-1)[order].float()[:, None]
    out = torch.zeros(t, w2.N, dtype=torch.float32, device=hidden.device)
    out.index_add_(0, tokens, y)
    return out.to(hidden.dtype)


def reference_fused_moe(hidden: torch.Tensor, w13: QuantWeight, w2: QuantWeight, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """Top-k MoE: ``sum_j topk_weights[t, j] * down_e(act(gate_up_e(x_t)))`` with ``e = topk_ids[t, j]``."""
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [T, H], got {list(hidden.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"topk_ids {list(topk_ids.shape)} and topk_weights {list(topk_weights.shape)} must both "
                         f"be [T={hidden.shape[0]}, top_k]")
    e = w13.num_experts
    if e is None or w2.num_experts != e or 2 * w2.K != w13.N or w2.N != hidden.shape[-1]:
        raise ValueError(f"expert weights do not fit: gate_up {list(w13.shape)}, down {list(w2.shape)}, "
                         f"hidden {list(hidden.shape)}; expected [E, 2I, H] and [E, H, I]")
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= e):
        raise ValueError(f"topk_ids must lie in [0, {e}), got [{int(topk_ids.min())}, {int(topk_ids.max())}]")
    return moe_forward(hidden, w13, w2, topk_weights, topk_ids, activation,
                       lambda x, qw, offsets: reference_grouped_linear(x, qw, offsets, out_dtype=torch.float32))
