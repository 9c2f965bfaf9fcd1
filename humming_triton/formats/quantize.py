"""Reference round-to-nearest weight quantization and dequantization (pure torch, float32/float64 math).

Scale choice, per scale block (documented here because the error bounds in ``testing.py`` follow from it):

* symmetric integer / float: ``s = amax / qmax`` (``qmax`` = largest positive code value: 7 for int4, 6 for e2m1,
  448 for e4m3fn), rounded to the scale dtype *before* the codes are computed, so ``|w - w_hat| <= s * gap / 2``.
* e8m0 scales (MX): ``s = 2 ** ceil(log2(amax / qmax))`` -- rounding the exponent up never clips, unlike the
  OCP floor rule which can push values past ``qmax`` (e.g. up to 8 for e2m1 before saturating at 6).
* NV (e4m3 block scale + fp32 global): ``global = amax(tensor) / (448 * qmax)``, ``s = e4m3(amax_block / qmax /
  global)``; e4m3 rounding of ``s`` can make a value slightly exceed ``qmax``: it saturates (bounded in tests).
* integer zero point: ``[lo, hi] = [min(w, 0), max(w, 0)]``, ``s = (hi - lo) / qmax``, ``z = round(-lo / s)``.
* float zero point (HQQ style): ``s = (max - min) / qmax``, ``z = -min / s`` kept as a float; for 1 bit the two
  levels are ``mean -/+ mean|w - mean|`` instead of min/max (binarization).
"""
from __future__ import annotations

import math

import torch

from .dtypes import IntType, WideFloat
from .packing import pack_codes, unpack_codes
from .scheme import QuantScheme
from .weight import QuantWeight, decode_scales

__all__ = ["quantize_weight", "dequantize_weight", "expand_blocks", "block_reduce"]


def expand_blocks(t: torch.Tensor, bn: int, bk: int, n: int, k: int) -> torch.Tensor:
    """``[..., ceil(n/bn), ceil(k/bk)]`` per-block values -> ``[..., n, k]``."""
    return t.repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]


def block_reduce(w: torch.Tensor, bn: int, bk: int, op: str) -> torch.Tensor:
    """Reduce ``[..., n, k]`` over ``bn x bk`` blocks (partial edge blocks allowed) with amax / amin / max."""
    *lead, n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    fill = {"amax": 0.0, "min": math.inf, "max": -math.inf}[op]
    p = torch.full((*lead, nb * bn, kb * bk), fill, dtype=w.dtype, device=w.device)
    p[..., :n, :k] = w.abs() if op == "amax" else w
    p = p.reshape(*lead, nb, bn, kb, bk)
    if op == "min":
        return p.amin(dim=(-3, -1))
    return p.amax(dim=(-3, -1))


def positive_qmax(t) -> float:
    return float(t.qmax) if isinstance(t, IntType) else t.finite_max()


def invertible_fp32(g: torch.Tensor) -> torch.Tensor:
    """The nearest float32 at or above ``g`` (a few ulps at most) whose reciprocal round-trips exactly:
    compressed-tensors stores NVFP4 global scales as ``1/g``, so such a ``g`` survives export -> import
    bit for bit (about 13 % of float32 values have no exact reciprocal)."""
    out = g.clone()
    todo = torch.ones_like(g, dtype=torch.bool)
    for d in range(8):
        c = (g.view(torch.int32) + d).view(torch.float32)
        ok = todo & ((1.0 / (1.0 / c)) == c)
        out = torch.where(ok, c, out)
        todo = todo & ~ok
        if not bool(todo.any()):
            break
    return out


