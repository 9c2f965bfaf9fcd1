"""``scaled_mm_mx`` (torch backend): W4A8-MXFP4 on cuBLASLt's fp8 GEMM, by an exact change of weight format.

An MXFP4 row whose block exponents span at most 14 binades is, exactly, an e4m3 row with one power-of-two scale:
each e2m1 value times 2^(e_block - e_row + 6) lies on e4m3's grid (the largest, 6 * 2^6 = 384, is below e4m3's
448; the smallest, 0.5 * 2^-8, is e4m3's smallest subnormal 2^-9; every e2m1 value has at most two significant
bits).  Repacked once (8 bits per weight, cached
on the weight), the call is our e4m3 activation quantizer and ``torch._scaled_mm`` row-wise with fast accumulation
off (the fp8 standard): the products are the reference's, exactly.  Why: the tile loop applies MXFP4's scale every
32 of K to fp32 partial sums and runs at 0.3-0.4x Humming at M >= 256; cuBLASLt's fp8 GEMM runs the e4m3 weight at
fp8 tensor-core speed.  A weight with a wider row runs through ``dequant_mm`` (same result, slower), with a warning
the first time.  ``auto`` runs it only where the device's measured table says it is fastest."""
from __future__ import annotations

import warnings

import torch

from ...calls import Call, KernelConfig
from . import register
from .scaled_mm import RowwiseFP8, rowwise_fp8

MAX_SPAN = 14  # binades between a row's largest and smallest live block exponent that e4m3 still holds exactly
HEADROOM = 6  # the row scale sits this many binades below the row's largest block: e2m1's 6 * 2^6 = 384 <= 448
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_NAN_E8M0 = 255
_ROWS = 1024  # rows converted at a time: bounds the fp32 temporaries to 4 B x 1024 x K


def as_e4m3_rows(qw) -> tuple[torch.Tensor, torch.Tensor] | str:
    """An MXFP4 weight as (e4m3 codes [N, K] as float8_e4m3fn, fp32 scales [N]): exactly the same values, or why
    it cannot be.  A block of zero magnitudes does not count in a row's span; a NaN block scale makes its row's
    scale NaN (the reference's output column is NaN then too)."""
    from ...formats.packing import unpack_codes
    n, k = qw.N, qw.K
    e = qw.scales.to(torch.int32)                               # [N, K / 32] e8m0 codes
    codes = unpack_codes(qw.data, 4, k)                          # [N, K] e2m1 codes
    live = (codes & 7).reshape(n, -1, 32).ne(0).any(-1) & e.ne(_NAN_E8M0)
    e_row = torch.where(live, e, torch.full_like(e, -1)).amax(-1)
    span = torch.where(live, e_row[:, None] - e, torch.zeros_like(e)).amax(-1)
    if bool((span > MAX_SPAN).any()):
        worst = int(span.argmax())
        return (f"row {worst}'s block scales span {int(span[worst])} binades (e4m3 holds MXFP4 exactly within "
                f"{MAX_SPAN})")
    e_row = torch.where(e_row < 0, torch.full_like(e_row, 127), e_row) - HEADROOM  # no live block: any scale
    scales = torch.ldexp(torch.ones(n, device=qw.device, dtype=torch.float64), e_row - 127).float()
    scales = torch.where(e.eq(_NAN_E8M0).any(-1), torch.full_like(scales, float("nan")), scales)
    table = torch.tensor(_E2M1, device=qw.device)
    out = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=qw.device)
    for r0 in range(0, n, _ROWS):
        r1 = min(n, r0 + _ROWS)
        # dead blocks (zero magnitudes, NaN scales) keep their codes' own values: their exponent may be anything
        shift = torch.where(live[r0:r1], e[r0:r1] - e_row[r0:r1, None], torch.zeros_like(e[r0:r1]))
        vals = table[codes[r0:r1]].reshape(r1 - r0, -1, 32) * torch.exp2(shift.float())[..., None]
        out[r0:r1] = vals.reshape(r1 - r0, k).to(torch.float8_e4m3fn)  # exact: every value is on e4m3's grid
    return out, scales


