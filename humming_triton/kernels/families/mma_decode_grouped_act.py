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

from ...calls import Call
from . import register
from ..dense import quantize_activation_values
from .mma_decode_act import MMADecodeAct, act_reason, code_dtype
from .mma_decode_grouped import MMADecodeGrouped, PassGrid, expert_call_reason


class MMADecodeGroupedAct(MMADecodeGrouped):
    name = "mma_decode_grouped_act"
    mma = MMADecodeAct.mma

    def reason(self, call: Call) -> str | None:
        why = expert_call_reason(call)
        if why:
            return why
        why = act_reason(call.scheme, call.k)
        if why:
            return f"{call.scheme.name}: {why}"
        if call.scheme.act.group_k and call.scheme.act.group_k != call.k:
            return f"{call.scheme.name}: activation scales per group of K (the grouped kernel takes per-token ones)"
        if call.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return f"{call.dtype} activations (fp16 / bf16 / fp32 only)"
        return dm.weight_reason(call.scheme, call.n, call.k, code_dtype(call.scheme), act_codes=True)

    def operands(self, x, qw) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The routed rows as their code values (exact in 16 bits) and each token's activation scale."""
        codes, scales = quantize_activation_values(x if x.is_contiguous() else x.contiguous(), qw.scheme.act,
                                                   code_dtype(qw.scheme))
        return codes, scales.view(-1)


register(MMADecodeGroupedAct())


class MMADecodeGroupedActPasses(PassGrid, MMADecodeGroupedAct):
    name = "mma_decode_grouped_act_passes"


register(MMADecodeGroupedActPasses())
