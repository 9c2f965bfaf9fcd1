"""``cutlass_mixed``: the sm_90a CUTLASS mixed-input GEMMs (``cutlass_ext/csrc_sm90/mixed_gemm.cu``) for dense
weight-only layers: int4 (group or channel scales), uint4 with integer zero points, int8 and e4m3 (channel
scales), bf16 / fp16 activations, any M.  The weight is the register-sourced WGMMA operand (converted in registers
by CUTLASS's mixed-input mainloop, TMA-fed, warp-specialized), the tokens the MMA's N side.  Backend ``cutlass``;
``auto`` runs it only where the device's measured table says it is fastest.

KernelConfig: ``block_m`` the token tile, ``block_n`` the weight rows per tile (128: cooperative, 64: pingpong),
``block_k`` the K tile, ``split_k`` 1 = persistent data-parallel tiles, 0 = stream-K (CUTLASS's scheduler splits K
across CTAs to fill the SMs)."""
from __future__ import annotations

import torch

from cutlass_ext import mixed_gemm as mg

from ...calls import Call, KernelConfig
from . import Family, register


def packed_view(qw, dtype):
    """The kernels' operands of ``qw`` for ``dtype`` activations (cutlass_ext.mixed_gemm.repack), made once and
    cached on the weight (never serialized; made again after an edit of its tensors)."""
    return qw.cached_view("cutlass", ("mixed", dtype), lambda: mg.repack(qw, dtype))


def _cast_bias(qw, bias, dtype):
    """``bias`` in ``dtype``, cached on the weight (keyed by the bias's storage and version counter, so an
    in-place edit or another bias makes a new copy)."""
    state = qw.cache.setdefault("cutlass", {})
    try:
        version = bias._version
    except RuntimeError:  # inference tensors: no version counter
        version = -1
    key = (bias.data_ptr(), version, dtype)
    hit = state.get("bias")
    if hit is None or hit[0] != key:
        hit = state["bias"] = (key, bias.to(dtype).contiguous())
    return hit[1]


def variant_of(cfg: KernelConfig) -> int:
    from cutlass_ext.mixed_gemm import VARIANTS
    want = (cfg.block_m, cfg.block_k, cfg.split_k == 0, cfg.block_n)
    for v, spec in VARIANTS.items():
        if spec == want:
            return v
    raise ValueError(f"no CUTLASS mixed-input variant with token tile {cfg.block_m}, K tile {cfg.block_k}, "
                     f"{'stream-K' if cfg.split_k == 0 else 'persistent'}, {cfg.block_n}-row weight tiles "
                     f"(variants: {VARIANTS})")