def mxfp4_weight_reason(scheme, family: str) -> str | None:
    """None for an MXFP4 weight (e2m1 codes, an e8m0 scale per row and 32 of K, no global scale), else why
    ``family`` (which runs it as e4m3 rows) cannot take it."""
    sc = scheme.scale
    if str(scheme.weight) != "e2m1" or str(sc.dtype) != "e8m0" or sc.block_k != 32 or (sc.block_n or 0) != 1 \
            or sc.global_scale or scheme.zero != "none":
        return f"{scheme.name}: {family} converts MXFP4 weights (e2m1, e8m0 per 32)"
    return None


def dequant_instead(family: str, why: str, x, x2, qw, bias, out_dtype, out):
    """A weight whose rows e4m3 cannot hold exactly: dequant_mm runs it (same result), with a warning the first
    time per weight."""
    from . import get
    warn_once(qw, f"{family}: {why}; this weight runs through dequant_mm instead")
    return get("dequant_mm").run(x, x2, qw, bias, out_dtype, KernelConfig("dequant_mm", 1, 32, 128), out)


def warn_once(qw, message: str) -> None:
    """Warn the first time per weight that it has no e4m3 view and runs elsewhere (the caller names where)."""
    state = qw.cache.setdefault("torch", {})
    if not state.get("mx_e4m3_warned"):
        state["mx_e4m3_warned"] = True
        warnings.warn(message, stacklevel=4)


def e4m3_view(qw):
    """``as_e4m3_rows(qw)``, made once and cached on the weight (made again after an edit of its tensors)."""
    return qw.cached_view("torch", "mx_e4m3_rows", lambda: as_e4m3_rows(qw))


class ScaledMMMX(RowwiseFP8):
    name = "scaled_mm_mx"

    def weight_reason(self, call: Call) -> str | None:
        why = mxfp4_weight_reason(call.scheme, self.name)
        if why:
            return why
        if call.k % 32 or call.n % 16:
            return f"_scaled_mm needs N a multiple of 16 and K of 32 here (got N={call.n}, K={call.k})"
        return None

    def run(self, x, x2, qw, bias, out_dtype, cfg, out):
        view = e4m3_view(qw)
        if isinstance(view, str):
            return dequant_instead(self.name, view, x, x2, qw, bias, out_dtype, out)
        w, scales = view
        return rowwise_fp8(x2, qw, w, scales.reshape(1, -1), bias, out_dtype, out)


register(ScaledMMMX())


class ScaledMMW4A4(ScaledMMMX):
    """``scaled_mm_w4a4``: W4A4-MXFP4 on cuBLASLt's fp8 GEMM -- the weight as ``scaled_mm_mx`` converts it, the
    MXFP4 activations quantized as the reference quantizes them and written as e4m3 rows with a power-of-two
    scale each (``dense.triton_quantize_mx_rows``, one launch): the products are the reference's exactly for
    activation blocks within 14 binades of their row's largest, and within 2**-16 of that block's scale beyond.
    Why: the W4A4 tile loop decodes activations to bf16 and ran 2-4x slower than cuBLAS bf16 (H100, session 26);
    the e4m3 rows run at fp8 tensor-core speed.  Untimed: opt-in until a device's measured table names it."""
    name = "scaled_mm_w4a4"

    def act_reason(self, call: Call) -> str | None:
        from ..dense import mx_rows_reason
        return mx_rows_reason(call.scheme.act)

    def run(self, x, x2, qw, bias, out_dtype, cfg, out):
        from ..dense import triton_quantize_mx_rows
        view = e4m3_view(qw)
        if isinstance(view, str):
            return dequant_instead(self.name, view, x, x2, qw, bias, out_dtype, out)
        w, scales = view
        return rowwise_fp8(x2, qw, w, scales.reshape(1, -1), bias, out_dtype, out,
                           act=triton_quantize_mx_rows(x2, qw.scheme.act))


register(ScaledMMW4A4())
