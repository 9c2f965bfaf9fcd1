"""Stacking per-expert checkpoint layers into the fused 3-D experts of Hugging Face (transformers >= 5) models.

Checkpoints of Qwen3-MoE / Mixtral / DeepSeek store one linear per expert and projection
(``experts.<e>.gate_proj`` / ``up_proj`` / ``down_proj``, Mixtral ``w1`` / ``w3`` / ``w2``); the HF module holds
``gate_up_proj [E, 2I, H]`` (gate rows, then up rows) and ``down_proj [E, H, I]``.  Concatenating along N is
pure stacking of packed rows, scales and zeros -- exact -- once every piece has the same scheme:

* an expert whose zeros all happened to be ``2**(bits-1)`` was imported with signed codes; it is turned back
  into unsigned codes + that zero (the inverse bit flip), so all experts share one scheme;
* integer zeros widen to float zeros when one expert needed them (GPTQ v1 8-bit);
* NVFP4 gate and up shards with different global scales (ModelOpt ``weight_scale_2``): one global per expert
  is kept (the larger) and the other shard's e4m3 block scales are multiplied by the ratio.  That is exact when
  every rescaled block scale is an e4m3 value (e.g. a power-of-two ratio without underflow); otherwise the
  block scales are re-rounded to nearest (codes untouched) with a warning that names the layer.
* act-order permutations must agree between gate and up (they read the same x); otherwise a clear error.
"""
from __future__ import annotations

import dataclasses
import warnings

import torch

from ..formats.dtypes import IntType
from ..formats.packing import pack_codes
from ..formats.weight import QuantWeight
from ._common import CheckpointFormatError

__all__ = ["fuse_experts", "concat_n", "stack_experts"]


def _to_unsigned(qw: QuantWeight) -> QuantWeight:
    s = qw.scheme
    if not (isinstance(s.weight, IntType) and s.weight.signed):
        return qw
    half = 1 << (s.bits - 1)
    flip = pack_codes(torch.full((1, qw.K), half, dtype=torch.int32), s.bits)
    zeros = torch.full(qw.scales.shape, half, dtype=torch.uint8)
    scheme = dataclasses.replace(s, weight=IntType(s.bits, False), zero="int")
    return dataclasses.replace(qw, data=qw.data ^ flip, zeros=zeros, scheme=scheme, cache={})


def _harmonize(parts: list[QuantWeight]) -> list[QuantWeight]:
    if len({p.scheme for p in parts}) == 1:
        return parts
    parts = [_to_unsigned(p) for p in parts]
    if len({p.scheme for p in parts}) > 1 and {p.scheme.zero for p in parts} == {"int", "float"}:
        parts = [p if p.scheme.zero == "float" else dataclasses.replace(
            p, zeros=p.zeros.to(p.scales.dtype), scheme=dataclasses.replace(p.scheme, zero="float"), cache={})
            for p in parts]
    if len({p.scheme for p in parts}) > 1:
        raise CheckpointFormatError(f"expert layers have different schemes that cannot be fused: "
                                    f"{sorted({p.scheme.name for p in parts})}")
    return parts


def _fold_global(parts: list[QuantWeight], name: str) -> list[QuantWeight]:
    gs = [float(p.global_scale) for p in parts]
    if len(set(gs)) == 1:
        return parts
    g = max(gs)
    out, exact = [], True
    for p, gi in zip(parts, gs):
        d = p.scheme.scale.dtype
        val = d.decode(p.scales).double() * (gi / g)
        codes = d.encode(val)
        exact &= bool((d.decode(codes).double() == val).all())
        out.append(dataclasses.replace(p, scales=codes.to(torch.uint8), global_scale=torch.tensor(g), cache={}))
    if not exact:
        warnings.warn(f"{name}: shards carry different global scales {gs}; the block scales were re-rounded to "
                      f"one global scale {g} (not exact for every block)", stacklevel=3)
    return out


def concat_n(parts: list[QuantWeight], name: str) -> QuantWeight:
    """2-D QuantWeights with the same K -> one whose rows are the parts' rows in order."""
    parts = _harmonize(parts)
    if parts[0].global_scale is not None:
        parts = _fold_global(parts, name)
    s = parts[0].scheme
    if s.scale.block_n not in (1,) and any(p.N % s.scale.block_n for p in parts[:-1]):
        raise CheckpointFormatError(f"{name}: cannot fuse shards whose N is not a multiple of the scale block "
                                    f"{s.scale.block_n} (or per-tensor scales)")
    perms = [p.k_perm for p in parts]
    if any(x is not None for x in perms) and not all(x is not None and torch.equal(x, perms[0]) for x in perms):
        raise CheckpointFormatError(f"{name}: act-order shards with different K permutations cannot share one "
                                    "input; load them unfused")
    cat = lambda f: None if getattr(parts[0], f) is None else torch.cat([getattr(p, f) for p in parts])  # noqa: E731
    return QuantWeight(cat("data"), cat("scales"), s, (sum(p.N for p in parts), parts[0].K), cat("zeros"),
                       parts[0].global_scale, parts[0].input_scale, cat("bias"), k_perm=perms[0])


def stack_experts(parts: list[QuantWeight], name: str) -> QuantWeight:
    """E 2-D QuantWeights of one shape -> the 3-D ``[E, N, K]`` QuantWeight."""
    parts = _harmonize(parts)
    st = lambda f: None if getattr(parts[0], f) is None else torch.stack([getattr(p, f) for p in parts])  # noqa: E731
    perms = [p.k_perm for p in parts]
    kp = None if all(x is None for x in perms) else torch.stack(
        [torch.arange(parts[0].K) if x is None else x for x in perms])
    ins = {float(p.input_scale) for p in parts if p.input_scale is not None}
    if len(ins) > 1:
        # one static activation scale per expert set: the largest never clips (the activation is shared)
        warnings.warn(f"{name}: experts carry different input scales; using the largest", stacklevel=3)
    inp = None if not ins else torch.tensor(max(ins), dtype=torch.float32)
    return QuantWeight(st("data"), st("scales"), parts[0].scheme, (len(parts), *parts[0].shape), st("zeros"),
                       st("global_scale"), inp, st("bias"), k_perm=kp)


def fuse_experts(gate: list[QuantWeight], up: list[QuantWeight], down: list[QuantWeight],
                 name: str) -> tuple[QuantWeight, QuantWeight]:
    """Per-expert gate / up / down -> (gate_up ``[E, 2I, H]`` with gate rows first, down ``[E, H, I]``)."""
    if not (len(gate) == len(up) == len(down)) or not gate:
        raise CheckpointFormatError(f"{name}: expected the same number of gate/up/down experts, got "
                                    f"{len(gate)}/{len(up)}/{len(down)}")
    gu = [concat_n([g, u], f"{name}.{e}.gate_up") for e, (g, u) in enumerate(zip(gate, up))]
    return stack_experts(gu, f"{name}.gate_up_proj"), stack_experts(down, f"{name}.down_proj")

