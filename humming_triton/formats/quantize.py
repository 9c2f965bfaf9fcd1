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

Reliability (issue 15): the scheme is checked against the shape before anything is computed
(``QuantScheme.shape_error``, the rule the backends apply to every call); a block whose ideal scale is beyond the
scale type's largest value (fp16: ``|w| > 65504 * qmax``) is clipped with one :class:`QuantizationWarning` per
tensor naming the clipped magnitude, and so is a per-tensor global scale (NVFP4) that leaves most blocks with a
subnormal e4m3 scale (``_warn_global`` states the criterion).  Memory: the work runs a chunk of rows at a time
(``_CHUNK_ELEMS``), the block statistics in the input's dtype (max / min are exact), the float64 quotients and the
nearest-code search per chunk, the codes packed straight into the output: a few bytes per element above the input
(was 32-85 B), the same codes bit for bit.
"""
from __future__ import annotations

import math
import warnings

import torch

from .dtypes import IntType, WideFloat
from .packing import pack_codes, packed_words, unpack_codes
from .scheme import QuantScheme
from .weight import QuantWeight, decode_scales

__all__ = ["quantize_weight", "dequantize_weight", "expand_blocks", "block_reduce", "QuantizationWarning"]


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
    why = scheme.shape_error(w.shape[-2], w.shape[-1])
    if why:
        raise ValueError(f"{why} (scheme {scheme.name})")
    flat = w.detach().reshape(-1, w.shape[-1])
    rows = _chunk_rows(w.shape[-1]) * 4  # isfinite makes |w| and two masks: chunked, its memory stays bounded
    bad = int(sum((~torch.isfinite(flat[r0:r0 + rows])).sum() for r0 in range(0, flat.shape[0], rows)))
    if bad:
        raise ValueError(f"weight contains {bad} NaN/Inf values; cannot quantize")


class QuantizationWarning(UserWarning):
    """A weight quantized with a loss beyond the format's rounding: clipped by the scale type's range, or most
    blocks degraded by a per-tensor global scale."""


# float64 / int64 work of quantize_weight is done this many elements at a time (rows of the weight): the peak
# memory above the input stays the packed output and the per-block scales plus a bounded ~100 B x _CHUNK_ELEMS
# (~26 MB) of temporaries, whatever the weight's size
_CHUNK_ELEMS = 1 << 18
# a scale block is "clipped" when its ideal scale exceeds the scale type's largest value by more than this
# fraction (smaller excesses are the float rounding of the scale itself, e.g. NVFP4's global scale)
CLIP_TOLERANCE = 1e-3
# NVFP4-style global scales: warn when more than this fraction of the (non-zero) blocks get a subnormal block scale
GLOBAL_DEGRADED_FRACTION = 0.5


def _chunk_rows(k: int) -> int:
    return max(1, _CHUNK_ELEMS // max(k, 1))


def _block_stat(w2: torch.Tensor, bn: int, bk: int, op: str) -> torch.Tensor:
    """``block_reduce(w2.double(), bn, bk, op)`` for ``w2 [n, k]`` (any float dtype), bit for bit, with bounded
    memory: amax / min / max are exact in the input's own dtype and in any order, so they run a chunk of rows at a
    time without a float64 copy (on a view, when the blocks tile the chunk exactly)."""
    n, k = w2.shape
    rows = _chunk_rows(k)
    if bn <= rows:
        step = rows // bn * bn
        parts = [_reduce_rows(w2[r0:r0 + step], bn, bk, op) for r0 in range(0, n, step)]
        return torch.cat(parts, dim=0).double()
    combine = torch.minimum if op == "min" else torch.maximum
    parts = []
    for b0 in range(0, n, bn):  # row blocks taller than a chunk: reduce sub-chunks, then combine them
        b1 = min(b0 + bn, n)
        acc = None
        for s0 in range(b0, b1, rows):
            s1 = min(s0 + rows, b1)
            part = _reduce_rows(w2[s0:s1], s1 - s0, bk, op)
            acc = part if acc is None else combine(acc, part)
        parts.append(acc)
    return torch.cat(parts, dim=0).double()


def _reduce_rows(c: torch.Tensor, bn: int, bk: int, op: str) -> torch.Tensor:
    r, k = c.shape
    if r % bn or k % bk or not c.is_contiguous():
        return block_reduce(c, bn, bk, op)
    v = c.reshape(r // bn, bn, k // bk, bk)  # a view: no temporary
    if op == "min":
        return v.amin(dim=(-3, -1))
    if op == "max":
        return v.amax(dim=(-3, -1))
    return torch.maximum(v.amax(dim=(-3, -1)).abs(), v.amin(dim=(-3, -1)).abs())  # = |v|.amax(), +0 for zeros


def _round_scale_rows(ideal: torch.Tensor, d) -> tuple[torch.Tensor, torch.Tensor]:
    """``round_scale`` (elementwise) a chunk at a time: e4m3 block scales of g16 make one block per 16 weights, and
    the nearest-value search over them would otherwise cost ~6 B per weight element."""
    flat = ideal.reshape(-1, ideal.shape[-1])
    rows = _chunk_rows(flat.shape[-1])
    if flat.shape[0] <= rows:
        return round_scale(ideal, d)
    parts = [round_scale(flat[r0:r0 + rows], d) for r0 in range(0, flat.shape[0], rows)]
    return (torch.cat([p[0] for p in parts]).reshape(ideal.shape), torch.cat([p[1] for p in parts]).reshape(ideal.shape))


def _rows_of(t: torch.Tensor, bn: int, bk: int, r0: int, r1: int, k: int) -> torch.Tensor:
    """Rows ``r0:r1`` of ``expand_blocks(t, bn, bk, n, k)`` for per-block values ``t [nb, kb]``."""
    idx = torch.arange(r0, r1, device=t.device) // bn
    return t.index_select(0, idx).repeat_interleave(bk, dim=-1)[:, :k]


def _scale_limit(d) -> float:
    """The largest finite value a scale of type ``d`` holds."""
    if isinstance(d, WideFloat):
        return float(torch.finfo(d.torch_dtype).max)
    return d.finite_max()


def _warn_clipping(what: str, scheme: QuantScheme, ideal: torch.Tensor, mag: torch.Tensor, limit: float,
                   reach: torch.Tensor) -> None:
    """One warning per tensor naming the largest clipped magnitude, when a block's ideal scale is beyond what the
    scale type holds.  ``mag``: the block's largest |w|; ``reach``: the largest |w| a block can represent."""
    over = ideal > limit * (1 + CLIP_TOLERANCE)
    if not bool(over.any()):
        return
    worst = float(mag[over].max())
    can = float(reach.expand_as(mag)[over].min())
    warnings.warn(f"quantize_weight: {what}: {int(over.sum())} of {over.numel()} scale blocks hold values a "
                  f"{scheme.scale.dtype} scale cannot reach with {scheme.weight} codes (scheme {scheme.name}): |w| up "
                  f"to {worst:.4g} is clipped to {can:.4g}", QuantizationWarning, stacklevel=3)


