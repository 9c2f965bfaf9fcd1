"""``mma_decode_grouped_act``: MoE experts of the quantized-activation schemes (W4A8-MXFP4, W8A8 / W4A8 with
dynamic per-token e4m3 or int8 activations) at decode-sized batches, on the native grouped decode GEMM of
``mma_decode_grouped`` -- the grouped twin of ``mma_decode_act``.

One Triton launch quantizes the routed rows to their codes, stored as 16-bit values (exact); the grouped kernel
multiplies them by each expert's weight codes on fp16 / bf16 tensor cores with fp32 sums and multiplies each
output row by its token's scale before the bias.  The products are an fp8 / int8 MMA's, the sums have no
fast-accumulation truncation.  Why: W4A8-MXFP4 experts ran 0.15-0.26x Humming at 1-64 tokens on the Triton
grouped kernel (session 20), while the weight-only grouped decode streams the same MXFP4 experts at 0.86-0.98x.
Per-token scales only (the grouped kernel has no per-group activation scales).  Backend ``cuda``; ``auto`` runs it
only where the device's measured table says it is fastest."""
from __future__ import annotations

import torch

from cutlass_ext import decode_mma as dm

from ...calls import Call, KernelConfig
from . import register
from ..dense import quantize_activation_values
from .mma_decode_act import act_reason, code_dtype
from .mma_decode_grouped import MAX_ROWS_PER_EXPERT, MMADecodeGrouped, packed_experts


class MMADecodeGroupedAct(MMADecodeGrouped):
    name = "mma_decode_grouped_act"

    def reason(self, call: Call) -> str | None:
        if call.op != "grouped_linear" or not call.experts:
            return "the native grouped decode kernel runs MoE experts (grouped_linear)"
        if call.act_order:
            return "act-order (k_perm) experts"
        why = act_reason(call.scheme, call.k)
        if why:
            return f"{call.scheme.name}: {why}"
        if call.scheme.act.group_k and call.scheme.act.group_k != call.k:
            return f"{call.scheme.name}: activation scales per group of K (the grouped kernel takes per-token ones)"
        if call.m > MAX_ROWS_PER_EXPERT * call.experts:
            return f"{call.m} routed rows over {call.experts} experts (decode batches only)"
        if call.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return f"{call.dtype} activations (fp16 / bf16 / fp32 only)"
        return dm.weight_reason(call.scheme, call.n, call.k, code_dtype(call.scheme), act_codes=True)

    def mma(self, call: Call) -> str:
        if str(call.scheme.weight) == "e4m3fn":
            return "fp8"
        return "bf16" if code_dtype(call.scheme) == torch.bfloat16 else "fp16"

    def run(self, x, offsets, qw, bias, out_dtype, cfg: KernelConfig, out):
        t, n = x.shape[0], qw.N
        out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
        y = out if out is not None else torch.empty(t, n, dtype=out_dtype, device=x.device)
        if t == 0:
            return y
        codes, scales = quantize_activation_values(x if x.is_contiguous() else x.contiguous(), qw.scheme.act,
                                                   code_dtype(qw.scheme))
        bias = qw.bias if bias is None else bias
        target = y if y.dtype in (torch.float16, torch.bfloat16, torch.float32) and y.stride(-1) == 1 else \
            torch.empty(t, n, dtype=torch.float32, device=x.device)
        dm.run_grouped(codes, packed_experts(qw), offsets, bias, target, kw=cfg.split_k, tw=cfg.block_n // 16,
                       unroll=cfg.num_stages, rows_per_pass=cfg.block_m, row_scales=scales.view(-1))
        if target is not y:
            y.copy_(target)
        return y


register(MMADecodeGroupedAct())