class CutlassMixed(Family):
    name = "cutlass_mixed"
    backend = "cutlass"

    def reason(self, call: Call) -> str | None:
        if call.op != "quant_linear" or call.experts:
            return "the CUTLASS mixed-input GEMM runs dense linear layers"
        if call.act_order:
            return "act-order weights (the kernel reads K in stored order)"
        if call.facts is not None and tuple(getattr(call.facts, "sm", (9, 0))) != (9, 0):
            return f"sm_90a kernels run on SM 9.0 only (this GPU is SM {'.'.join(map(str, call.facts.sm))})"
        why = self.weight_reason(call)
        if why is None and call.device_type == "cuda":
            from cutlass_ext.mixed_gemm import available
            why = available(self.format_id(call))
        return why

    def weight_reason(self, call: Call) -> str | None:
        from cutlass_ext.mixed_gemm import weight_reason
        return weight_reason(call.scheme, call.n, call.k, call.dtype)

    def format_id(self, call: Call) -> int:
        """The csrc_sm90 format (cutlass_ext.mixed_gemm.FORMATS) this family runs the call's weight as."""
        from cutlass_ext.mixed_gemm import format_of
        return format_of(call.scheme, call.dtype)[0]

    def group(self, call: Call) -> int:
        """The scale group the kernel sees (0: channel scales)."""
        return 0 if call.scheme.scale.block_k == 0 else call.scheme.group_k(call.k)

    def packed(self, qw, dtype):
        return packed_view(qw, dtype)

    def mma(self, call: Call) -> str:
        return "wgmma"

    def _why_not(self, call: Call, v: int) -> str | None:
        """Why variant ``v`` cannot run this call: the weight's group refuses its K tile, or the loaded library
        does not hold it (a partial build)."""
        from cutlass_ext.mixed_gemm import built_variants, variant_reason
        why = variant_reason(v, self.group(call))
        if why is None and call.device_type == "cuda" and v not in built_variants(self.format_id(call)):
            why = f"the loaded native library does not hold CUTLASS variant {v} of this format"
        return why

    def candidates(self, call: Call) -> list[KernelConfig]:
        from cutlass_ext.mixed_gemm import VARIANTS
        fits = [(v, spec) for v, spec in VARIANTS.items() if self._why_not(call, v) is None]
        # token tiles up to twice M (and 16); when none of those fits the group (g64 needs a K tile of 64, which
        # only the larger tiles have), the smallest tile that does
        small = [(v, spec) for v, spec in fits if spec[0] <= 2 * max(call.m, 16)]
        if not small and fits:
            least = min(spec[0] for _, spec in fits)
            small = [(v, spec) for v, spec in fits if spec[0] == least]
        return [KernelConfig(self.name, bm, rows, bk, 0 if streamk else 1, 1, 12, 0)
                for _, (bm, bk, streamk, rows) in small]

    def config_reason(self, call: Call, cfg: KernelConfig) -> str | None:
        """A table's pick the loaded library does not hold, or that the weight's group refuses."""
        try:
            return self._why_not(call, variant_of(cfg))
        except ValueError as e:
            return str(e)

    def run(self, x, x2, qw, bias, out_dtype, cfg: KernelConfig, out):
        p = self.packed(qw, x2.dtype)
        if isinstance(p, str):  # a weight this family's change of format cannot hold exactly
            from .scaled_mm_mx import dequant_instead
            return dequant_instead(self.name, p, x, x2, qw, bias, out_dtype, out)
        m, n = x2.shape[0], qw.N
        y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=x2.device)
        if m == 0:
            return y
        x2 = x2 if x2.is_contiguous() else x2.contiguous()
        b = None
        if bias is not None:  # the epilogue adds a bias of the activation type: cast once per bias, not per call
            b = bias if bias.dtype == x2.dtype and bias.is_contiguous() else _cast_bias(qw, bias, x2.dtype)
        target = y if y.dtype == x2.dtype and y.is_contiguous() else torch.empty(m, n, dtype=x2.dtype,
                                                                                 device=x2.device)
        mg.run(x2, p, b, target, variant_of(cfg))
        if target is not y:
            y.copy_(target)
        return y


register(CutlassMixed())


class CutlassMixedBF16Scales(CutlassMixed):
    """``cutlass_mixed_bf16s``: int4 group-scaled weights with bf16 activations on format 10, whose mainloop
    multiplies each converted weight by its group scale in bf16 (the scale rounded to bf16 once, at repack; the
    product rounded again: two roundings where ``cutlass_mixed``'s fp32 product has one -- what Marlin-style kernels
    do).  Why: the fp32 detour (int4 -> fp32, multiply, fp32 -> bf16) is what bounds int4 at mid M on the H200
    (int4 with no scale in the mainloop ran 59.8 against 75.0 us at M = 256; fp16 with fp16 scales 66.9)."""
    name = "cutlass_mixed_bf16s"
    fmt = 10  # an INEXACT_FORMATS twin of the exact format 0

    def weight_reason(self, call: Call) -> str | None:
        from cutlass_ext.mixed_gemm import INEXACT_FORMATS
        why = super().weight_reason(call)
        if why is None and super().format_id(call) != INEXACT_FORMATS[self.fmt]:
            why = f"{call.scheme.name} with {call.dtype} activations (int4 group scales with bf16 activations only)"
        return why

    def format_id(self, call: Call) -> int:
        return self.fmt

    def packed(self, qw, dtype):
        return qw.cached_view("cutlass", ("mixed", dtype, self.fmt), lambda: mg.repack(qw, dtype, fmt=self.fmt))