def _warn_global(what: str, scheme: QuantScheme, amax: torch.Tensor, ideal: torch.Tensor,
                 tensor_amax: torch.Tensor, experts: bool) -> None:
    """The documented criterion for a per-tensor global scale that ruins the tensor: more than
    GLOBAL_DEGRADED_FRACTION of the non-zero blocks (of a tensor, or of one expert) get an ideal block scale below the
    block scale type's smallest normal value (e4m3: 2**-6) -- a subnormal scale keeps fewer significant bits, and
    below the smallest subnormal (2**-9) it is clamped up, so the whole block is quantized on too coarse a grid.
    With e4m3 block scales that happens when a block's amax is below ~1/28672 of the tensor's amax: one outlier
    sets the global scale for everyone (the NVFP4 format's nature)."""
    d = scheme.scale.dtype
    if isinstance(d, WideFloat) or d.man == 0:
        return
    normal_min = 2.0 ** (1 - d.exp_bias)
    live = amax > 0
    sub = (ideal < normal_min) & live
    frac = sub.flatten(-2).sum(-1).double() / live.flatten(-2).sum(-1).clamp(min=1).double()
    if not bool((frac > GLOBAL_DEGRADED_FRACTION).any()):
        return
    i = int(frac.reshape(-1).argmax())
    block = float(amax.reshape(frac.numel(), -1)[i][live.reshape(frac.numel(), -1)[i]].median())
    top = float(tensor_amax.reshape(-1)[i])
    where = f" (expert {i})" if experts else ""
    warnings.warn(f"quantize_weight: {what}{where}: the per-tensor global scale of scheme {scheme.name} is set by "
                  f"|w| = {top:.4g}, {top / block:.3g}x the median block amax {block:.4g}: "
                  f"{float(frac.reshape(-1)[i]):.0%} of the blocks get a subnormal {d} block scale and lose precision "
                  "(a per-tensor global scale is this format's nature: clip the outlier, or use a format without one, "
                  "e.g. mxfp4)", QuantizationWarning, stacklevel=3)


