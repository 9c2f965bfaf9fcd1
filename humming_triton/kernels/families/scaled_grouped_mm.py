"""``scaled_grouped_mm`` / ``scaled_grouped_mm_mx`` (torch backend): MoE experts with per-token e4m3 activations
on torch's fp8 grouped GEMM (``torch._scaled_grouped_mm``, row-wise scales, fast accumulation off -- the fp8
standard of ``scaled_mm``), the grouped counterparts of ``scaled_mm`` / ``scaled_mm_mx``.

W8A8-FP8 experts run on their own e4m3 codes (no copy); W4A8-MXFP4 experts on the exact e4m3 rows of
``scaled_mm_mx`` (one cached byte per weight).  Why: the Triton grouped tile loop applies MXFP4's scale every 32 of
K to fp32 partial sums and measured 0.08-0.26x Humming on the MoE suite (session 20), slower than bf16
grouped_mm.  The GEMM writes bf16 (the only output it has) and takes no bias, so an fp16 / fp32 output and an
expert bias run on the Triton grouped kernel instead: a bias added to the bf16-rounded product would round twice,
and where the bias cancels the product that error is many times the output's own rounding (measured on the H200:
1-6 elements in 10^4 outside the fp8 tolerance).  ``auto`` runs them only where the device's measured table says
they are fastest."""
from __future__ import annotations

import dataclasses

import torch

from ...calls import Call, KernelConfig
from . import register
from .scaled_mm import RowwiseFP8
from .scaled_mm_mx import as_e4m3_rows, mxfp4_weight_reason, warn_once


def expert_e4m3_rows(qw) -> tuple[torch.Tensor, torch.Tensor] | str:
    """MXFP4 experts ``[E, N, K]`` as (e4m3 codes [E, N, K], fp32 row scales [E, N]), exactly
    (``scaled_mm_mx.as_e4m3_rows`` over the experts' rows stacked), or why not; cached on the weight."""
    def make():
        e, n, k = qw.shape
        flat = dataclasses.replace(qw, data=qw.data.reshape(e * n, -1), scales=qw.scales.reshape(e * n, -1),
                                   shape=(e * n, k), bias=None, cache={})
        rows = as_e4m3_rows(flat)
        return rows if isinstance(rows, str) else (rows[0].reshape(e, n, k), rows[1].reshape(e, n))
    return qw.cached_view("torch", "mx_e4m3_expert_rows", make)


class ScaledGroupedMM(RowwiseFP8):
    """e4m3 experts with fp32 per-channel scales; the MXFP4 subclass says how else to get e4m3 rows."""
    name = "scaled_grouped_mm"
    op = "grouped_linear"

    def reason(self, call: Call) -> str | None:
        if call.op != "grouped_linear" or not call.experts:
            return "a grouped (MoE) GEMM family: grouped_linear over 3-D expert weights"
        if not hasattr(torch, "_scaled_grouped_mm"):
            return f"torch {torch.__version__} has no _scaled_grouped_mm"
        if call.facts is not None and call.facts.sm < (9, 0):
            return f"torch._scaled_grouped_mm runs on SM 9.0 and newer; this GPU is SM {call.facts.sm[0]}.{call.facts.sm[1]}"
        if call.dtype != torch.bfloat16:
            return f"{call.dtype} activations: the fp8 grouped GEMM writes bf16 (bf16 activations only)"
        return super().reason(call)

    def weight_reason(self, call: Call) -> str | None:
        s = call.scheme
        if str(s.weight) != "e4m3fn" or str(s.scale.dtype) != "fp32" or s.scale.block_n != 1 or s.scale.block_k \
                or s.scale.global_scale or s.zero != "none":
            return f"{s.name}: _scaled_grouped_mm takes e4m3 experts with fp32 per-channel scales"
        return _shape_reason(call, 16)

    def expert_codes(self, qw) -> tuple[torch.Tensor, torch.Tensor] | str:
        """(e4m3 [E, N, K] K-contiguous, fp32 scales [E, N]) for the GEMM, or why this weight has none."""
        e, n, _ = qw.shape
        return qw.data.view(torch.uint8).view(torch.float8_e4m3fn), qw.scales.reshape(e, n)

    def run(self, x, offsets, qw, bias, out_dtype, cfg, out):
        from ..dense import check_act_group, triton_quantize_activation
        t, (_, n, k) = x.shape[0], qw.shape
        out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
        if out_dtype != torch.bfloat16 or bias is not None:
            from ..grouped import triton_grouped_linear
            return triton_grouped_linear(x, qw, offsets, bias, out_dtype, out=out)
        codes = self.expert_codes(qw)
        if isinstance(codes, str):  # a weight e4m3 cannot hold: the Triton grouped kernel (same result, slower)
            return _grouped_instead(self.name, codes, x, offsets, qw, bias, out_dtype, out)
        w, w_scales = codes
        if t == 0:
            return out if out is not None else torch.empty(0, n, dtype=out_dtype, device=x.device)
        check_act_group(qw.scheme.act, k)
        q = triton_quantize_activation(x if x.is_contiguous() else x.contiguous(), qw.scheme.act, qw.input_scale)
        ends = offsets[1:].to(device=x.device, dtype=torch.int32)
        g = torch._scaled_grouped_mm(q.codes.view(torch.float8_e4m3fn), w.transpose(-2, -1), q.scales.reshape(-1),
                                     w_scales, offs=ends, out_dtype=torch.bfloat16, use_fast_accum=False)
        return out.copy_(g) if out is not None else g


class ScaledGroupedMMMX(ScaledGroupedMM):
    name = "scaled_grouped_mm_mx"

    def weight_reason(self, call: Call) -> str | None:
        return mxfp4_weight_reason(call.scheme, self.name) or _shape_reason(call, 32)

    def expert_codes(self, qw):
        return expert_e4m3_rows(qw)


def _shape_reason(call: Call, k_multiple: int) -> str | None:
    if call.k % k_multiple or call.n % 16:
        return (f"_scaled_grouped_mm needs N a multiple of 16 and K of {k_multiple} here "
                f"(got N={call.n}, K={call.k})")
    return None


def _grouped_instead(family: str, why: str, x, offsets, qw, bias, out_dtype, out):
    """Experts whose rows e4m3 cannot hold exactly run on the Triton grouped kernel, with a warning the first time
    per weight."""
    from ..grouped import triton_grouped_linear
    warn_once(qw, f"{family}: {why}; these experts run on the Triton grouped kernel instead")
    return triton_grouped_linear(x, qw, offsets, bias, out_dtype, out=out)


register(ScaledGroupedMM())
register(ScaledGroupedMMMX())
