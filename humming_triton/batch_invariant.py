"""Batch-invariant mode: each output row bitwise independent of M and of the other rows in the batch.

``ht.set_batch_invariant(True)`` (or ``with ht.batch_invariant():``) makes every ``quant_linear`` /
``grouped_linear`` call run one path whose arithmetic per row does not depend on the batch: on CUDA (and under the
interpreter) a Triton tile kernel with one fixed config for every M -- fixed K tile and K order, no split-K, no
M-dependent family switch (the measured table, the native decode kernels and dequantize + cuBLAS all pick by M and
are bypassed) -- and on CPU the reference computed row by row.  Evaluation and RL users ask for it: the same
prompt gives the same logits whatever else is in the batch.

Refused with a clear error: schemes whose activation quantization couples the rows (NVFP4 activations' per-tensor
global scale, unless it is a calibrated static ``input_scale``), explicit backends other than ``triton`` /
``reference``, and ``fused_moe`` (its routing kernels are not covered yet).
"""
from __future__ import annotations

import contextlib

from . import state_watch
from .calls import Call, Candidate, KernelConfig

__all__ = ["set_batch_invariant", "is_batch_invariant", "batch_invariant", "invariant_candidate", "invariant_reason"]

_ON = [False]

# one config per family for every M: 64 x 64 tiles, K tile 64 (narrowed for small scale groups / odd bit widths)
DENSE = KernelConfig("tiled", 64, 64, 64, 1, 8, 4, 3)
ACT = KernelConfig("act_tiled", 64, 64, 64, 1, 8, 4, 3)
GROUPED = KernelConfig("grouped", 64, 64, 64, 1, 8, 4, 3)


def set_batch_invariant(on: bool = True) -> None:
    """Turn batch-invariant mode on or off for the process."""
    _ON[0] = bool(on)
    state_watch.changed()


def is_batch_invariant() -> bool:
    return _ON[0]


@contextlib.contextmanager
def batch_invariant(on: bool = True):
    """``with batch_invariant(): ...`` -- the mode for the block, restored after."""
    before = _ON[0]
    _ON[0] = bool(on)
    state_watch.changed()
    try:
        yield
    finally:
        _ON[0] = before
        state_watch.changed()


def invariant_reason(call: Call, backend: str, static_input_scale: bool = False) -> str | None:
    """Why this call cannot run batch-invariant (None if it can)."""
    if call.op == "fused_moe":
        return "fused_moe is not batch-invariant yet (use grouped_linear on sorted rows)"
    act = call.scheme.act
    if act is not None and act.global_scale and not static_input_scale:
        return (f"{call.scheme.name} quantizes activations with one global scale over the whole batch; a "
                "calibrated static input_scale makes it batch-invariant")
    if backend not in ("auto", "triton", "reference"):
        return f"backend {backend!r} chooses its kernels by M; batch-invariant mode runs 'triton' or 'reference'"
    return None


def invariant_candidate(call: Call) -> Candidate:
    """The Triton candidate every M of this call's (scheme, shape) runs."""
    from .kernels import configs
    base = GROUPED if call.op == "grouped_linear" else (ACT if call.scheme.act is not None else DENSE)
    bk = configs.fit_block_k(base.block_k, call.scheme.group_k(call.k), call.k, call.scheme.bits)
    return Candidate("triton", base.family, KernelConfig(**{**base.to_json(), "block_k": bk}))