register(CutlassMixedBF16Scales())


class CutlassMixedShuffled(CutlassMixedBF16Scales):
    """``cutlass_mixed_shuffled``: ``cutlass_mixed_bf16s``'s arithmetic (format 11 = format 10) on the weight stored
    in the order the mainloop consumes it (``cutlass_ext.mixed_gemm.shuffle``, once per weight, cached): each
    lane's 8 values of a k-block in one 32-bit shared-memory load (format 10: 4 byte loads plus PRMTs to gather
    them) and in the order for which CUTLASS's LayoutAwareConvert has a 3-instruction-per-pair int4 -> bf16
    conversion.  sm_90a SASS of the 128x128x64 persistent kernel: 48 LDS.U8 -> 0 (13 LDS.32), PRMT 101 -> 19,
    2024 -> 1920 instructions.  Needs N a multiple of 16 (whole 16-row blocks)."""
    name = "cutlass_mixed_shuffled"
    fmt = 11

    def weight_reason(self, call: Call) -> str | None:
        why = super().weight_reason(call)
        if why is None and call.n % 16:
            why = f"N={call.n} is not a multiple of 16 (the shuffled order stores whole 16-row blocks)"
        return why


register(CutlassMixedShuffled())


class CutlassMXE4M3(CutlassMixed):
    """``cutlass_mx_e4m3``: MXFP4 weights on the e4m3 CUTLASS kernels (formats 6 / 7: e4m3 codes, an fp32 row scale
    on the accumulator), by the exact change of format of ``scaled_mm_mx.as_e4m3_rows`` -- each block's e2m1
    values times 2^(block exponent - row exponent + 6) are e4m3 values, 2^(row exponent - 6) the row scale.
    Why: MXFP4's 32-wide e8m0 groups have no CUTLASS mainloop (e2m1 is no mixed-input type of CUTLASS 4.2), and
    the e4m3 kernel runs at int8 speed (w8a16-fp8 8192^2 M = 256: 56 us against dequantize + cuBLAS's 104 for
    MXFP4).  Costs one byte per weight, cached (the same view ``scaled_mm_mx`` uses).  A weight whose rows span
    more than 14 binades of block exponents runs through ``dequant_mm`` (with a warning)."""
    name = "cutlass_mx_e4m3"

    def weight_reason(self, call: Call) -> str | None:
        from .scaled_mm_mx import mxfp4_weight_reason
        why = mxfp4_weight_reason(call.scheme, self.name)
        if why:
            return why
        if call.scheme.act is not None:
            return f"{call.scheme.name} quantizes its activations (these kernels take 16-bit activations)"
        if call.dtype not in (torch.bfloat16, torch.float16):
            return f"{call.dtype} activations (bf16 / fp16 only)"
        if call.k % 16 or call.n % 8:
            return f"N={call.n}, K={call.k}: TMA needs 16-byte rows (K a multiple of 16, N of 8)"
        return None

    def format_id(self, call: Call) -> int:
        return 6 if call.dtype == torch.bfloat16 else 7

    def group(self, call: Call) -> int:
        return 0

    def packed(self, qw, dtype):
        """``mg.Packed`` of the weight's e4m3 rows, or why it has none (made once, cached on the weight)."""
        from .scaled_mm_mx import e4m3_view

        def make():
            view = e4m3_view(qw)
            if isinstance(view, str):
                return view
            codes, scales = view
            return mg.Packed(6 if dtype == torch.bfloat16 else 7, codes.view(torch.uint8), scales, None, qw.N,
                             qw.K, 0)
        return qw.cached_view("cutlass", ("mx_e4m3", dtype), make)


register(CutlassMXE4M3())
