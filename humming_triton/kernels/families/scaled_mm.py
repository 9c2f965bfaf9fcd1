"""``scaled_mm`` (torch backend): our fused e4m3 activation quantizer, then cuBLASLt's fp8 GEMM
(``torch._scaled_mm``, row-wise scales, fast accumulation off -- the project's fp8 accuracy standard) on the
weight's own e4m3 codes: the canonical layout packs 4 codes per int32 word in K order, so the words viewed as
bytes *are* the [N, K] e4m3 matrix (no copy)."""
from __future__ import annotations

import torch

from ...calls import Call, KernelConfig
from . import Family, register


class RowwiseFP8(Family):
    """What the families on ``torch._scaled_mm`` row-wise share: CUDA, dynamic per-token e4m3 activations, no
    act-order, one config; a subclass says which weights it takes (``weight_reason``)."""
    backend = "torch"

    def weight_reason(self, call: Call) -> str | None:
        raise NotImplementedError

    def act_reason(self, call: Call) -> str | None:
        """Why the call's activations cannot feed the GEMM (this default: dynamic per-token e4m3 only)."""
        a = call.scheme.act
        if a is None or str(a.dtype) != "e4m3fn" or not a.per_token or a.group_k or a.static or a.global_scale:
            return f"{call.scheme.name}: _scaled_mm takes dynamic per-token e4m3 activations"
        return None

    def reason(self, call: Call) -> str | None:
        if call.device_type != "cuda":
            return "torch._scaled_mm needs a CUDA GPU"
        why = self.act_reason(call) or self.weight_reason(call)
        if why:
            return why
        if call.act_order:
            return "act-order weights"
        return None

    def mma(self, call: Call) -> str:
        return "fp8"

    def candidates(self, call: Call) -> list[KernelConfig]:
        return [KernelConfig(self.name)]


class ScaledMM(RowwiseFP8):
    name = "scaled_mm"

    def weight_reason(self, call: Call) -> str | None:
        s = call.scheme
        if str(s.weight) != "e4m3fn" or str(s.scale.dtype) != "fp32" or s.scale.block_n != 1 or s.scale.block_k \
                or s.scale.global_scale or s.zero != "none":
            return f"{s.name}: _scaled_mm takes e4m3 weights with fp32 per-channel scales"
        if call.k % 16 or call.n % 16:
            return f"_scaled_mm needs N and K multiples of 16 (got N={call.n}, K={call.k})"
        return None

    def run(self, x, x2, qw, bias, out_dtype, cfg, out):
        w = qw.data.view(torch.uint8).view(torch.float8_e4m3fn)  # [N, K] e4m3 codes, K-contiguous
        return rowwise_fp8(x2, qw, w, qw.scales.reshape(1, -1), bias, out_dtype, out)


def rowwise_fp8(x2, qw, w, w_scales, bias, out_dtype, out, act=None):
    """Our e4m3 activation quantizer, then ``torch._scaled_mm`` on ``w`` (e4m3 [N, K], K-contiguous) with fp32
    ``w_scales`` [1, N]: fast accumulation off (the fp8 standard).  ``act``: the activations already as (e4m3
    codes [M, K] uint8, fp32 row scales [M, 1]) instead.

    Row-wise scaling writes bf16 with a bf16 bias only, so it runs when the call wants exactly that.  Any other
    output or bias type takes cuBLASLt's fp32 sums (unit scales) and applies the scales and the bias in fp32:
    nothing rounds through bf16 on the way (an fp32 bias or an fp16 / fp32 output would lose bits there)."""
    from ..dense import check_act_group, triton_quantize_activation
    if act is None:
        check_act_group(qw.scheme.act, qw.K)
        q = triton_quantize_activation(x2, qw.scheme.act, qw.input_scale)
        act = (q.codes, q.scales)
    a, a_scales = act[0].view(torch.float8_e4m3fn), act[1]
    if out_dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16):
        y = torch._scaled_mm(a, w.t(), scale_a=a_scales, scale_b=w_scales, bias=bias, out_dtype=torch.bfloat16,
                             use_fast_accum=False)
    else:
        one = torch.ones((), dtype=torch.float32, device=a.device)
        y = torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=False)
        y = y.mul_(a_scales).mul_(w_scales)
        if bias is not None:
            y = y.add_(bias.float())
    return out.copy_(y) if out is not None else y.to(out_dtype)


register(ScaledMM())
