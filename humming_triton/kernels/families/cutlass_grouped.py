"""``cutlass_grouped`` / ``cutlass_grouped_bf16s`` / ``cutlass_grouped_shuffled`` / ``cutlass_grouped_mx``: MoE experts (``grouped_linear``) on the sm_90a CUTLASS grouped
mixed-input GEMM (``cutlass_ext/csrc_sm90_grouped/grouped_gemm.cu``): every expert one problem of CUTLASS's
pointer-array kernel, the int4 weight converted in registers and multiplied by its group scale in the mainloop,
TMA-fed and warp-specialized -- the grouped counterpart of ``cutlass_mixed`` / ``cutlass_mixed_bf16s`` (fp32 /
bf16 group scales) and of ``cutlass_mx_e4m3`` (MXFP4 experts as exact e4m3 rows).  bf16 activations, no expert
bias (a bias runs the Triton grouped kernel).  Backend ``cutlass``; ``auto`` runs them only where the device's measured table says they are fastest.

KernelConfig: ``block_m`` the token tile, ``block_k`` the K tile, ``block_n`` the weight rows per tile (128:
cooperative, 64: pingpong)."""
from __future__ import annotations

import torch

from cutlass_ext import grouped_gemm as gg

from ...calls import Call, KernelConfig
from . import Family, register


def variant_in(cfg: KernelConfig, variants: dict, what: str = "CUTLASS grouped") -> int:
    """The id of the (token tile, K tile, weight rows) variant ``cfg`` names in ``variants``."""
    want = (cfg.block_m, cfg.block_k, cfg.block_n)
    for v, spec in variants.items():
        if spec == want:
            return v
    raise ValueError(f"no {what} variant with token tile {cfg.block_m}, K tile {cfg.block_k}, "
                     f"{cfg.block_n}-row weight tiles (variants: {variants})")


def variant_of(cfg: KernelConfig) -> int:
    return variant_in(cfg, gg.VARIANTS)


class CutlassGrouped(Family):
    name = "cutlass_grouped"
    op = "grouped_linear"
    backend = "cutlass"
    fmt = 0  # fp32 group scales: one rounding, as the reference's dequantized weight

    def reason(self, call: Call) -> str | None:
        if call.op != "grouped_linear" or not call.experts:
            return "the CUTLASS grouped GEMM runs MoE experts (grouped_linear)"
        if call.act_order:
            return "act-order (k_perm) experts"
        if call.facts is not None and tuple(getattr(call.facts, "sm", (9, 0))) != (9, 0):
            return f"sm_90a kernels run on SM 9.0 only (this GPU is SM {'.'.join(map(str, call.facts.sm))})"
        why = self.weight_reason(call)
        if why is None and call.device_type == "cuda":
            why = gg.available(self.fmt)
        return why

    def weight_reason(self, call: Call) -> str | None:
        return gg.weight_reason(call.scheme, call.n, call.k, call.dtype)

    def group(self, call: Call) -> int:
        """The scale group the kernel sees."""
        return call.scheme.group_k(call.k)

    def mma(self, call: Call) -> str:
        return "wgmma"

    def _why_not(self, call: Call, v: int) -> str | None:
        why = gg.variant_reason(v, self.group(call))
        if why is None and call.device_type == "cuda" and v not in gg.built_variants(self.fmt):
            why = f"the loaded native library does not hold CUTLASS grouped variant {v} of format {self.fmt}"
        return why

    def candidates(self, call: Call) -> list[KernelConfig]:
        return [KernelConfig(self.name, bm, rows, bk, 1, 1, 12 if rows == 128 else 8, 0)
                for v, (bm, bk, rows) in gg.VARIANTS.items() if self._why_not(call, v) is None]

    def config_reason(self, call: Call, cfg: KernelConfig) -> str | None:
        try:
            return self._why_not(call, variant_of(cfg))
        except ValueError as e:
            return str(e)

    def packed(self, qw):
        return qw.cached_view("cutlass", ("grouped", self.fmt), lambda: gg.repack_experts(qw, self.fmt))

    def run(self, x, offsets, qw, bias, out_dtype, cfg: KernelConfig, out):
        t, n = x.shape[0], qw.N
        out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
        bias = qw.bias if bias is None else bias
        if bias is not None:  # the kernel has no bias input: adding one to its bf16 output would round twice
            from ..grouped import triton_grouped_linear
            return triton_grouped_linear(x, qw, offsets, bias, out_dtype, out=out)
        y = out if out is not None else torch.empty(t, n, dtype=out_dtype, device=x.device)
        if t == 0:
            return y
        x = x if x.is_contiguous() else x.contiguous()
        target = y if y.dtype == torch.bfloat16 and y.is_contiguous() else \
            torch.empty(t, n, dtype=torch.bfloat16, device=x.device)
        p = self.packed(qw)
        if isinstance(p, str):  # experts this format cannot hold exactly: the Triton grouped kernel, with a warning
            from .scaled_grouped_mm import _grouped_instead
            return _grouped_instead(self.name, p, x, offsets, qw, None, out_dtype, out)
        gg.run(x, p, offsets, target, variant_of(cfg))
        if target is not y:
            y.copy_(target)
        return y


register(CutlassGrouped())


class CutlassGroupedBF16Scales(CutlassGrouped):
    """``cutlass_grouped_bf16s``: the mainloop multiplies each converted weight by its group scale in bf16 (the
    scale rounded to bf16 at repack, the product rounded again: two roundings) -- fewer instructions in the
    conversion that bounds int4 at mid M (dense: 15 % at M = 256, session 20)."""
    name = "cutlass_grouped_bf16s"
    fmt = 10


register(CutlassGroupedBF16Scales())