def round_scale(s: torch.Tensor, d) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ideal scales -> (stored scales in scale dtype ``d``, their exact float64 value)."""
    if isinstance(d, WideFloat):
        stored = s.to(d.torch_dtype)
        # a scale that rounds to 0 (or overflows) would lose the block: clamp into the dtype's range
        fi = torch.finfo(d.torch_dtype)
        stored = torch.where(stored == 0, torch.full_like(stored, fi.tiny), stored).clamp(max=fi.max)
        return stored, stored.double()
    if d.special == "e8m0":
        # ceil(log2(s)) exactly (a rounded log2 can land on an integer just above a power of two):
        # s = mant * 2**exp with mant in [0.5, 1), so s is a power of two iff mant == 0.5
        mant, exp = torch.frexp(s)
        e = exp - (mant == 0.5).to(exp.dtype)
        e = torch.where(torch.isinf(s), 127, e).clamp(-127, 127) + 127  # frexp(inf) has exponent 0
        codes = e.to(torch.int32)
    else:  # e4m3 scale: never round to zero
        codes = d.encode(s.clamp(min=d.value_table()[1].item()))
    stored = codes.to(torch.uint8)
    return stored, d.decode(codes).double()


def _check_input(w: torch.Tensor, scheme: QuantScheme) -> None:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(w).__name__}")
    if not w.dtype.is_floating_point or w.dtype.itemsize == 1:
        raise TypeError(f"weight must be a float tensor (fp32/fp16/bf16/fp64), got {w.dtype}")
    if w.dim() not in (2, 3):
        raise ValueError(f"weight must be [N, K] or [E, N, K], got shape {list(w.shape)}")
    if w.shape[-1] == 0 or w.shape[-2] == 0:
        raise ValueError(f"weight has an empty dimension: {list(w.shape)}")
    k = w.shape[-1]
    bk = scheme.scale.block_k
    if bk and scheme.scale.block_n == 1 and k % bk:
        raise ValueError(f"group size {bk} does not divide K={k} (scheme {scheme.name})")
    if not bool(torch.isfinite(w).all()):
        bad = int((~torch.isfinite(w)).sum())
        raise ValueError(f"weight contains {bad} NaN/Inf values; cannot quantize")


def quantize_weight(w: torch.Tensor, scheme: "QuantScheme | str", *, bias: torch.Tensor | None = None,
                    input_scale: torch.Tensor | float | None = None) -> QuantWeight:
    """Round-to-nearest quantization of ``w`` (``[N, K]`` or ``[E, N, K]``) into the canonical QuantWeight."""
    scheme = QuantScheme.parse(scheme)
    _check_input(w, scheme)
    wd = w.detach().double()
    *lead, n, k = wd.shape
    bn, bk = scheme.group_n(n), scheme.group_k(k)
    et = scheme.weight
    qmax = positive_qmax(et)
    zeros = gscale = None

    if scheme.zero == "none":
        amax = block_reduce(wd, bn, bk, "amax")
        ideal = amax / qmax
        if scheme.scale.global_scale:
            tensor_amax = wd.abs().amax(dim=(-2, -1))
            gs = (tensor_amax / (qmax * scheme.scale.dtype.finite_max())).clamp(min=1e-30).float()
            gscale = gs = invertible_fp32(gs)
            ideal = ideal / gs.double()[..., None, None]
        ideal = torch.where(ideal > 0, ideal, torch.ones_like(ideal))
        scales, sval = round_scale(ideal, scheme.scale.dtype)
        eff = sval * (gscale.double()[..., None, None] if gscale is not None else 1.0)
        q = et.encode(wd / expand_blocks(eff, bn, bk, n, k))
    else:
        lo, hi = block_reduce(wd, bn, bk, "min"), block_reduce(wd, bn, bk, "max")
        if scheme.zero == "int":
            lo, hi = lo.clamp(max=0), hi.clamp(min=0)
        elif et.bits == 1 and bn == 1:
            # two levels: min/max would map a Gaussian group onto its extremes (worse than zero); the L1-optimal
            # binarization puts them at mean -/+ mean absolute deviation
            g = wd.reshape(*lead, n, k // bk, bk)
            mu = g.mean(-1)
            dev = (g - mu[..., None]).abs().mean(-1)
            lo, hi = mu - dev, mu + dev
        ideal = (hi - lo) / qmax
        ideal = torch.where(ideal > 0, ideal, torch.ones_like(ideal))
        scales, sval = round_scale(ideal, scheme.scale.dtype)
        if scheme.zero == "int":
            zeros = torch.round(-lo / sval).clamp(0, qmax).to(torch.uint8)
            zval = zeros.double()
        else:
            zdt = scales.dtype if scales.dtype.is_floating_point else torch.float32
            zeros = (-lo / sval).to(zdt)
            zval = zeros.double()
        q = torch.round(wd / expand_blocks(sval, bn, bk, n, k) + expand_blocks(zval, bn, bk, n, k))
        q = q.clamp(0, qmax).to(torch.int32)

    if input_scale is not None:
        input_scale = torch.as_tensor(input_scale, dtype=torch.float32, device=w.device).reshape(())
    return QuantWeight(pack_codes(q, et.bits), scales, scheme, tuple(w.shape), zeros, gscale, input_scale,
                       None if bias is None else bias.detach())


def dequantize_weight(qw: QuantWeight) -> torch.Tensor:
    """QuantWeight -> float32 tensor of the logical shape (exact in float32 for every built-in format)."""
    w = _dequantize_stored(qw)
    if qw.k_perm is None:
        return w
    # stored column j is logical column k_perm[j] (act-order): undo the permutation (see weight.py)
    # (k_perm is [K] or per expert [E, K]: the N axis is inserted before expanding)
    inv = torch.argsort(qw.k_perm, dim=-1).unsqueeze(-2).expand(*w.shape[:-1], qw.K)
    return torch.gather(w, -1, inv)


def _dequantize_stored(qw: QuantWeight) -> torch.Tensor:
    s = qw.scheme
    n, k = qw.N, qw.K
    bn, bk = s.group_n(n), s.group_k(k)
    codes = unpack_codes(qw.data, s.bits, k)
    scale = expand_blocks(decode_scales(qw.scales, s), bn, bk, n, k)
    if s.zero == "none":
        w = s.weight.decode(codes) * scale
        if qw.global_scale is not None:
            w = w * qw.global_scale.float()[..., None, None]
        return w
    z = expand_blocks(qw.zeros.float(), bn, bk, n, k)
    return (codes.float() - z) * scale
