"""Kernel families as a registry: one module per family, each saying what it supports, its tuning candidates
and how it launches (a ``LaunchSpec`` the runtime and ``kernels.inspect`` share).

A family belongs to a backend (``triton`` for our kernels, ``torch`` for paths composed of torch ops around our
Triton quantize/dequantize kernels) and to one op.  The tuner, ``kernels.inspect``, ``scripts/compile_check.py``
and the tests iterate ``registered()``; a new family is a new module in this folder and nothing else.
"""
from __future__ import annotations

from ..._plugins import import_all
from ...calls import Call, KernelConfig
from ..launch import LaunchSpec

__all__ = ["Family", "register", "get", "registered", "base_constexprs"]

_FAMILIES: dict[str, "Family"] = {}


class Family:
    """Override ``reason`` and ``candidates``; single-launch families override ``spec`` (the runtime caches the
    launch), multi-step ones (quantize + GEMM, dequantize + cuBLAS) override ``run``."""
    name = ""
    op = "quant_linear"
    backend = "triton"

    def reason(self, call: Call) -> str | None:
        """None when this family can run the call, else why not."""
        return None

    def mma(self, call: Call) -> str:
        """The MMA kind this family needs for the call (capability.MMA_KINDS; "fma": no tensor cores)."""
        return "fma"

    def candidates(self, call: Call) -> list[KernelConfig]:
        """Configs worth timing for this call (each costs one compilation in the sweep)."""
        return []

    def config_reason(self, call: Call, cfg: KernelConfig) -> str | None:
        """Why this family cannot run a call with this particular config (a measured table's pick), else None --
        for families whose configs depend on what was built (prebuilt kernels)."""
        return None

    def spec(self, fmt: dict, call: Call, cfg: KernelConfig, has_bias: bool) -> LaunchSpec | None:
        return None

    def run(self, x, x2, qw, bias, out_dtype, cfg: KernelConfig, out):
        raise NotImplementedError(f"family {self.name} is launched through spec()")

    def runner(self, x2, qw, bias, out_dtype, cfg: KernelConfig, shape: tuple):
        """A multi-step family's lean plan (``humming_triton.plans``) for repeats of a ``run`` call on ``x2``
        with this bias: ``(x, bias) -> y`` of ``shape``, or None from it for an ``x`` it was not made for.
        None here: repeats call ``run``."""
        return None

    def grouped_runner(self, x, offsets, qw, bias, out_dtype, cfg: KernelConfig):
        """A grouped family's lean plan for repeats of a ``run(x, offsets, ...)`` call: ``(x, offsets, bias) ->
        y``, or None from it for arguments it was not made for.  None here: repeats call ``run``."""
        return None

    def __repr__(self) -> str:
        return f"<family {self.backend}/{self.name} ({self.op})>"


def register(family: Family) -> Family:
    if family.name in _FAMILIES and type(_FAMILIES[family.name]) is not type(family):
        raise ValueError(f"kernel family {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def _load() -> None:
    import_all(__name__)


def get(name: str) -> Family:
    _load()
    if name not in _FAMILIES:
        raise ValueError(f"unknown kernel family {name!r}; registered: {sorted(_FAMILIES)}")
    return _FAMILIES[name]


def registered(op: str | None = None, backend: str | None = None) -> list[Family]:
    _load()
    return [f for f in _FAMILIES.values() if (op is None or f.op == op) and (backend is None or f.backend == backend)]


def base_constexprs(fmt: dict, call: Call, cfg: KernelConfig, has_bias: bool) -> dict:
    """The constexprs every dense weight-only family takes: tiles, split, masks, bias, the format."""
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
                EVEN_K=call.k % cfg.block_k == 0, HAS_BIAS=has_bias, **fmt)


def tile_mma(call: Call) -> str:
    """The MMA the tiled tensor-core kernels need for this call's activations (capability.kernel_mma_kind)."""
    from ...capability import kernel_mma_kind
    return kernel_mma_kind(None if call.scheme.act is None else str(call.scheme.act.dtype), call.dtype)


def packed_int4(fmt: dict, post: bool, dtype) -> bool:
    """Signed int4 codes, no zero point, one scale per K tile, 16-bit x: the packed int4 decode applies
    (decode.load_int4_tile_16)."""
    return (fmt["BITS"] == 4 and not fmt["W_IS_FLOAT"] and fmt["W_SIGNED"] and fmt["ZERO_KIND"] == 0 and post
            and dtype.itemsize == 2)


SHARED_BYTES = 232448  # per block on sm_90 (H100 / H200), the largest of the supported targets


def swap_tile_fits(bm: int, bn: int, bk: int, warps: int, stages: int, bits: int, heavy: bool) -> bool:
    """Whether a swap-AB tile is worth compiling: its fp32 accumulator within 128 registers per thread, its
    pipeline (x's bm x bk 16-bit tiles and the weight's bn x bk codes, ``stages`` deep, as Triton lays them out) in
    shared memory with 4 KB left for scratch, and for ``heavy`` weights (codes gathered from two words, or zero
    points) at most 4096 weight elements per K tile (H200: larger ones overflowed shared memory)."""
    return (bm * bn // (warps * 32) <= 128 and not (heavy and bn * bk > 4096)
            and stages * (bm * bk * 2 + bn * bk * bits // 8) + 4096 <= SHARED_BYTES)


def sixteen_bit_reason(call: Call) -> str | None:
    if call.scheme.act is not None:
        return f"{call.scheme.name} quantizes its activations (this family takes 16-bit activations)"
    return None
