"""What every Triton launcher shares: a QuantWeight's format constexprs (made once, cached under the Triton
backend's key), its pointer/stride arguments, the POST_SCALE rule, and the cached, replayable launch."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ..formats.weight import QuantWeight
from .format_args import format_constexprs

CACHE_KEY = "triton"  # this backend's slot in QuantWeight.cache (never serialized)


def backend_cache(qw: QuantWeight) -> dict:
    """The Triton backend's private state on a QuantWeight (format constexprs, planned launches)."""
    return qw.cache.setdefault(CACHE_KEY, {})


def weight_format(qw: QuantWeight) -> dict:
    state = backend_cache(qw)
    fmt = state.get("format")
    if fmt is None:
        fmt = state["format"] = format_constexprs(qw.scheme, qw.N, qw.K)
    return fmt


def launch_format(fmt: dict, k: int, block_k: int) -> dict:
    if fmt["GROUP_K"] >= k and fmt["GROUP_K"] % block_k:
        # one scale spans all of K: any group extent >= K means the same; a multiple of BLOCK_K keeps one scale
        # per tile, so it can multiply the tile's fp32 partial product (K = 144, BLOCK_K = 128: extent 256)
        fmt = {**fmt, "GROUP_K": -(-k // block_k) * block_k}
    return fmt


def post_scale(fmt: dict, block_k: int) -> bool:
    """Whether the group scale can multiply the fp32 partial product of a K tile (one group spans the tile, no
    float zero point) instead of every weight element."""
    return fmt["ZERO_KIND"] != 2 and fmt["GROUP_K"] >= block_k and fmt["GROUP_K"] % block_k == 0


def weight_args(qw: QuantWeight) -> tuple[tuple, dict]:
    zeros = qw.zeros if qw.zeros is not None else qw.scales
    gscale = qw.global_scale if qw.global_scale is not None else qw.scales
    ptrs = (qw.data, qw.scales, zeros, gscale)
    strides = dict(stride_wn=qw.data.stride(0), stride_sn=qw.scales.stride(0), stride_sk=qw.scales.stride(1),
                   stride_zn=zeros.stride(0), stride_zk=zeros.stride(1))
    return ptrs, strides


@dataclass
class LaunchSpec:
    """One kernel launch as a family describes it, independent of the tensors: the runtime adds pointers and
    strides, ``kernels.inspect`` compiles it without a GPU -- both from this one description."""
    kernel: object
    grid: tuple
    constexprs: dict          # the kernel's constexpr parameters
    num_warps: int
    num_stages: int
    scalars: dict = field(default_factory=dict)  # runtime scalar arguments beyond M/N/K/strides (e.g. magic)
    split: int = 1            # SPLIT_K > 1: partials in a workspace, reduced in-kernel (decode.store_output)


class Launch:
    """One cached kernel launch of a QuantWeight for one call signature (M, dtypes, strides, pointer alignment):
    Triton's compiled kernel, its grid and its arguments with the per-call tensors (x, y, bias) as slots.  Why:
    re-binding ~35 arguments through Triton's launcher, plus our config lookup, cost ~130 µs of CPU per call
    against ~15 µs of GPU time for a decode GEMV (benchmarks/results/h200/overhead.txt).

    Our own per-call work (config lookup, argument assembly) is always cached, and Triton's compiled kernel is
    replayed directly (``CompiledKernel[grid](*args)``, skipping its binder) from the second call on: verified on
    the H200 (tests/test_dense_kernels.py: test_launch_replay_on_gpu) and timed there (benchmarks.overhead:
    37.5 against 91.2 µs of host time per call, 18126a2).  ``HUMMING_TRITON_LAUNCH_REPLAY=0`` turns it off."""

    __slots__ = ("kernel", "grid", "kwargs", "runner", "args", "slots", "split", "tiles")

    def __init__(self, spec: LaunchSpec, tensors_and_ints: dict):
        kernel = spec.kernel
        # three grid axes: the compiled kernel's runner indexes grid[0..2] (JITFunction.run pads, it does not)
        self.kernel, self.grid = kernel, tuple(spec.grid) + (1,) * (3 - len(spec.grid))
        self.kwargs = {**tensors_and_ints, **spec.scalars, **spec.constexprs, "num_warps": spec.num_warps,
                       "num_stages": spec.num_stages}
        self.split = spec.split
        self.tiles = self.grid[0] * self.grid[2] if self.split > 1 else 1  # output tiles (split-K counters)
        self.runner = None
        names = kernel.arg_names  # every parameter, constexprs included: the order Triton's launcher takes
        self.args = [self.kwargs.get(a) for a in names]
        self.slots = tuple(names.index(a) for a in ("x_ptr", "y_ptr", "b_ptr", "ws_ptr", "cnt_ptr"))

    def __call__(self, x2: torch.Tensor, y: torch.Tensor, b: torch.Tensor, ws: torch.Tensor,
                 cnt: torch.Tensor) -> None:
        if self.runner is not None:  # the compiled kernel, launched directly with the arguments bound once
            args = list(self.args)
            for slot, t in zip(self.slots, (x2, y, b, ws, cnt)):
                args[slot] = t
            self.runner(*args)
            return
        compiled = self.kernel[self.grid](**{**self.kwargs, "x_ptr": x2, "y_ptr": y, "b_ptr": b, "ws_ptr": ws,
                                             "cnt_ptr": cnt})
        if hasattr(compiled, "function") and os.environ.get("HUMMING_TRITON_LAUNCH_REPLAY", "1") == "1":
            self.runner = compiled[self.grid]  # a GPU compile (the interpreter returns no CompiledKernel)
