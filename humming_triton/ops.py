"""torch.library custom ops (namespace ``humming_triton``): the graph-safe face of the library.

Why custom ops: ``torch.compile`` cannot trace into Triton launches, data-dependent expert routing or our
Python dispatch, and CUDA-graph capture needs an op whose output shape is known without running it.  A
custom op is opaque to the compiler and comes with a *fake* implementation that only computes output
metadata, so ``torch.compile(fullgraph=True)`` sees one node per quantized GEMM and never graph-breaks.

A ``QuantWeight`` is a Python object, which an op schema cannot carry, so each op takes the weight's tensors
(``data, scales, zeros?, global_scale?, input_scale?, bias?, k_perm?``) plus the scheme as its string form and the
logical shape as ints, and rebuilds the QuantWeight inside.  The rebuilt object is cached *on the data tensor*
(keyed by the identity and version counter of every tensor), because backends keep per-weight state in
``qw.cache`` (the reference's dequantized fp32 copy, a kernel's repacked layout): rebuilding on every call would
throw that away.  A cache hit costs a few attribute reads; validation runs only on a miss (new weight, or one
changed in place, e.g. by ``load_state_dict``).

The ops are defined on a ``torch.library.Library`` with one CompositeExplicitAutograd kernel each (schema
inferred from the annotations, fake implementations via ``register_fake``) rather than with
``torch.library.custom_op``: the latter wraps every call in Python that re-checks output aliasing, which cost
more host time than the decode GEMM takes on the GPU (benchmarks/results/h200/overhead.txt).  Autograd:
``quant_linear`` differentiates with respect to its activation and bias (frozen weight, e.g. adapters trained on
a quantized base model); the other ops raise if backpropagated through.

The modules in ``humming_triton.nn`` call these ops; ``ht.quant_linear`` & co. stay plain Python functions.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch

from .formats.activation import QuantActivation
from .formats.dtypes import WideFloat
from .formats.scheme import PRESETS, ActQuant, QuantScheme
from .formats.quantize import dequantize_weight
from .formats.weight import QuantWeight

__all__ = ["quant_linear_op", "quant_linear_nograd_op", "quant_linear_native_op", "fused_moe_nograd_op",
           "grouped_linear_nograd_op", "grouped_linear_native_op", "grouped_linear_op", "fused_moe_op",
           "quantize_activation_op", "dequantize_op", "weight_args", "quant_weight_from_args"]

_Tensor = torch.Tensor
_OptT = Optional[torch.Tensor]
_CACHE_ATTR = "_humming_triton_qw"
_LIB = torch.library.Library("humming_triton", "DEF")


def _define(name: str):
    """Register the decorated function as ``humming_triton::<name>``; returns the op (callable)."""
    def register(fn):
        _LIB.define(name + torch.library.infer_schema(fn, mutates_args=()))
        _LIB.impl(name, fn, "CompositeExplicitAutograd")
        return getattr(torch.ops.humming_triton, name)
    return register


def _fake(name: str):
    return torch.library.register_fake(f"humming_triton::{name}", lib=_LIB)


@functools.lru_cache(maxsize=256)
def _scheme(text: str) -> QuantScheme:
    return QuantScheme.parse(text)


@functools.lru_cache(maxsize=256)
def _act_spec(text: str) -> ActQuant:
    return ActQuant.parse(text)


def _version(t: _OptT) -> int:
    if t is None:
        return -1
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter (and cannot change outside inference mode)
        return -2


def quant_weight_from_args(data: _Tensor, scales: _Tensor, zeros: _OptT, global_scale: _OptT, input_scale: _OptT,
                           bias: _OptT, k_perm: _OptT, scheme: str, shape: list[int]) -> QuantWeight:
    """The QuantWeight these tensors describe, reused across calls while none of them changed."""
    # spelled out, no generator expressions: this runs on every eager call (host time is the decode's cost)
    key = (scheme, tuple(shape), id(data), id(scales), id(zeros), id(global_scale), id(input_scale), id(bias),
           id(k_perm), _version(data), _version(scales), _version(zeros), _version(global_scale),
           _version(input_scale), _version(bias), _version(k_perm))
    hit = getattr(data, _CACHE_ATTR, None)
    if hit is not None and hit[0] == key:
        return hit[1]
    extra = {} if k_perm is None else {"k_perm": k_perm}  # act-order permutation (GPTQ desc_act)
    qw = QuantWeight(data, scales, _scheme(scheme), tuple(shape), zeros, global_scale, input_scale, bias, **extra)
    setattr(data, _CACHE_ATTR, (key, qw))
    return qw


def eager_direct(*xs: torch.Tensor) -> bool:
    """Whether a module may run an op's Python body directly instead of through ``torch.ops``: plain tensors
    (no fake / functional / subclass tensor, no FX proxy), not under torch.compile / export, and no gradient to
    record.  The result is the same function of the same inputs; what is skipped is the dispatcher's custom-op
    layer (~30 µs of host time per call, measured on the H200's host), which only compile and autograd need."""
    if torch.compiler.is_compiling():  # FX symbolic tracing passes Proxies: the type check below sends them to the op
        return False
    grad = torch.is_grad_enabled()
    return all(type(x) is torch.Tensor and not (grad and x.requires_grad) for x in xs)


def weight_args(qw: QuantWeight) -> tuple:
    """``qw`` -> the positional weight arguments every op here takes (tensors, scheme string, shape list)."""
    return (qw.data, qw.scales, qw.zeros, qw.global_scale, qw.input_scale, qw.bias, getattr(qw, "k_perm", None),
            str(qw.scheme), list(qw.shape))


def _check_k(x: _Tensor, shape: list[int], what: str) -> None:
    if x.shape[-1] != shape[-1]:
        raise ValueError(f"{what}: x's last dim {x.shape[-1]} != the weight's K={shape[-1]}")


# --- quant_linear ----------------------------------------------------------------------------------------------
def _quant_linear(x: _Tensor, data: _Tensor, scales: _Tensor, zeros: _OptT, global_scale: _OptT,
                  input_scale: _OptT, wbias: _OptT, k_perm: _OptT, scheme: str, shape: list[int], bias: _OptT,
                  backend: str = "auto", out_dtype: Optional[torch.dtype] = None) -> _Tensor:
    """``x [..., K] @ dequant(W).T + bias`` (``wbias`` is the QuantWeight's own bias, ``bias`` an override)."""
    from .linear import quant_linear
    qw = quant_weight_from_args(data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape)
    return quant_linear(x, qw, bias, backend, out_dtype)


def _quant_linear_fake(x, data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape, bias,
                       backend="auto", out_dtype=None):
    _check_k(x, shape, "quant_linear")
    return x.new_empty(*x.shape[:-1], shape[-2], dtype=out_dtype or x.dtype)


# The same op twice: ``quant_linear`` differentiates (below); ``quant_linear_nograd`` is what modules call when no
# gradient is wanted -- without the Python autograd wrapper ``register_autograd`` puts in front of every call,
# which costs more host time than the op's dispatch itself (measured: 23 against 9 µs per call on this project's
# CPU, under no_grad too).  Called where a gradient is wanted, it has none to give.
quant_linear_op = _define("quant_linear")(_quant_linear)
quant_linear_nograd_op = _define("quant_linear_nograd")(_quant_linear)
_fake("quant_linear")(_quant_linear_fake)
_fake("quant_linear_nograd")(_quant_linear_fake)


# ``quant_linear_native``: quant_linear_nograd again, whose CPU / CUDA kernels are C++ once cutlass_ext.native_op
# has built them (opt-in): a planned native decode call runs with no Python; everything else reaches
# ``_quant_linear_native_miss`` below, the Python body, which also hands its plan to the C++ table.
def _quant_linear_native_miss(x: _Tensor, data: _Tensor, scales: _Tensor, zeros: _OptT, global_scale: _OptT,
                              input_scale: _OptT, wbias: _OptT, k_perm: _OptT, scheme: str, shape: list[int],
                              bias: _OptT, backend: str = "auto", out_dtype: Optional[torch.dtype] = None) -> _Tensor:
    from cutlass_ext import native_op

    from . import plans
    from .linear import quant_linear
    made_at = native_op.epoch()  # before planning: a state change from here on voids what this call plans
    qw = quant_weight_from_args(data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape)
    y = quant_linear(x, qw, bias, backend, out_dtype)
    run = plans.find(qw, plans.linear_key(x, backend, out_dtype), bias) if plans.usable(x) else None
    if run is not None:  # the arguments as passed, not weight_args(qw): the C++ table matches the caller's scheme text
        native_op.offer(run, x, (data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape),
                        bias, backend, out_dtype, made_at)
    return y


quant_linear_native_op = _define("quant_linear_native")(_quant_linear)
_define("_quant_linear_native_miss")(_quant_linear_native_miss)
_fake("quant_linear_native")(_quant_linear_fake)
_fake("_quant_linear_native_miss")(_quant_linear_fake)


@_define("dequantize")
def dequantize_op(data: _Tensor, scales: _Tensor, zeros: _OptT, global_scale: _OptT, input_scale: _OptT,
                  wbias: _OptT, k_perm: _OptT, scheme: str, shape: list[int], dtype: torch.dtype) -> _Tensor:
    """The dequantized weight in logical K order, in ``dtype`` (2-D weights): the Triton dequantize kernel on
    CUDA (and under the interpreter), the reference elsewhere.  quant_linear's backward uses it (a fresh copy per call: a cached dense
    weight per layer is what quantization saves)."""
    from .dispatch import interpreting, triton_available
    qw = quant_weight_from_args(data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape)
    if not ((data.is_cuda or interpreting()) and triton_available()) or qw.num_experts is not None:
        return dequantize_weight(qw).to(dtype)
    from .kernels.dense import triton_dequantize
    stored = qw if qw.k_perm is None else dataclasses.replace(qw, k_perm=None, cache={})
    w = triton_dequantize(stored, dtype)
    # stored column j is logical column k_perm[j]
    return w if qw.k_perm is None else torch.empty_like(w).index_copy_(1, qw.k_perm, w)


@_fake("dequantize")
def _(data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape, dtype):
    return data.new_empty(shape, dtype=dtype)


def _quant_linear_setup(ctx, inputs, output):
    x, data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape, bias = inputs[:11]
    # held as attributes, not save_for_backward: the weight is frozen, and weights made under inference_mode
    # (inference tensors) cannot be saved for backward at all
    ctx.weight = (data, scales, zeros, global_scale, input_scale, wbias, k_perm)
    ctx.scheme, ctx.shape, ctx.x_dtype, ctx.bias_given = scheme, list(shape), x.dtype, bias is not None
    b = bias if bias is not None else wbias
    ctx.bias_dtype = None if b is None else b.dtype


def _quant_linear_backward(ctx, grad):
    """Gradients for the activation and the bias; the quantized weight is frozen (QLoRA-style training through
    quantized layers).  Quantized activations pass the gradient straight through their rounding."""
    n, k = ctx.shape[-2], ctx.shape[-1]
    g2 = grad.reshape(-1, n)
    gx = gb = gwb = None
    if ctx.needs_input_grad[0]:  # through the dequantize op: traceable by torch.compile's autograd
        w = dequantize_op(*ctx.weight, ctx.scheme, ctx.shape, g2.dtype)
        gx = (g2 @ w).reshape(*grad.shape[:-1], k).to(ctx.x_dtype)
    bias_grad_slot = 10 if ctx.bias_given else 6  # the override is the bias in effect, else the weight's own
    if ctx.needs_input_grad[bias_grad_slot]:
        gsum = g2.float().sum(0).to(ctx.bias_dtype)
        gb, gwb = (gsum, None) if ctx.bias_given else (None, gsum)
    return gx, None, None, None, None, None, gwb, None, None, None, gb, None, None


@_define("no_backward")
def no_backward_op(grad: _Tensor, name: str, shape: list[int], dtype: torch.dtype) -> _Tensor:
    """The backward of the ops that have none: raises when it runs.  An op (with a fake) rather than a raise in
    the backward itself, because torch.compile traces backwards ahead of time whenever an input requires grad
    -- a forward-only compiled MoE model must not fail just because its embedding is trainable."""
    raise NotImplementedError(f"humming_triton::{name} has no backward (only quant_linear does: gradients for the "
                              f"activation and bias through a frozen quantized weight)")


@_fake("no_backward")
def _(grad, name, shape, dtype):
    return grad.new_empty(shape, dtype=dtype)


def _no_backward_setup(ctx, inputs, output):
    ctx.slots = [(i, list(t.shape), t.dtype) for i, t in enumerate(inputs)
                 if isinstance(t, torch.Tensor) and t.requires_grad]
    ctx.inputs = len(inputs)


def _not_differentiable(name: str):
    def backward(ctx, *grads):
        grad = next(g for g in grads if g is not None)
        out = [None] * ctx.inputs
        for i, shape, dtype in ctx.slots:  # raises when it runs
            out[i] = no_backward_op(grad, name, shape, dtype)
        return tuple(out)
    return backward


torch.library.register_autograd("humming_triton::quant_linear", _quant_linear_backward,
                                setup_context=_quant_linear_setup, lib=_LIB)


# --- grouped_linear --------------------------------------------------------------------------------------------
def _grouped_linear(x: _Tensor, data: _Tensor, scales: _Tensor, zeros: _OptT, global_scale: _OptT,
                    input_scale: _OptT, wbias: _OptT, k_perm: _OptT, scheme: str, shape: list[int], offsets: _Tensor,
                    bias: _OptT, backend: str = "auto", out_dtype: Optional[torch.dtype] = None) -> _Tensor:
    """Expert-sorted rows ``x [T, K]`` with ``offsets [E+1]`` against ``W [E, N, K]`` -> ``[T, N]``."""
    from .linear import grouped_linear
    qw = quant_weight_from_args(data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape)
    return grouped_linear(x, qw, offsets, bias, backend, out_dtype)


def _grouped_linear_fake(x, data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape, offsets,
                         bias, backend="auto", out_dtype=None):
    _check_k(x, shape, "grouped_linear")
    return x.new_empty(x.shape[0], shape[-2], dtype=out_dtype or x.dtype)


# as quant_linear: a twin without the autograd layer (a compiled MoE module's two GEMMs, nn/moe.py)
grouped_linear_op = _define("grouped_linear")(_grouped_linear)
grouped_linear_nograd_op = _define("grouped_linear_nograd")(_grouped_linear)
_fake("grouped_linear")(_grouped_linear_fake)
_fake("grouped_linear_nograd")(_grouped_linear_fake)


# ``grouped_linear_native``: grouped_linear_nograd again, with C++ CPU / CUDA kernels once cutlass_ext.native_op has
# built them (opt-in), as quant_linear_native: a planned grouped decode call runs with no Python (a compiled MoE
# module's two expert GEMMs); everything else reaches ``_grouped_linear_native_miss``.
def _grouped_linear_native_miss(x: _Tensor, data: _Tensor, scales: _Tensor, zeros: _OptT, global_scale: _OptT,
                                input_scale: _OptT, wbias: _OptT, k_perm: _OptT, scheme: str, shape: list[int],
                                offsets: _Tensor, bias: _OptT, backend: str = "auto",
                                out_dtype: Optional[torch.dtype] = None) -> _Tensor:
    from cutlass_ext import native_op

    from . import plans
    from .linear import grouped_linear
    made_at = native_op.epoch()  # before planning, as in _quant_linear_native_miss
    qw = quant_weight_from_args(data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape)
    y = grouped_linear(x, qw, offsets, bias, backend, out_dtype)
    run = plans.find(qw, plans.grouped_key(x, offsets, backend, out_dtype), bias) if plans.usable(x) else None
    if run is not None:
        native_op.offer(run, x, (data, scales, zeros, global_scale, input_scale, wbias, k_perm, scheme, shape),
                        bias, backend, out_dtype, made_at, offsets=offsets)
    return y


grouped_linear_native_op = _define("grouped_linear_native")(_grouped_linear)
_define("_grouped_linear_native_miss")(_grouped_linear_native_miss)
_fake("grouped_linear_native")(_grouped_linear_fake)
_fake("_grouped_linear_native_miss")(_grouped_linear_fake)


# --- fused_moe -------------------------------------------------------------------------------------------------
def _fused_moe(hidden: _Tensor,
               w13_data: _Tensor, w13_scales: _Tensor, w13_zeros: _OptT, w13_global_scale: _OptT,
               w13_input_scale: _OptT, w13_bias: _OptT, w13_k_perm: _OptT, w13_scheme: str, w13_shape: list[int],
               w2_data: _Tensor, w2_scales: _Tensor, w2_zeros: _OptT, w2_global_scale: _OptT,
               w2_input_scale: _OptT, w2_bias: _OptT, w2_k_perm: _OptT, w2_scheme: str, w2_shape: list[int],
               topk_weights: _Tensor, topk_ids: _Tensor, activation: str = "silu",
               backend: str = "auto") -> _Tensor:
    """Top-k MoE over ``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` -> ``[T, H]`` in hidden's dtype."""
    from .linear import fused_moe
    w13 = quant_weight_from_args(w13_data, w13_scales, w13_zeros, w13_global_scale, w13_input_scale, w13_bias, w13_k_perm,
                                 w13_scheme, w13_shape)
    w2 = quant_weight_from_args(w2_data, w2_scales, w2_zeros, w2_global_scale, w2_input_scale, w2_bias, w2_k_perm,
                                w2_scheme, w2_shape)
    return fused_moe(hidden, w13, w2, topk_weights, topk_ids, activation, backend)


def _fused_moe_fake(hidden, w13_data, w13_scales, w13_zeros, w13_global_scale, w13_input_scale, w13_bias, w13_k_perm,
                    w13_scheme, w13_shape, w2_data, w2_scales, w2_zeros, w2_global_scale, w2_input_scale, w2_bias,
                    w2_k_perm, w2_scheme, w2_shape, topk_weights, topk_ids, activation="silu", backend="auto"):
    _check_k(hidden, w13_shape, "fused_moe")
    return hidden.new_empty(hidden.shape[0], w2_shape[-2])


# as quant_linear: a twin without the autograd layer, for modules running without gradients
fused_moe_op = _define("fused_moe")(_fused_moe)
fused_moe_nograd_op = _define("fused_moe_nograd")(_fused_moe)
_fake("fused_moe")(_fused_moe_fake)
_fake("fused_moe_nograd")(_fused_moe_fake)


# --- quantize_activation ---------------------------------------------------------------------------------------
def _act_scale_meta(x: _Tensor, spec: ActQuant) -> tuple[list[int], torch.dtype]:
    k = x.shape[-1]
    groups = k // spec.group_k if spec.group_k else 1
    d = spec.scale_dtype
    return [*x.shape[:-1], groups], (d.torch_dtype if isinstance(d, WideFloat) else torch.uint8)


@_define("quantize_activation")
def quantize_activation_op(x: _Tensor, spec: str, input_scale: _OptT = None) -> tuple[_Tensor, _Tensor, _Tensor]:
    """-> ``(codes uint8 [..., K], scales, global_scale)``; ``global_scale`` is an empty ``[0]`` tensor when the
    spec has none (an op cannot return an optional tensor)."""
    from .formats.activation import quantize_activation
    q = quantize_activation(x, _act_spec(spec), input_scale)
    # outputs must be fresh, contiguous tensors: never an input (input_scale) or a broadcast view of one
    codes, scales = q.codes.contiguous(), q.scales.contiguous().clone()
    gs = x.new_empty(0, dtype=torch.float32) if q.global_scale is None else q.global_scale.reshape(1).clone()
    return codes, scales, gs


@_fake("quantize_activation")
def _(x, spec, input_scale=None):
    a = _act_spec(spec)
    sshape, sdtype = _act_scale_meta(x, a)
    gs = x.new_empty(1 if a.global_scale else 0, dtype=torch.float32)
    return x.new_empty(x.shape, dtype=torch.uint8), x.new_empty(sshape, dtype=sdtype), gs


def quantize_activation(x: _Tensor, spec: "ActQuant | QuantScheme | str", input_scale: _OptT = None) -> QuantActivation:
    """Graph-safe ``ht.quantize_activation``: same result, through the custom op."""
    if isinstance(spec, str):
        key = spec.strip().lower()
        spec = QuantScheme.parse(key) if ("=" in key or key in PRESETS) else ActQuant.parse(key)
    if isinstance(spec, QuantScheme):
        spec = spec.act
    if spec is None:
        raise ValueError("this scheme has 16-bit activations; there is nothing to quantize")
    codes, scales, gs = quantize_activation_op(x, str(spec), input_scale)
    return QuantActivation(codes, scales, spec, gs.reshape(()) if gs.numel() else None)


for _name in ("grouped_linear", "fused_moe", "quantize_activation", "dequantize"):
    torch.library.register_autograd(f"humming_triton::{_name}", _not_differentiable(_name),
                                    setup_context=_no_backward_setup, lib=_LIB)
