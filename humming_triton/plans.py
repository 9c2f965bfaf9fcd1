"""Call plans: the host path of a repeated call, cut down to what changes from call to call.

Why: a decode step calls every layer with the same signature again and again, and a decode GEMM runs in less GPU
time than the Python around its launch took (benchmarks/results/h200/host/).  The first call of a signature goes
the whole way -- input checks, dispatch, the family's launch planning -- and its backend may leave a *plan*: a
runner that does only the per-call work (the output tensor, the activations' pointers, the launch).

A plan holds while nothing it was derived from changed: the weight's tensors (their version counters: an in-place
edit such as ``qw.scales.mul_(2)`` drops it, as it drops ``QuantWeight.cached_view``), the bias object, and the
state dispatch decided under (``dispatch.clear_caches``, a posed device, batch-invariant mode).  A runner handed an
activation it was not made for (another memory layout or alignment) returns None and the call takes the full path.
Plans are made and used only for plain tensors outside torch.compile tracing; they live in the weight's
``cache`` (never serialized).
"""
from __future__ import annotations

import torch

from . import capability, dispatch
from .batch_invariant import _ON as _INVARIANT
from .formats.weight import QuantWeight

__all__ = ["find", "offer", "usable", "linear_key", "grouped_key"]

ENABLED = True  # off: every call takes the full path (benchmarks.overhead times both in one run)
_SLOT = "plans"
_MAX_PLANS = 64  # per weight: a server sees a handful of signatures per layer


def _state() -> tuple:
    return dispatch._generation[0], capability._override, _INVARIANT[0]


def _versions(tensors: tuple) -> tuple:
    out = []
    for t in tensors:  # spelled out: this runs on every planned call
        try:
            out.append(t._version)
        except RuntimeError:  # inference tensors have no version counter
            out.append(-2)
    return tuple(out)


def _weight_tensors(qw: QuantWeight) -> tuple:
    return tuple(t for t in (qw.data, qw.scales, qw.zeros, qw.global_scale, qw.input_scale, qw.bias, qw.k_perm)
                 if t is not None)


class _Plan:
    __slots__ = ("runner", "bias", "state", "tensors", "versions", "choice")

    def __init__(self, runner, bias, tensors, choice):
        self.runner, self.bias, self.state, self.choice = runner, bias, _state(), choice
        self.tensors, self.versions = tensors, _versions(tensors)


def usable(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` may use or make a plan: a plain tensor (no fake / subclass tensor), not while
    torch.compile traces."""
    return ENABLED and type(x) is torch.Tensor and not torch.compiler.is_compiling()


def linear_key(x: torch.Tensor, backend: str, out_dtype: torch.dtype | None) -> tuple:
    """The plan key of ``quant_linear(x, qw, bias, backend, out_dtype)``."""
    return ("quant_linear", backend, x.shape, x.dtype, x.device, out_dtype)


def grouped_key(x: torch.Tensor, offsets: torch.Tensor, backend: str, out_dtype: torch.dtype | None) -> tuple:
    """The plan key of ``grouped_linear(x, qw, offsets, bias, backend, out_dtype)``."""
    return ("grouped_linear", backend, x.shape, x.dtype, x.device, out_dtype, offsets.shape, offsets.dtype)


def find(qw: QuantWeight, key: tuple, bias: torch.Tensor | None):
    """The runner planned for ``key`` on ``qw`` if it still holds (module docstring), else None (also for a
    ``qw`` that is no QuantWeight: the full call's checks name that problem)."""
    plans = qw.cache.get(_SLOT) if isinstance(qw, QuantWeight) else None
    if plans is None:
        return None
    plan = plans.get(key)
    if plan is None or plan.bias is not bias or plan.state != _state() or _versions(plan.tensors) != plan.versions:
        return None
    dispatch._last[key[0]] = plan.choice  # what last_plan() reports, as a full call would have set it
    return plan.runner


def offer(qw: QuantWeight, key: tuple, bias: torch.Tensor | None, choice: tuple, make) -> None:
    """Store ``make()`` as the plan for ``key`` (after a full call; None from ``make``: this call has none).
    ``choice``: dispatch's (backend, candidate) for the call."""
    runner = make()
    if runner is None:
        return
    plans = qw.cache.setdefault(_SLOT, {})
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plans[key] = _Plan(runner, bias, _weight_tensors(qw), choice)