class CutlassGroupedShuffled(CutlassGroupedBF16Scales):
    """``cutlass_grouped_shuffled``: ``cutlass_grouped_bf16s``'s arithmetic (grouped format 11 = 10) on each
    expert's weight stored in the order the mainloop consumes it (``cutlass_ext.mixed_gemm.shuffle``, cached): one
    32-bit shared load per lane per k-block and CUTLASS's vectorized int4 -> bf16 converter, as dense
    ``cutlass_mixed_shuffled``.  Needs N a multiple of 16."""
    name = "cutlass_grouped_shuffled"
    fmt = 11

    def weight_reason(self, call: Call) -> str | None:
        why = super().weight_reason(call)
        if why is None and call.n % 16:
            why = f"N={call.n} is not a multiple of 16 (the shuffled order stores whole 16-row blocks)"
        return why


register(CutlassGroupedShuffled())


class CutlassGroupedMX(CutlassGrouped):
    """``cutlass_grouped_mx``: MXFP4 experts as their exact e4m3 rows (``scaled_grouped_mm.expert_e4m3_rows``, one
    cached byte per weight) on format 6, whose mainloop converts e4m3 to bf16 and multiplies by the row's
    power-of-two scale in bf16 -- exact, so the only roundings are the bf16 GEMM's.  Why: MXFP4's 32-wide e8m0
    groups have no CUTLASS mainloop, and the Triton grouped loop runs MXFP4 experts at 0.19-0.54x Humming from 256
    tokens (session 20).  Experts whose rows span too many binades for e4m3, or whose row scales leave bf16's exact
    range, run the Triton grouped kernel (with a warning)."""
    name = "cutlass_grouped_mx"
    fmt = 6

    def weight_reason(self, call: Call) -> str | None:
        from .scaled_mm_mx import mxfp4_weight_reason
        why = mxfp4_weight_reason(call.scheme, self.name)
        if why:
            return why
        if call.scheme.act is not None:
            return f"{call.scheme.name} quantizes its activations (this kernel takes bf16 activations)"
        if call.dtype != torch.bfloat16:
            return f"{call.dtype} activations (bf16 only)"
        if call.k % 64 or call.n % 8:
            return f"N={call.n}, K={call.k}: K a multiple of the 64-wide K tile, N of 8 (16-byte rows)"
        return None

    def group(self, call: Call) -> int:
        return call.k  # one scale per row

    def packed(self, qw):
        from .scaled_grouped_mm import expert_e4m3_rows

        def make():
            rows = expert_e4m3_rows(qw)
            return rows if isinstance(rows, str) else gg.pack_e4m3_rows(*rows)
        return qw.cached_view("cutlass", ("grouped", self.fmt), make)


register(CutlassGroupedMX())


class CutlassGroupedMXA8(CutlassGroupedMX):
    """``cutlass_grouped_mx_a8``: W4A8-MXFP4 experts (per-token e4m3 activations) on the same format-6 kernel.  Our
    e4m3 activation quantizer, the codes widened to bf16 (exact), the grouped GEMM of exact code products with fp32
    accumulation (as fp8 tensor cores with promotion compute them), then each row times its token's scale: the
    output rounds twice (the GEMM's bf16, then the scaled value), a relative error <= 2^-8 per element -- far inside
    the fp8 activations' tolerance, and no cancellation can magnify it (a product, not a sum).  Why: torch's fp8
    grouped GEMM ran Qwen3's 128 experts at ~200 TFLOP/s (W4A8-MXFP4 gate_up 4096 tokens 1020 us, Humming 303;
    session 20); bf16 wgmma on the exact codes may beat it there even at half the MMA rate."""
    name = "cutlass_grouped_mx_a8"

    def weight_reason(self, call: Call) -> str | None:
        from .scaled_mm_mx import mxfp4_weight_reason
        s, a = call.scheme, call.scheme.act
        if a is None or str(a.dtype) != "e4m3fn" or not a.per_token or a.group_k or a.static or a.global_scale:
            return f"{s.name}: {self.name} takes dynamic per-token e4m3 activations"
        why = mxfp4_weight_reason(s, self.name)
        if why:
            return why
        if call.dtype != torch.bfloat16:
            return f"{call.dtype} activations (bf16 only)"
        if call.k % 64 or call.n % 8:
            return f"N={call.n}, K={call.k}: K a multiple of the 64-wide K tile, N of 8 (16-byte rows)"
        return None

    def run(self, x, offsets, qw, bias, out_dtype, cfg: KernelConfig, out):
        from .. import dense
        t, n = x.shape[0], qw.N
        out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
        bias = qw.bias if bias is None else bias
        p = self.packed(qw)
        if bias is not None or isinstance(p, str) or t == 0:  # the Triton grouped kernel (or an empty batch)
            return super().run(x, offsets, qw, bias, out_dtype, cfg, out)
        dense.check_act_group(qw.scheme.act, qw.K)
        xc = x if x.is_contiguous() else x.contiguous()
        if dense.FAST_ACT_QUANT and qw.input_scale is None:  # the quantizer writes the bf16 code values itself
            codes, scales = dense.quantize_activation_values(xc, qw.scheme.act, torch.bfloat16)
        else:
            q = dense.triton_quantize_activation(xc, qw.scheme.act, qw.input_scale)
            codes, scales = q.codes.view(torch.float8_e4m3fn).to(torch.bfloat16), q.scales  # exact
        y = torch.empty(t, n, dtype=torch.bfloat16, device=x.device)
        gg.run(codes, p, offsets, y, variant_of(cfg))
        y.mul_(scales.reshape(t, 1))  # in fp32, rounded once more to bf16
        if out is not None:
            return out.copy_(y)
        return y if out_dtype == torch.bfloat16 else y.to(out_dtype)


register(CutlassGroupedMXA8())
