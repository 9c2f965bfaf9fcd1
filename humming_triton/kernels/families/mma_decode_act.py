"""``mma_decode_act``: the quantized-activation schemes (W8A8 / W4A8 with dynamic e4m3 or int8 activations, per
token or per group of K; W4A4-MXFP4 with its activations as e4m3 rows, ``dense.triton_quantize_mx_rows``; W4A4-NVFP4
as code x block scale values in bf16 with the global scale per row, ``dense.block_act_values``) at decode sizes,
M <= 16, on the native decode GEMM of ``mma_decode``.

One Triton launch quantizes the activations to their codes, stored as 16-bit values (exact: e4m3 and int8 are
subsets of fp16 and bf16); the decode kernel multiplies them by the weight's codes on fp16 / bf16 tensor cores
and applies the per-token scale to each output row -- or, for activation scales per group of K, each group's
scales to its fp32 partial sums (int8 / e4m3 weights, whose scales then travel per that group).  The products are the ones an fp8 / int8 MMA makes, the sums
are fp32 with no fast-accumulation truncation, so the result is at least as accurate as ``torch._scaled_mm`` on
the same codes.  Why: at decode the weight stream sets the time, and this kernel streams it faster than the fp8
GEMMs (cuBLASLt's fp8 GEMM takes longer at M = 1 than bf16 does).  Backend ``cuda``; ``auto`` runs it only where
the device's measured table says it is fastest."""
from __future__ import annotations

import torch

from cutlass_ext import decode_mma as dm

from ...calls import Call, KernelConfig
from . import register
from ..dense import block_act_values, mx_rows_reason, quantize_activation_values, triton_quantize_mx_rows
from .mma_decode import MAX_M, MMADecode, packed_view


def code_dtype(scheme) -> torch.dtype:
    """The 16-bit type the activation codes travel in: bf16 for e2m1 weights (the kernel's e2m1 decode is bf16),
    fp16 otherwise (e4m3 weights convert to fp16 in one instruction; integer weights decode cheapest in fp16)."""
    return torch.bfloat16 if str(scheme.weight) == "e2m1" else torch.float16


def nv_values_reason(spec) -> str | None:
    """None where ``spec`` is NVFP4 activations (e2m1 codes, e4m3 block scales, a global scale), whose code x block
    scale values bf16 holds exactly (``dense.block_act_values``: at most 6 significant bits, 2**-10 .. 2688) with
    the global scale per row, else why not."""
    if spec is None or str(spec.dtype) != "e2m1" or str(spec.scale_dtype) != "e4m3fn" or not spec.global_scale:
        return f"bf16 values with a row scale are made from NVFP4 activations (e2m1, e4m3 blocks, global), not {spec}"
    return None


def act_reason(scheme, k: int) -> str | None:
    """Why these activations cannot run as code values (None if they can): their scale must factor out of each
    row, or out of each group of K that the weight's scales can be split into."""
    act = scheme.act
    if act is None:
        return "16-bit activations (mma_decode runs them)"
    if str(act.dtype) not in ("e4m3fn", "int8") or str(act.scale_dtype) != "fp32" or not act.per_token \
            or act.static or act.global_scale:
        return f"{act} activations (dynamic per-token or per-group e4m3 / int8 with fp32 scales only)"
    if act.group_k:
        ga, gw = act.group_k, scheme.group_k(k)
        if ga % dm.CHUNK or gw % ga or k % ga:
            return f"activation groups of {ga} (a multiple of {dm.CHUNK} that divides K={k} and the weight's {gw})"
        if str(scheme.weight) not in ("e4m3fn", "int8"):
            return f"activation group scales with {scheme.weight} weights (int8 / e4m3 only)"
    return None


class MMADecodeAct(MMADecode):
    name = "mma_decode_act"

    def reason(self, call: Call) -> str | None:
        if call.op != "quant_linear" or call.experts:
            return "the native decode kernel runs dense linear layers"
        # MXFP4 activations (W4A4-MXFP4) run as e4m3 rows (dense.triton_quantize_mx_rows): a scale per row
        why = None if mx_rows_reason(call.scheme.act) is None or nv_values_reason(call.scheme.act) is None \
            else act_reason(call.scheme, call.k)
        if why:
            return f"{call.scheme.name}: {why}"
        if call.m > MAX_M:
            return f"M={call.m} (the native decode kernel takes M <= {MAX_M})"
        if call.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return f"{call.dtype} activations (fp16 / bf16 / fp32 only)"
        return dm.weight_reason(call.scheme, call.n, call.k, code_dtype(call.scheme), act_codes=True)

    def mma(self, call: Call) -> str:
        if str(call.scheme.weight) == "e4m3fn":
            return "fp8"  # cvt.rn.f16x2.e4m3x2 exists from SM 8.9, with the fp8 MMA
        return "bf16" if code_dtype(call.scheme) == torch.bfloat16 else "fp16"

    def runner(self, x2, qw, bias, out_dtype, cfg: KernelConfig, shape: tuple):
        """No lean plan: the weight-only runner this class would inherit skips the activation quantization (it ran
        W4A8-MXFP4 on unquantized x and failed on W8A8-FP8 in the H200 headline run at 6fc7cc7); repeats call
        ``run``, which quantizes."""
        return None

    def launch(self, x2, qw, bias, target, cfg: KernelConfig) -> None:
        """Quantize ``x2`` to its code values, then the kernel with the activations' scales."""
        act = qw.scheme.act
        if mx_rows_reason(act) is None:  # MXFP4 activations: e4m3 rows, one power-of-two scale per row
            codes, scales = triton_quantize_mx_rows(x2, act, code_dtype(qw.scheme))
            dm.run(codes, packed_view(qw, None), bias, target, kw=cfg.split_k, tw=cfg.block_n // 16,
                   unroll=cfg.num_stages, row_scales=scales.view(-1))
            return
        if nv_values_reason(act) is None:  # NVFP4 activations: code x block scale in bf16, the global per row
            values, rows = block_act_values(x2, act, code_dtype(qw.scheme), qw.input_scale)
            dm.run(values, packed_view(qw, None), bias, target, kw=cfg.split_k, tw=cfg.block_n // 16,
                   unroll=cfg.num_stages, row_scales=rows)
            return
        codes, scales = quantize_activation_values(x2, act, code_dtype(qw.scheme))
        grouped = bool(act.group_k) and act.group_k != qw.K
        dm.run(codes, packed_view(qw, act.group_k if grouped else None), bias, target, kw=cfg.split_k,
               tw=cfg.block_n // 16, unroll=cfg.num_stages, row_scales=None if grouped else scales.view(-1),
               act_scales=scales if grouped else None)


register(MMADecodeAct())
