"""``cutlass_grouped_fp8``: MoE experts with dynamic per-token e4m3 activations on the sm_90a CUTLASS grouped fp8
GEMM (``cutlass_ext/csrc_sm90_grouped_fp8``): W8A8-FP8 experts on their own codes and per-channel scales, W4A8-MXFP4
experts on their exact e4m3 rows (``scaled_grouped_mm.expert_e4m3_rows``: one cached byte per weight, a
power-of-two scale per row).  Our activation quantizer, then one launch: e4m3 x e4m3 wgmma with fp32 accumulation
promoted every 128 of K (the FP8 standard: ``torch._scaled_mm`` with fast accumulation off), each output the
accumulator times its weight row's and its token's scales, rounded once to bf16 -- the arithmetic of
``scaled_grouped_mm`` (torch's fp8 grouped GEMM) in a kernel of ours.

Why: W4A8-MXFP4 experts ran at 0.33-0.6x Humming from 256 tokens on bf16 MMAs of the exact codes
(``cutlass_grouped_mx_a8``) or torch's fp8 grouped GEMM (session 27); fp8 wgmma has twice the bf16 rate.  On the
H200 (session 28) W4A8-MXFP4 Qwen3 gate_up at 4096 tokens ran in 406 µs (GEMM 273 + the activation quantizer 127)
against 580 on the earlier best path.  bf16 activations and output, no expert bias (a bias runs the Triton grouped
kernel).  ``auto`` runs it where the device's measured table names it: its side-by-side ``torch._scaled_mm``
accuracy test passed on sm_90 (H100, session 29), and the H200 table names it for seven large W4A8-MXFP4 MoE keys
(timed there in session 28, 1.03-2.4x the previous entries).

KernelConfig: ``block_m`` the token tile, ``block_n`` the weight rows per tile (128: cooperative, 64: pingpong),
``block_k`` 128."""
from __future__ import annotations

import torch

from cutlass_ext import grouped_fp8 as gf

from ...calls import Call, KernelConfig
from . import Family, register
from .cutlass_grouped import variant_in


def variant_of(cfg: KernelConfig) -> int:
    return variant_in(cfg, gf.VARIANTS, "CUTLASS grouped fp8")


def _e4m3_experts(scheme) -> bool:
    """W8A8-FP8-style experts: e4m3 codes with one fp32 scale per row."""
    s = scheme.scale
    return str(scheme.weight) == "e4m3fn" and str(s.dtype) == "fp32" and s.block_n == 1 and not s.block_k \
        and not s.global_scale and scheme.zero == "none"


class CutlassGroupedFP8(Family):
    name = "cutlass_grouped_fp8"
    op = "grouped_linear"
    backend = "cutlass"

    def reason(self, call: Call) -> str | None:
        if call.op != "grouped_linear" or not call.experts:
            return "the CUTLASS grouped fp8 GEMM runs MoE experts (grouped_linear)"
        if call.act_order:
            return "act-order (k_perm) experts"
        if call.facts is not None and tuple(getattr(call.facts, "sm", (9, 0))) != (9, 0):
            return f"sm_90a kernels run on SM 9.0 only (this GPU is SM {'.'.join(map(str, call.facts.sm))})"
        a = call.scheme.act
        if a is None or str(a.dtype) != "e4m3fn" or not a.per_token or a.group_k or a.static or a.global_scale:
            return f"{call.scheme.name}: {self.name} takes dynamic per-token e4m3 activations"
        if not _e4m3_experts(call.scheme):
            from .scaled_mm_mx import mxfp4_weight_reason
            why = mxfp4_weight_reason(call.scheme, self.name)
            if why:
                return f"{call.scheme.name}: {self.name} takes e4m3 experts with per-channel fp32 scales, or MXFP4 experts"
        if call.dtype != torch.bfloat16:
            return f"{call.dtype} activations (bf16 only: the kernel writes bf16)"
        why = gf.shape_reason(call.n, call.k)
        if why is None and call.device_type == "cuda":
            why = gf.available()
        return why

    def mma(self, call: Call) -> str:
        return "wgmma"

    def candidates(self, call: Call) -> list[KernelConfig]:
        built = gf.built_variants() if call.device_type == "cuda" else sorted(gf.VARIANTS)
        return [KernelConfig(self.name, bm, rows, bk, 1, 1, 12 if rows == 128 else 8, 0)
                for v, (bm, bk, rows) in gf.VARIANTS.items() if v in built]

    def config_reason(self, call: Call, cfg: KernelConfig) -> str | None:
        try:
            v = variant_of(cfg)
        except ValueError as e:
            return str(e)
        if call.device_type == "cuda" and v not in gf.built_variants():
            return f"the loaded native library does not hold CUTLASS grouped fp8 variant {v}"
        return None

    def packed(self, qw) -> tuple[torch.Tensor, torch.Tensor] | str:
        """(e4m3 codes as bytes [E, N, K], fp32 row scales [E, N]) -- W8A8-FP8 experts' own, MXFP4 experts' exact
        e4m3 rows (cached) -- or why this weight has none."""
        e, n, _ = qw.shape
        if _e4m3_experts(qw.scheme):
            return qw.data.contiguous().view(torch.uint8), qw.scales.reshape(e, n).float().contiguous()
        from .scaled_grouped_mm import expert_e4m3_rows
        rows = expert_e4m3_rows(qw)
        return rows if isinstance(rows, str) else (rows[0].view(torch.uint8), rows[1].contiguous())

    def run(self, x, offsets, qw, bias, out_dtype, cfg: KernelConfig, out):
        from .. import dense
        t, n = x.shape[0], qw.N
        out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
        bias = qw.bias if bias is None else bias
        p = self.packed(qw)
        if bias is not None or isinstance(p, str):  # the Triton grouped kernel (same arithmetic class, slower)
            from .scaled_grouped_mm import _grouped_instead
            if isinstance(p, str):
                return _grouped_instead(self.name, p, x, offsets, qw, bias, out_dtype, out)
            from ..grouped import triton_grouped_linear
            return triton_grouped_linear(x, qw, offsets, bias, out_dtype, out=out)
        direct = out is not None and out.dtype == torch.bfloat16 and out.is_contiguous()
        y = out if direct else torch.empty(t, n, dtype=torch.bfloat16, device=x.device)
        if t == 0:
            return y if out is None or direct else out
        dense.check_act_group(qw.scheme.act, qw.K)
        q = dense.triton_quantize_activation(x if x.is_contiguous() else x.contiguous(), qw.scheme.act,
                                             qw.input_scale)
        gf.run(q.codes, q.scales.reshape(-1), p[0], p[1], offsets, y, variant_of(cfg))
        if out is not None:
            return y if direct else out.copy_(y)
        return y if out_dtype == torch.bfloat16 else y.to(out_dtype)


register(CutlassGroupedFP8())
