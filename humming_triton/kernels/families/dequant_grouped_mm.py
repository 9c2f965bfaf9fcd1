"""``dequant_grouped_mm`` (torch backend): dequantize every expert to bf16 with our Triton kernel (one launch:
the experts' rows stacked as one [E*N, K] weight), then ``torch._grouped_mm`` over the rows sorted by expert.
Costs one write + read of the whole bf16 expert tensor per call: a candidate for prefill-sized batches."""
from __future__ import annotations

import dataclasses

import torch

from ...calls import Call, KernelConfig
from . import Family, register


class DequantGroupedMM(Family):
    name = "dequant_grouped_mm"
    op = "grouped_linear"
    backend = "torch"

    def reason(self, call: Call) -> str | None:
        s = call.scheme
        if call.device_type != "cuda" or not hasattr(torch, "_grouped_mm"):
            return "torch._grouped_mm needs a CUDA GPU (and torch >= 2.8)"
        if call.facts is not None and call.facts.sm < (9, 0):
            return f"torch._grouped_mm runs on SM 9.0 and newer; this GPU is SM {call.facts.sm[0]}.{call.facts.sm[1]}"
        if call.dtype != torch.bfloat16:
            return f"torch._grouped_mm takes bf16 activations, got {call.dtype}"
        if s.act is not None or call.act_order:
            return f"{s.name}: 16-bit activations without act-order only"
        if s.scale.block_n != 1 or s.scale.global_scale:
            return f"{s.name}: per-expert scales must stack along N (channel or group scales, no global scale)"
        if call.k % 8 or call.n % 8:
            return f"torch._grouped_mm needs N and K multiples of 8 (N={call.n}, K={call.k})"
        from .. import supports
        return supports("quant_linear", s, call.dtype)

    def candidates(self, call: Call) -> list[KernelConfig]:
        return [KernelConfig("dequant_grouped_mm", 1, 32, 128)]

    def run(self, x, offsets, qw, bias, out_dtype, cfg, out):
        from ..dense import triton_dequantize
        e, n, k = qw.shape
        flat = dataclasses.replace(
            qw, data=qw.data.reshape(e * n, -1), scales=qw.scales.reshape(e * n, -1),
            zeros=None if qw.zeros is None else qw.zeros.reshape(e * n, -1), shape=(e * n, k), bias=None,
            cache={})
        w = triton_dequantize(flat, torch.bfloat16, cfg.block_n, cfg.block_k).reshape(e, n, k)
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offsets[1:].to(torch.int32))
        if bias is not None:  # [E, N]: each row gets its expert's bias
            rows = torch.repeat_interleave(torch.arange(e, device=x.device), offsets[1:] - offsets[:-1],
                                           output_size=x.shape[0])
            y = y + bias[rows].to(y.dtype)
        return out.copy_(y) if out is not None else y.to(out_dtype or x.dtype)


register(DequantGroupedMM())
