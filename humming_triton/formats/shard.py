"""Tensor / expert parallel shards of a QuantWeight, in the canonical layout (views where the layout allows).

``dim``: ``"n"`` (column parallel: each rank computes its slice of the outputs, concatenated), ``"k"`` (row
parallel: each rank takes its slice of x's features and the partial outputs are summed -- an all-reduce), or
``"expert"`` (expert parallel: a slice of the experts of a 3-D weight).

A split point must fall where every stored tensor splits cleanly:

* along N: on a scale block (``b128x128``: a multiple of 128 rows; per-row scales: anywhere);
* along K: on a packed-word boundary (``k * bits`` a multiple of 32: any k for 1/2/4/8-bit codes, a multiple of
  32 for 3/5/7 bits, 16 for 6), on a scale group (``g128``: a multiple of 128; per-channel scales are shared by
  every K-shard) and on the activation group of a quantized-activation scheme.
  Act-order (``k_perm``) weights shard along N only: a K-shard's stored columns are scattered logical columns,
  which a rank's contiguous slice of x does not hold.

Per-tensor values (NVFP4's global scale, a static ``input_scale``) go to every shard; the bias follows N, and
along K only the first shard keeps it (the all-reduce adds it once).  Dynamic per-token activation scales are each
rank's own along K -- the semantics of row parallelism with quantized activations.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from .packing import packed_words
from .weight import QuantWeight

__all__ = ["DIMS", "split_quantum", "even_cuts", "split_points", "shard_range", "shard", "unshard"]

DIMS = ("n", "k", "expert")


def _check_dim(dim: str) -> None:
    if dim not in DIMS:
        raise ValueError(f"shard dim must be one of {DIMS}, got {dim!r}")


def split_quantum(qw: QuantWeight, dim: str) -> int:
    """The multiple every split point along ``dim`` must be (the last shard may end anywhere)."""
    _check_dim(dim)
    s = qw.scheme
    if dim == "expert":
        if qw.num_experts is None:
            raise ValueError("expert shards need a 3-D [E, N, K] QuantWeight")
        return 1
    if dim == "n":
        return s.scale.block_n or 1
    if qw.k_perm is not None:
        raise ValueError("act-order (k_perm) weights shard along N only: a K-shard's stored columns are scattered "
                         "logical columns that a rank's contiguous slice of x does not hold")
    q = 32 // math.gcd(32, s.bits)  # k * bits on a word boundary
    if s.scale.block_k:
        q = math.lcm(q, s.scale.block_k)
    if s.act is not None and s.act.group_k:
        q = math.lcm(q, s.act.group_k)
    return q


def _extent(qw: QuantWeight, dim: str) -> int:
    return {"n": qw.N, "k": qw.K, "expert": qw.num_experts or 0}[dim]


def even_cuts(extent: int, quantum: int, parts: int, what: str) -> list[int]:
    """``parts + 1`` boundaries ``0 = b0 < b1 < ... = extent`` on multiples of ``quantum``, as even as that allows
    (``what`` names the extent in the error).  Also used where no QuantWeight exists yet: a checkpoint's
    per-expert layers are dealt out to expert-parallel ranks by their count alone (checkpoints/sharding.py)."""
    if not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts must be a positive int, got {parts!r}")
    cuts = [min(extent, -(-(i * extent // parts) // quantum) * quantum) for i in range(parts)] + [extent]
    if any(b <= a for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"{what} cannot be split into {parts} non-empty shards on multiples of {quantum}")
    return cuts


def split_points(qw: QuantWeight, dim: str, parts: int) -> list[int]:
    """``parts + 1`` boundaries ``0 = b0 < b1 < ... = extent``: as even as the split quantum allows."""
    q, extent = split_quantum(qw, dim), _extent(qw, dim)
    label = dim.upper() if dim != "expert" else "the experts"
    return even_cuts(extent, q, parts, f"{label}={extent} of {qw.scheme.name}")


def shard_range(qw: QuantWeight, dim: str, start: int, stop: int) -> QuantWeight:
    """Rows ``[start, stop)`` of N, columns ``[start, stop)`` of K, or experts ``[start, stop)``."""
    q, extent = split_quantum(qw, dim), _extent(qw, dim)
    if not 0 <= start < stop <= extent:
        raise ValueError(f"shard [{start}, {stop}) is not a non-empty range of {dim} = [0, {extent})")
    for b in (start, stop):
        if b % q and b != extent:
            raise ValueError(f"a {qw.scheme.name} shard along {dim} must start and end on a multiple of {q} "
                             f"(or at {extent}); got [{start}, {stop})")
    s = qw.scheme
    if dim == "expert":
        pick = lambda t: None if t is None else t[start:stop]  # noqa: E731
        kp = qw.k_perm if qw.k_perm is None or qw.k_perm.dim() == 1 else qw.k_perm[start:stop]
        return replace(qw, data=qw.data[start:stop], scales=pick(qw.scales), zeros=pick(qw.zeros),
                       global_scale=pick(qw.global_scale), bias=pick(qw.bias), k_perm=kp,
                       shape=(stop - start, *qw.shape[1:]), cache={})
    lead = qw.lead
    if dim == "n":
        bn = s.scale.block_n
        rows = slice(start // bn, -(-stop // bn)) if bn else slice(None)
        scales = qw.scales[..., rows, :]
        zeros = None if qw.zeros is None else qw.zeros[..., rows, :]
        bias = None if qw.bias is None else qw.bias[..., start:stop]
        out = replace(qw, data=qw.data[..., start:stop, :], scales=scales, zeros=zeros, bias=bias,
                      shape=(*lead, stop - start, qw.K), cache={})
    else:
        k_new = stop - start
        w0 = start * s.bits // 32
        data = qw.data[..., w0:w0 + packed_words(k_new, s.bits)]
        bk = s.scale.block_k
        cols = slice(start // bk, -(-stop // bk)) if bk else slice(None)
        scales = qw.scales[..., cols]
        zeros = None if qw.zeros is None else qw.zeros[..., cols]
        # contiguous copies: a K-slice of row-major words is strided (made once, at load)
        out = replace(qw, data=data.contiguous(), scales=scales.contiguous(),
                      zeros=None if zeros is None else zeros.contiguous(), bias=qw.bias if start == 0 else None,
                      shape=(*lead, qw.N, k_new), cache={})
    why = s.shape_error(out.N, out.K)
    if why:
        raise ValueError(f"shard [{start}, {stop}) along {dim}: {why}")
    return out


def shard(qw: QuantWeight, dim: str, parts: int, index: int) -> QuantWeight:
    """Shard ``index`` of ``parts`` along ``dim`` (``split_points``' even split)."""
    if not 0 <= index < parts:
        raise ValueError(f"shard index {index} is not in [0, {parts})")
    cuts = split_points(qw, dim, parts)
    return shard_range(qw, dim, cuts[index], cuts[index + 1])


def unshard(shards: list[QuantWeight], dim: str) -> QuantWeight:
    """The inverse of sharding: shards in order, same scheme, along ``dim``."""
    _check_dim(dim)
    if not shards:
        raise ValueError("unshard needs at least one shard")
    first = shards[0]
    for sh in shards[1:]:
        if sh.scheme != first.scheme:
            raise ValueError(f"cannot unshard {first.scheme.name} with {sh.scheme.name}")
        if (sh.global_scale is None) != (first.global_scale is None) or (
                dim != "expert" and sh.global_scale is not None and not torch.equal(sh.global_scale,
                                                                                   first.global_scale)):
            raise ValueError("shards of one weight share its global scale")
    cat = lambda name, d: None if getattr(first, name) is None else torch.cat(  # noqa: E731
        [getattr(sh, name) for sh in shards], d)
    if dim == "expert":
        return replace(first, data=cat("data", 0), scales=cat("scales", 0), zeros=cat("zeros", 0),
                       global_scale=cat("global_scale", 0), bias=cat("bias", 0),
                       k_perm=first.k_perm if first.k_perm is None or first.k_perm.dim() == 1 else cat("k_perm", 0),
                       shape=(sum(sh.num_experts for sh in shards), *first.shape[1:]), cache={})
    s = first.scheme
    if dim == "n":
        shared = not s.scale.block_n  # one tensor-wide scale row: every shard holds it
        return replace(first, data=cat("data", -2), scales=first.scales if shared else cat("scales", -2),
                       zeros=None if first.zeros is None else (first.zeros if shared else cat("zeros", -2)),
                       bias=cat("bias", -1), shape=(*first.lead, sum(sh.N for sh in shards), first.K), cache={})
    for sh in shards[:-1]:
        if sh.K * s.bits % 32:
            raise ValueError(f"K-shard of {sh.K} columns does not end on a packed word ({s.bits}-bit codes)")
    shared = not s.scale.block_k  # channel / tensor scales: every K-shard holds them
    return replace(first, data=cat("data", -1), scales=first.scales if shared else cat("scales", -1),
                   zeros=None if first.zeros is None else (first.zeros if shared else cat("zeros", -1)),
                   bias=first.bias, shape=(*first.lead, first.N, sum(sh.K for sh in shards)), cache={})
