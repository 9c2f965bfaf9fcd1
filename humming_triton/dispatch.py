"""Backend choice: (device, scheme, shape) -> which implementation runs.

``backend="auto"`` picks Triton on CUDA when it supports the scheme, else the torch reference (with a one-time
warning when a CUDA tensor falls back).  An explicit backend that cannot run is a clear error, never a silent
fallback.  Device facts are read lazily: importing the package touches no CUDA.
"""
from __future__ import annotations

import functools
import os
import warnings

import torch

from .formats.weight import QuantWeight

BACKENDS = ("auto", "reference", "triton", "cutlass")
_last: dict[str, str] = {}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _triton_reason(op: str, x: torch.Tensor, qw: QuantWeight) -> str | None:
    """None when the Triton backend can run this call, else why not."""
    if not triton_available():
        return "triton is not installed"
    if not (x.is_cuda or interpreting()):
        return f"Triton kernels need CUDA tensors (x is on {x.device}); set TRITON_INTERPRET=1 to run them on CPU"
    if qw.k_perm is not None and qw.scheme.act is not None and (qw.scheme.act.group_k or op != "quant_linear"):
        # the Triton paths gather x into the weight's stored K order; activation groups (and the grouped
        # kernel's per-row quantization) would then follow that order instead of the logical one
        return f"act-order (k_perm) weights with quantized activations ({qw.scheme.act}) in {op}"
    from .kernels import supports
    return supports(op, qw.scheme, x.dtype)


def _call_reason(op: str, x: torch.Tensor, weights: tuple) -> tuple[str | None, str]:
    """(why Triton cannot run this call or None, the scheme concerned)."""
    for w in weights:
        why = _triton_reason(op, x, w)
        if why:
            return why, w.scheme.name
    return None, weights[0].scheme.name


def select_backend(op: str, x: torch.Tensor, qw: QuantWeight, backend: str = "auto",
                   *more: QuantWeight) -> str:
    """``more``: further weights of the same call (fused MoE's down projection), checked like ``qw``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if backend == "reference":
        chosen = "reference"
    elif backend == "cutlass":
        raise NotImplementedError("the CUTLASS backend is not built yet; use backend='triton' or 'reference'")
    elif backend == "triton":
        why, scheme = _call_reason(op, x, (qw, *more))
        if why:
            raise RuntimeError(f"backend='triton' cannot run {op} for scheme {scheme}: {why}")
        chosen = "triton"
    else:
        why, scheme = _call_reason(op, x, (qw, *more)) if (x.is_cuda or interpreting()) else ("CPU tensors", "")
        chosen = "triton" if why is None else "reference"
        if x.is_cuda and why is not None:
            _warn_once(op, scheme, why)
    _last[op] = chosen
    return chosen


@functools.lru_cache(maxsize=None)
def _warn_once(op: str, scheme: str, why: str) -> None:
    warnings.warn(f"humming_triton: {op} for {scheme} falls back to the slow torch reference on CUDA: {why}",
                  stacklevel=3)


def last_backend(op: str = "quant_linear") -> str | None:
    """The backend the most recent call of ``op`` ran on (for demos and logs)."""
    return _last.get(op)
