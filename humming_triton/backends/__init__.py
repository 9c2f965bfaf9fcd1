"""Backends as a registry.  A backend is one module in this folder that registers itself: what it can run
(``reason(call)`` -> None or why not), the candidates the tuner may time for a call, and how it runs each op.

Built in: ``reference`` (the pure-torch oracle and CPU fallback), ``triton`` (our kernels) and ``torch``
(torch ops composed around our Triton quantize/dequantize kernels: dequantize + cuBLAS, dequantize +
``torch._grouped_mm``, ``torch._scaled_mm`` on our fp8 codes).  A new backend (``cutlass``) is one new module
here: the registry imports every module of this package on first use.
"""
from __future__ import annotations

from .._plugins import import_all
from ..calls import Call, Candidate

__all__ = ["Backend", "register", "get", "names", "registered"]

_BACKENDS: dict[str, "Backend"] = {}


class Backend:
    """Subclasses set ``name`` and override what they support.  ``families`` backends (triton, torch) get
    their candidates from the kernel-family registry; others return their own."""
    name = ""
    auto = True  # may ``auto`` choose it (from the measured table)?  The reference never is on CUDA.

    def reason(self, call: Call) -> str | None:
        return f"backend {self.name!r} does not run {call.op}"

    def candidates(self, call: Call) -> list[Candidate]:
        return [Candidate(self.name, "default")]

    def default(self, call: Call) -> Candidate | None:
        """The backend's built-in choice when no measured entry applies (None: it has none for this call)."""
        cands = self.candidates(call)
        return cands[0] if cands else None

    # how each op runs; ``cand`` is dispatch's choice (None for backends without families)
    def quant_linear(self, x, qw, bias, out_dtype, cand: Candidate | None):
        raise NotImplementedError

    def plan_linear(self, x, qw, bias, out_dtype, cand: Candidate | None):
        """A runner ``(x, bias) -> y or None`` for repeats of this quant_linear call's signature (plans.py), made
        right after the call ran; None: repeats take the full path."""
        return None

    def grouped_linear(self, x, qw, offsets, bias, out_dtype, cand: Candidate | None):
        raise NotImplementedError

    def plan_grouped(self, x, qw, offsets, bias, out_dtype, cand: Candidate | None):
        """A runner ``(x, offsets, bias) -> y or None`` for repeats of this grouped_linear call's signature
        (plans.py), made after the call's checks; here the same call without them."""
        return lambda x, offsets, bias: self.grouped_linear(x, qw, offsets, bias, out_dtype, cand)

    def fused_moe(self, hidden, w13, w2, topk_weights, topk_ids, activation, cand: Candidate | None):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


def register(backend: Backend) -> Backend:
    if not backend.name:
        raise ValueError("a backend needs a name")
    _BACKENDS[backend.name] = backend
    return backend


def _load() -> None:
    import_all(__name__)


def registered() -> dict[str, Backend]:
    _load()
    return dict(_BACKENDS)


def get(name: str) -> Backend:
    found = registered().get(name)
    if found is None:
        raise ValueError(f"unknown backend {name!r}; expected 'auto' or one of {names()}")
    return found


def names() -> tuple[str, ...]:
    return tuple(sorted(registered()))