def quantize_weight(w: torch.Tensor, scheme: "QuantScheme | str", *, bias: torch.Tensor | None = None,
                    input_scale: torch.Tensor | float | None = None, name: str | None = None) -> QuantWeight:
    """Round-to-nearest quantization of ``w`` (``[N, K]`` or ``[E, N, K]``) into the canonical QuantWeight.

    The scheme is checked against the shape first (``QuantScheme.shape_error``: the rule every backend applies
    later).  Values a scale type cannot reach are clipped with one :class:`QuantizationWarning` per tensor naming
    ``name`` and the clipped magnitude; so is a per-tensor global scale that degrades most blocks.  Memory: the
    float64 work runs a chunk of rows at a time (the codes are those of the whole-tensor computation, bit for bit),
    so the peak above the input is the output plus a bounded amount."""
    scheme = QuantScheme.parse(scheme)
    _check_input(w, scheme)
    *lead, n, k = w.shape
    what = f"{name or 'weight'} {list(w.shape)}"
    w3 = w.detach().reshape(-1, n, k)
    ne = w3.shape[0]
    bn, bk = scheme.group_n(n), scheme.group_k(k)
    et = scheme.weight
    qmax = positive_qmax(et)
    zeros = gscale = None
    limit = _scale_limit(scheme.scale.dtype)

    # pass 1: per-block statistics -> scales (small tensors), a chunk of rows at a time
    if scheme.zero == "none":
        amax = torch.stack([_block_stat(w3[e], bn, bk, "amax") for e in range(ne)])
        ideal = amax / qmax
        if scheme.scale.global_scale:
            tensor_amax = amax.amax(dim=(-2, -1))  # = |w|.amax() per tensor: max is exact in any order
            gs = (tensor_amax / (qmax * scheme.scale.dtype.finite_max())).clamp(min=1e-30).float()
            gscale = gs = invertible_fp32(gs)
            ideal = ideal / gs.double()[..., None, None]
            _warn_global(what, scheme, amax, ideal, tensor_amax, bool(lead))
        reach = limit * qmax * (gscale.double()[..., None, None] if gscale is not None else 1.0)
        _warn_clipping(what, scheme, ideal, amax, limit, torch.as_tensor(reach, dtype=torch.float64))
        ideal = torch.where(ideal > 0, ideal, torch.ones_like(ideal))
        del amax
        scales, sval = _round_scale_rows(ideal, scheme.scale.dtype)
        del ideal
        eff = sval * (gscale.double()[..., None, None] if gscale is not None else 1.0)
        del sval
    else:
        if scheme.zero == "float" and et.bits == 1 and bn == 1:
            # two levels: min/max would map a Gaussian group onto its extremes (worse than zero); the L1-optimal
            # binarization puts them at mean -/+ mean absolute deviation
            lo = torch.empty(ne, n, k // bk, dtype=torch.float64, device=w.device)
            hi = torch.empty_like(lo)
            rows = _chunk_rows(k)
            for e in range(ne):
                for r0 in range(0, n, rows):
                    g = w3[e, r0:r0 + rows].double().reshape(-1, k // bk, bk)
                    mu = g.mean(-1)
                    dev = (g - mu[..., None]).abs().mean(-1)
                    lo[e, r0:r0 + rows], hi[e, r0:r0 + rows] = mu - dev, mu + dev
        else:
            lo = torch.stack([_block_stat(w3[e], bn, bk, "min") for e in range(ne)])
            hi = torch.stack([_block_stat(w3[e], bn, bk, "max") for e in range(ne)])
            if scheme.zero == "int":
                lo, hi = lo.clamp(max=0), hi.clamp(min=0)
        ideal = (hi - lo) / qmax
        _warn_clipping(what, scheme, ideal, torch.maximum(lo.abs(), hi.abs()), limit,
                       torch.tensor(limit * qmax, dtype=torch.float64))
        ideal = torch.where(ideal > 0, ideal, torch.ones_like(ideal))
        scales, sval = _round_scale_rows(ideal, scheme.scale.dtype)
        del ideal
        if scheme.zero == "int":
            zeros = torch.round(-lo / sval).clamp(0, qmax).to(torch.uint8)
            zval = zeros.double()
        else:
            zdt = scales.dtype if scales.dtype.is_floating_point else torch.float32
            zeros = (-lo / sval).to(zdt)
            zval = zeros.double()

    # pass 2: codes, a chunk of rows at a time, packed straight into the output
    data = torch.empty(ne, n, packed_words(k, et.bits), dtype=torch.int32, device=w.device)
    rows = _chunk_rows(k)
    for e in range(ne):
        for r0 in range(0, n, rows):
            r1 = min(r0 + rows, n)
            c = w3[e, r0:r1].double()
            if scheme.zero == "none":
                q = et.encode(c / _rows_of(eff[e], bn, bk, r0, r1, k))
            else:
                q = torch.round(c / _rows_of(sval[e], bn, bk, r0, r1, k) + _rows_of(zval[e], bn, bk, r0, r1, k))
                q = q.clamp(0, qmax).to(torch.int32)
            del c
            data[e, r0:r1] = pack_codes(q, et.bits)
            del q

    shape_lead = tuple(lead)
    data = data.reshape(*shape_lead, n, -1)
    scales = scales.reshape(*shape_lead, *scales.shape[-2:])
    if zeros is not None:
        zeros = zeros.reshape(*shape_lead, *zeros.shape[-2:])
    if gscale is not None:
        gscale = gscale.reshape(shape_lead)
    if input_scale is not None:
        input_scale = torch.as_tensor(input_scale, dtype=torch.float32, device=w.device).reshape(())
    return QuantWeight(data, scales, scheme, tuple(w.shape), zeros, gscale, input_scale,
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
