"""Dense GEMM on Triton: runs one ``KernelConfig`` of one registered kernel family (``kernels/families/``).

``triton_linear(x, qw, config=...)`` reads the canonical QuantWeight directly (no per-call repacking).  A
single-launch family (``gemv``, ``gemv_words``, ``tiled``, ``swapab``) is planned once per call signature and
replayed; the multi-step paths live here too: the quantized-activation tile loop (``act_linear``: the fused
activation quantizer, then fp8 / int8 / bf16 tensor cores) and dequantize + cuBLAS (``dequant_linear``).
Which family and config run is dispatch's choice (the measured table); ``configs.heuristic`` is the built-in
default for a call that arrives without a config.
"""
from __future__ import annotations

import os

import torch
import triton

from dataclasses import replace

from ..calls import Call, KernelConfig, interpreting
from ..formats.activation import QuantActivation, dequantize_activation, global_act_scale
from ..formats.dtypes import FloatType, WideFloat
from ..formats.scheme import ActQuant, QuantScheme
from ..formats.weight import QuantWeight
from . import configs, families
from ._act_quant import act_quant_f32_kernel, act_quant_kernel, act_quant_token_rows_kernel, global_scale_kernel
from ._dense_tiled import dense_tiled_kernel
from ._dequant import dequant_kernel
from .launch import Launch, backend_cache, launch_format, post_scale, weight_args, weight_format

__all__ = ["triton_linear", "triton_dequantize", "triton_quantize_activation", "act_linear", "dequant_linear"]

PER_TOKEN = 1 << 30  # ACT_GROUP_K meaning "one scale per row": k0 // PER_TOKEN == 0 for every K tile


def device_facts(device: torch.device) -> tuple[str | None, int]:
    """(config-file slug, SM count) of a device (capability.device_facts)."""
    from ..capability import device_facts as facts
    f = facts(device)
    return f.slug, f.num_sms


def _format(qw: QuantWeight) -> dict:
    return weight_format(qw)


def _launch_format(qw: QuantWeight, block_k: int) -> dict:
    return launch_format(weight_format(qw), qw.K, block_k)


_weight_args = weight_args


def call_of(x2: torch.Tensor, qw: QuantWeight, op: str = "quant_linear") -> Call:
    return Call(op, qw.scheme, x2.dtype, x2.shape[0], qw.N, qw.K, qw.num_experts or 0, qw.k_perm is not None,
                x2.device.type)


def triton_dequantize(qw: QuantWeight, dtype: torch.dtype = torch.float32, block_n: int = 32,
                      block_k: int = 128) -> torch.Tensor:
    """Dense ``[N, K]`` weight in ``dtype`` (2-D QuantWeights)."""
    n, k = qw.N, qw.K
    block_k = configs.fit_block_k(block_k, _format(qw)["GROUP_K"], k, qw.scheme.bits)
    fmt = _launch_format(qw, block_k)
    out = torch.empty(n, k, dtype=dtype, device=qw.device)
    (w, s, z, g), strides = _weight_args(qw)
    dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
        w, s, z, g, out, n, k, stride_on=out.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=k % block_k == 0, **strides, **fmt)
    return out


ACT_KINDS = {"e4m3fn": 1, "int8": 2, "e2m1": 3}  # the activation element types the quantizer writes
ACT_SCALE_KINDS = {"fp32": 0, "e8m0": 1, "e4m3fn": 2}


def act_kind(act: ActQuant | None, block_m: int) -> int:
    """The tile loop's ACT_KIND: 0 16-bit x; 1 e4m3 on fp8 mma.sync (16-row tiles); 5 e4m3 on a bf16 MMA (64/128
    rows: the fp8 wgmma is not exact); 2 int8; 3 / 4 e2m1 with e8m0 / e4m3 block scales."""
    if act is None:
        return 0
    kind = ACT_KINDS[str(act.dtype)]
    if kind == 1 and block_m >= 64:
        return 5
    return kind + (kind == 3 and str(act.scale_dtype) == "e4m3fn")


# The integer-decode tile loops (ACT_KIND 7: int8 x with signed int4 / int8 weights unpacked by integer ops and
# an exact int32 -> fp32 conversion; 9: the same with int32 sums over all of K where both scales are one per row)
# instead of decoding the weight through fp32 (ACT_KIND 2).  On: same-run A/B on the H200 at 6ad45fb, 1.2-1.5x
# (W4A8-INT8) and 2-8x (W8A8-INT8) faster in every config timed (act/int_decode_probe_6ad45fb.txt).
INT_DECODE_ACT = os.environ.get("HT_INT_DECODE_ACT", "1") == "1"
# ACT_KIND 8 (e4m3 x with signed int4 weights decoded to bf16 by packed instructions, instead of ACT_KIND 5's fp32
# decode): opt-in -- the same A/B measured it mixed (0.95-1.2x) and never the table's pick.
PACKED_E4M3_ACT = os.environ.get("HT_PACKED_E4M3_ACT") == "1"
INT_DECODE_ACT_GROUPED = False  # the grouped (MoE) tile loop keeps ACT_KIND 2 / 5 until it is timed there
SCALED_KINDS = (1, 2, 5, 7, 8, 9)  # the tile loops that multiply fp32 activation scales into partial products


def int_decode_kind(kind: int, fmt: dict, post: bool, k: int, act: ActQuant, grouped: bool = False) -> int:
    """The integer-decode variant of a quantized-activation ACT_KIND where the weight allows it (signed int4 /
    int8 codes without zero points, one scale per K tile) and its flag is on, else ``kind``: 7 / 9 for int8 x
    (``INT_DECODE_ACT``; 9 where both scales are one per row -- weight channel, activation token -- so the int32
    sums span all of K), 8 for e4m3 x on the bf16 MMA (``PACKED_E4M3_ACT``)."""
    signed_int = not fmt["W_IS_FLOAT"] and fmt["W_SIGNED"] and fmt["ZERO_KIND"] == 0 and post
    if grouped and not INT_DECODE_ACT_GROUPED or not signed_int:
        return kind
    if kind == 2 and fmt["BITS"] in (4, 8) and INT_DECODE_ACT:
        return 9 if fmt["GROUP_K"] >= k and fmt["GROUP_N"] == 1 and not act.group_k else 7
    if kind == 5 and fmt["BITS"] == 4 and PACKED_E4M3_ACT:
        return 8
    return kind


def check_act_group(spec: ActQuant, k: int) -> None:
    if spec.group_k and k % spec.group_k:  # as the reference: a partial last group has no agreed scale rule
        raise ValueError(f"activation group size {spec.group_k} does not divide K={k}")


def triton_quantize_activation(x2: torch.Tensor, spec: ActQuant, input_scale: torch.Tensor | None = None,
                               scale_values: bool = False, codes: torch.Tensor | None = None,
                               scales: torch.Tensor | None = None) -> QuantActivation:
    """``x [M, K]`` -> its ``QuantActivation`` (codes uint8 [M, K]: e4m3 / two's-complement int8 / e2m1;
    scales [M, groups]: fp32, or e8m0 / e4m3 codes), as ``formats.activation.quantize_activation`` makes it.
    NV's global scale is amax(x) / (6 * 448) per call, or the calibrated ``input_scale`` when the spec is static.
    ``scale_values``: e8m0 scales come back as their exact fp32 values (for the tile loops that multiply fp32
    scales into partial products), not as codes.  ``codes`` / ``scales``: buffers to write instead (at least M
    rows; the scales in any strides -- a GEMM may want them column-major)."""
    m, k = x2.shape
    g = spec.group_k or k
    check_act_group(spec, k)
    if codes is None:
        codes = torch.empty(m, k, dtype=torch.uint8, device=x2.device)
    wide = str(spec.scale_dtype) == "fp32"
    scale_values = scale_values and str(spec.scale_dtype) == "e8m0"
    if scales is None:
        scales = torch.empty(m, -(-k // g), dtype=torch.float32 if wide or scale_values else torch.uint8,
                             device=x2.device)
    # NV's per-tensor scale: the reference's formula, over the finite values (a NaN / inf row must not spoil the
    # other rows' scales; the quantizer gives that row a NaN scale)
    gscale = triton_global_scale(x2, spec) if spec.global_scale and input_scale is None else \
        global_act_scale(x2, spec, input_scale)
    launch_act_quant(x2, spec, codes, scales, gscale, scale_values)
    return QuantActivation(codes, scales, spec, gscale)


MX_ROW_SPAN = 14  # binades below a row's largest MXFP4 block that e4m3 row codes still hold exactly


def mx_rows_reason(spec: ActQuant | None) -> str | None:
    """None where ``spec`` is dynamic MXFP4 activations (e2m1 codes, e8m0 scales per 32 of K, no global scale),
    the quantization ``triton_quantize_mx_rows`` writes as e4m3 rows, else why not."""
    if spec is None or str(spec.dtype) != "e2m1" or str(spec.scale_dtype) != "e8m0" or spec.group_k != 32 \
            or spec.static or spec.global_scale:
        return f"e4m3 rows are made from dynamic MXFP4 activations (e2m1, e8m0 per 32), not {spec}"
    return None


def triton_quantize_mx_rows(x2: torch.Tensor, spec: ActQuant,
                            values: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> (e4m3 codes uint8 [M, K], fp32 power-of-two row scales [M, 1]): the MXFP4 quantization of
    ``spec`` (``formats.activation.quantize_activation``, code for code), each value re-expressed on e4m3's grid
    against its row's scale -- exact for blocks within ``MX_ROW_SPAN`` binades of the row's largest, nearest
    below that (``_act_quant.act_quant_mx_rows_kernel``; ``mx_rows_reference`` is the torch twin).  One launch.
    ``values`` (fp16 / bf16): the codes' values in that type instead of their bytes (exact)."""
    from ._act_quant import act_quant_mx_rows_kernel
    why = mx_rows_reason(spec)
    if why:
        raise ValueError(why)
    m, k = x2.shape
    check_act_group(spec, k)
    if values not in (None, torch.float16, torch.bfloat16):
        raise ValueError(f"code values are fp16 / bf16, not {values}")
    codes = torch.empty(m, k, dtype=values or torch.uint8, device=x2.device)
    scales = torch.empty(m, 1, dtype=torch.float32, device=x2.device)
    if m:
        one_pass, block, warps = mx_rows_shape(m, k)
        act_quant_mx_rows_kernel[(m,)](x2, codes, scales, k, x2.stride(0), codes.stride(0), BLOCK_K=block,
                                       ONE_PASS=one_pass, CODE_VALUES=values is not None,
                                       CVT_E4M3=cvt_e4m3(x2, "mx_rows"), num_warps=warps)
    return codes, scales


MX_ROWS_ONE_PASS_ROWS = 256  # rows of 8193..16384 (untimed): one pass up to this many, else two passes
MX_ROWS_CHUNK = 2048  # the two-pass chunk (the second read hits L2)
MX_ROWS_MEASURED = 8192  # rows of 4097..8192 were timed: one pass at 16 warps at every M (below)


def mx_rows_shape(m: int, k: int) -> tuple[bool, int, int]:
    """(one pass, BLOCK_K, num_warps) of ``act_quant_mx_rows_kernel``.  Measured on the H200 at K = 8192
    (``scripts/act_quant_probe.py``, session 28): one pass at 16 warps was the fastest shape at every M -- 6.9 /
    7.5 / 10.5 / 77.3 µs at M = 1 / 16 / 256 / 4096, against 32 warps 7.4 / 7.7 / 10.8 / 84.4 and two passes of
    2048 / 4096 (8 warps) 9.0 / 9.4 / 12.2 / 88.8 and 8.1 / 8.4 / 11.5 / 85.5 -- and 1.9-2.7x the float64 kernel
    it replaced (18.7 / 19.5 / 23.3 / 173.1), byte for byte the same codes.  Other lengths keep the earlier
    (untimed) rule: short rows in one pass at 8 values per thread, longer ones in one pass for few rows, else
    2048-wide chunks walked twice by 8 warps."""
    block = max(32, triton.next_power_of_2(k))
    if MX_ROWS_MEASURED // 2 < block <= MX_ROWS_MEASURED:
        return True, block, 16
    if block <= MX_ROWS_CHUNK or (block <= ONE_PASS_ELEMENTS and m <= MX_ROWS_ONE_PASS_ROWS):
        return True, block, max(4, min(32, block // 256))
    return False, MX_ROWS_CHUNK, 8


def mx_rows_reference(x2: torch.Tensor, spec: ActQuant) -> tuple[torch.Tensor, torch.Tensor]:
    """``triton_quantize_mx_rows`` in torch, from the reference quantizer's own codes and scales."""
    from ..formats.activation import finite_amax, quantize_activation
    from ..formats.quantize import round_scale
    why = mx_rows_reason(spec)
    if why:
        raise ValueError(why)
    q = quantize_activation(x2, spec)
    k = x2.shape[-1]
    bad = q.scales.eq(255).any(-1)
    ideal = finite_amax(x2.detach().double(), -1) / 6.0
    e_row, _ = round_scale(torch.where(ideal > 0, ideal, torch.ones_like(ideal)), spec.scale_dtype)
    r = e_row.long() - 127 - 6
    e = (q.scales.long() - 127).repeat_interleave(32, dim=-1)[..., :k]
    v = torch.ldexp(q.values().double(), e - r[:, None])  # bad groups: zero codes stay zero
    codes = v.float().to(torch.float8_e4m3fn).view(torch.uint8)
    scales = torch.ldexp(torch.ones_like(r, dtype=torch.float64), r).float()
    scales = torch.where(bad, torch.full_like(scales, float("nan")), scales)
    return codes, scales[:, None]


def quantize_activation_values(x2: torch.Tensor, spec: ActQuant, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> (its dynamic e4m3 / int8 codes as ``dtype`` values [M, K], fp32 scales [M, groups]; one
    group for per-token scales): the codes ``triton_quantize_activation`` makes (the same kernel), stored as
    16-bit floats for the MMA kernels that multiply them in fp16 / bf16 (exact: e4m3 and int8 are subsets of
    both)."""
    if str(spec.dtype) not in ("e4m3fn", "int8") or str(spec.scale_dtype) != "fp32" or not spec.per_token \
            or spec.static or spec.global_scale:
        raise ValueError(f"code values are made for dynamic per-token or per-group e4m3 / int8 activations with "
                         f"fp32 scales, not {spec}")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"code values are fp16 / bf16, not {dtype}")
    m, k = x2.shape
    check_act_group(spec, k)
    g = spec.group_k or k
    values = torch.empty(m, k, dtype=dtype, device=x2.device)
    scales = torch.empty(m, k // g, dtype=torch.float32, device=x2.device)
    launch_act_quant(x2, spec, values, scales)
    return values, scales


ONE_PASS_ELEMENTS = 16384  # the most of one row an fp32-quantizer program holds in registers (16 warps, 32 each)
TWO_PASS_BLOCK = 4096  # the chunk of a longer row (walked twice: amax, then codes)
GROUP_TILE = 1024  # elements per program for per-group scales: several groups at once (8 of 128)
F32_COMPARE = False  # the quantizer's rounding decided in fp32 instead of float64 (exact either way; untimed)
# e4m3 codes by the hardware conversion of the near-exact quotient, the exact comparison only for tiles near a
# midpoint (``_act_quant._codes_out``; same bytes).  None (default): where the H200 timed it faster (session 30,
# scripts/act_quant_probe.py, same run): the MXFP4 e4m3 rows at every M (M = 4096 x 8192 77.5 -> 68.3 µs, M = 1
# 6.9 -> 6.7), per-token codes from CVT_E4M3_MIN_ROWS rows on (4096 x 8192 75.0 -> 71.7; MoE rows 32768 x 2048
# 128.3 -> 121.3, x 768 72.8 -> 68.6) -- not below (M = 16 7.5 -> 8.2, M = 256 10.3 -> 11.6: one program per row,
# where the longer dependent chain costs more than the fewer instructions save); per-token scales only (the
# per-group fp8 rows were not faster: w8a8-fp8-block M = 4096 535 -> 557 µs in the act suite); SM 9.0 only.
# HT_CVT_E4M3=1 / 0 forces it on / off everywhere (sm_89+ for on).  2 (opt-in, untimed): per-token and per-group
# codes by ``_act_quant._e4m3_exact_magnitude`` -- an element near a midpoint fixed where it is, no tile-wide
# fallback (static SASS at K = 2048, 4 warps: see ANALYSIS session 30); the MXFP4 rows as with 1.
CVT_E4M3 = {"1": True, "0": False, "2": 2}.get(os.environ.get("HT_CVT_E4M3", ""))
CVT_E4M3_MIN_ROWS = 4096
# On (measured on the H200, session 28: scripts/act_quant_probe.py, same bytes): the block quantizer's
# multi-group tiles (NVFP4 at 4096 x 8192 113.5 µs, a program per group 2110), the e4m3 per-token quantizer at
# 16 elements per thread (74.2 µs vs 79.4), dequant_mm's one-launch dequantized activations, and the bf16 code
# values of cutlass_grouped_mx_a8.  HT_FAST_ACT_QUANT=0 restores the older launches (to compare, or to bisect).
FAST_ACT_QUANT = os.environ.get("HT_FAST_ACT_QUANT", "1") != "0"


def cvt_e4m3(x2: torch.Tensor, quantizer: str = "token") -> bool | int:
    """The CVT_E4M3 constexpr of an e4m3 quantizer of ``x2`` (``CVT_E4M3``'s rule): ``quantizer`` "token" (per-token
    scales: on from CVT_E4M3_MIN_ROWS rows), "group" (per-group scales: off), "mx_rows" (the MXFP4 e4m3 rows: on at
    every M); CVT_E4M3 set forces its value on every one."""
    if CVT_E4M3 is not None:
        return CVT_E4M3
    if quantizer == "group" or not x2.is_cuda or (quantizer == "token" and x2.shape[0] < CVT_E4M3_MIN_ROWS):
        return False
    from ..capability import device_facts
    return device_facts(x2.device).sm == (9, 0)


def launch_act_quant(x2: torch.Tensor, spec: ActQuant, codes: torch.Tensor, scales: torch.Tensor,
                     gscale: torch.Tensor | None = None, scale_values: bool = False, values: int = 0) -> None:
    """Quantize x [M, K] into ``codes`` (bytes, or 16-bit code values) and ``scales`` (any strides): fp32 scales
    (e4m3 / int8) through ``act_quant_f32_kernel``, block-scaled formats through ``act_quant_kernel`` (``values``
    1 / 2: dequantized values into ``codes`` instead, ``_act_quant._stored_codes``)."""
    m, k = x2.shape
    if not m:
        return
    g = spec.group_k or k
    groups = -(-k // g)
    if str(spec.scale_dtype) == "fp32":
        block = triton.next_power_of_2(g)
        if TOKEN_ROWS_PERSISTENT and g == k and block <= ONE_PASS_ELEMENTS:
            _launch_token_rows(x2, spec, codes, scales, block)
            return
        per_prog = 1 if block > GROUP_TILE else min(GROUP_TILE // block, triton.next_power_of_2(groups))
        if block > ONE_PASS_ELEMENTS:
            block = TWO_PASS_BLOCK
        act_quant_f32_kernel[(m, triton.cdiv(groups, per_prog))](
            x2, codes, scales, k, x2.stride(0), codes.stride(0), scales.stride(0), scales.stride(1),
            INT8=str(spec.dtype) == "int8", GROUP_K=g, GROUPS=per_prog, BLOCK_K=block,
            CODE_VALUES=codes.dtype != torch.uint8, F32_COMPARE=F32_COMPARE,
            CVT_E4M3=cvt_e4m3(x2, "token" if g == k else "group"),
            # FAST_ACT_QUANT: 16 elements per thread, not 32 (61 registers, not 128, at K = 8192: 2 programs per SM)
            num_warps=min(16, max(4, block * per_prog // (512 if FAST_ACT_QUANT else 1024))))
        return
    block = min(1024, triton.next_power_of_2(g))
    # small power-of-two groups: several per program (a [per_prog, g] tile), as many as GROUP_TILE elements
    per_prog = min(GROUP_TILE // g, triton.next_power_of_2(groups)) \
        if FAST_ACT_QUANT and block == g and k % g == 0 else 1
    act_quant_kernel[(m, triton.cdiv(groups, per_prog))](
        x2, codes, scales, gscale if gscale is not None else scales, k, x2.stride(0), codes.stride(0),
        scales.stride(0), scales.stride(1), KIND=ACT_KINDS[str(spec.dtype)],
        SCALE_KIND=ACT_SCALE_KINDS[str(spec.scale_dtype)], GROUP_K=g, BLOCK_K=block,
        SCALE_VALUES=scale_values, GROUPS=per_prog, VALUES=values)


TOKEN_ROWS_PERSISTENT = os.environ.get("HT_TOKEN_ROWS_PERSISTENT") == "1"  # untimed: opt-in until the probe times it
TOKEN_ROWS_THREADS_PER_SM = 704  # the persistent quantizer's programs per SM: as many as ~90 registers let fit


def _launch_token_rows(x2: torch.Tensor, spec: ActQuant, codes: torch.Tensor, scales: torch.Tensor,
                       block: int, programs: int | None = None, num_warps: int | None = None) -> None:
    """Per-token e4m3 / int8 codes through ``act_quant_token_rows_kernel`` (persistent, next row prefetched):
    ``programs`` (default: as many per SM as TOKEN_ROWS_THREADS_PER_SM threads, at most M) and ``num_warps``
    (default: 16 elements of the row per thread, 4-16 warps; 83 registers at K = 8192, 16 warps, ptxas sm_90)
    -- the probe's knobs."""
    m, k = x2.shape
    warps = num_warps or min(16, max(4, block // 512))
    if programs is None:
        sms = torch.cuda.get_device_properties(x2.device).multi_processor_count if x2.is_cuda else 4
        programs = sms * max(1, TOKEN_ROWS_THREADS_PER_SM // (32 * warps))
    act_quant_token_rows_kernel[(max(1, min(m, programs)),)](
        x2, codes, scales, m, k, x2.stride(0), codes.stride(0), scales.stride(0), INT8=str(spec.dtype) == "int8",
        BLOCK_K=block, CODE_VALUES=codes.dtype != torch.uint8, F32_COMPARE=F32_COMPARE, CVT_E4M3=cvt_e4m3(x2),
        num_warps=warps)


def block_scaled_act(spec: ActQuant | None) -> bool:
    """Whether ``spec`` is a block-scaled activation format (e8m0 / e4m3 scale codes: MX, NV), the formats
    ``act_quant_kernel`` writes."""
    return spec is not None and str(spec.scale_dtype) in ("e8m0", "e4m3fn")


def _block_act_values(x2: torch.Tensor, spec: ActQuant, input_scale: torch.Tensor | None, dtype: torch.dtype,
                      mode: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values in ``dtype`` [M, K] that ``act_quant_kernel`` writes in VALUES ``mode``, the global scale or None)."""
    m, k = x2.shape
    g = spec.group_k or k
    check_act_group(spec, k)
    out = torch.empty(m, k, dtype=dtype, device=x2.device)
    scales = torch.empty(m, -(-k // g), dtype=torch.uint8, device=x2.device)
    gscale = triton_global_scale(x2, spec) if spec.global_scale and input_scale is None else \
        global_act_scale(x2, spec, input_scale)
    launch_act_quant(x2, spec, out, scales, gscale, values=mode)
    return out, gscale


def triton_dequantize_activation(x2: torch.Tensor, spec: ActQuant, input_scale: torch.Tensor | None,
                                 dtype: torch.dtype) -> torch.Tensor:
    """``dequantize_activation(quantize_activation(x))`` rounded to ``dtype``, bit for bit, in one quantizer launch
    (plus NV's global-scale reduction) for block-scaled activations: each value is code x block scale (x global)
    in fp32, as the torch composition multiplies, without its four fp32 [M, K] temporaries."""
    return _block_act_values(x2, spec, input_scale, dtype, 2)[0]


def block_act_values(x2: torch.Tensor, spec: ActQuant, dtype: torch.dtype,
                     input_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """NV / MX activations as (code x block scale values in ``dtype`` [M, K], fp32 row scales [M]: the global
    scale, 1 without one): exact, e2m1 x e4m3 has at most 6 significant bits, e2m1 x 2**e one -- for a GEMM on
    16-bit values with a scale per row (the decode kernel).  The products are the reference's."""
    out, gscale = _block_act_values(x2, spec, input_scale, dtype, 1)
    m = x2.shape[0]
    rows = gscale.reshape(1).expand(m) if gscale is not None else torch.ones(1, device=x2.device).expand(m)
    return out, rows.contiguous()


GLOBAL_SCALE_BLOCK = 4096


def triton_global_scale(x2: torch.Tensor, spec: ActQuant) -> torch.Tensor:
    """``formats.activation.global_act_scale`` (dynamic) in two launches -- a zeroed counter and one reduction --
    where the torch composition took eight (abs, isfinite, where, amax, then four scalar ops)."""
    from ..formats.activation import positive_qmax
    m, k = x2.shape
    out = torch.empty((), dtype=torch.float32, device=x2.device)
    if m * k == 0:
        return out.fill_(1e-30)
    ws = torch.zeros(2, dtype=torch.int32, device=x2.device)
    denom = float(positive_qmax(spec.dtype) * spec.scale_dtype.finite_max())
    global_scale_kernel[(triton.cdiv(m * k, GLOBAL_SCALE_BLOCK),)](x2, m, k, x2.stride(0), ws, out, denom,
                                                                   BLOCK=GLOBAL_SCALE_BLOCK)
    return out


def _alignment(t: torch.Tensor | None) -> int:
    return -1 if t is None else t.data_ptr() % 16


def triton_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None, config: KernelConfig | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """``out`` (optional, ``[M, N]`` contiguous) receives the result; ``config`` (family + tiles) is what
    dispatch chose -- without one, the built-in heuristic's.

    The launch for a call signature is built once per QuantWeight (the Triton backend's ``qw.cache`` slot) and
    replayed: the key holds everything the compiled kernel was specialised on -- M, dtypes, strides, each
    pointer's 16-byte alignment."""
    n, k = qw.N, qw.K
    out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    bias = qw.bias if bias is None else bias
    launch = _launch_for(x2, qw, bias, out_dtype, config, out)
    if isinstance(launch, tuple):
        fam, cfg = launch
        y = fam.run(x, x2, qw, bias, out_dtype, cfg, out)
        return y.reshape(*x.shape[:-1], n)
    y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=x.device)
    if m:
        ws, cnt = split_buffers(launch.split, m, n, launch.tiles, x.device)
        launch(x2, y, bias if bias is not None else y, ws, cnt)
    return y.reshape(*x.shape[:-1], n)


def _launch_for(x2: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None, out_dtype: torch.dtype,
                config: KernelConfig | None, out: torch.Tensor | None):
    """The cached launch of this call signature: a ``Launch`` (one spec-planned Triton kernel), or the
    ``(family, config)`` of a multi-step family."""
    key = (x2.shape[0], x2.dtype, out_dtype, x2.device, x2.stride(0), _alignment(x2), _alignment(bias),
           None if bias is None else bias.dtype, None if out is None else (out.stride(0), _alignment(out)), config,
           qw.data.data_ptr(), qw.scales.data_ptr(), None if qw.zeros is None else qw.zeros.data_ptr(),
           None if qw.global_scale is None else qw.global_scale.data_ptr())
    launches = backend_cache(qw).setdefault("launches", {})
    launch = launches.get(key)
    if launch is None:
        call = call_of(x2, qw)
        cfg = config or default_config(call, device_facts(x2.device)[1])
        fam = families.get(cfg.family)
        # multi-step families (quantized activations, dequantize + cuBLAS): their family is what gets cached
        launch = _plan(x2, qw, bias, call, fam, cfg, out.stride(0) if out is not None else qw.N) or (fam, cfg)
        if len(launches) >= 64:  # bounded: a server sees a handful of M values per weight
            launches.clear()
        launches[key] = launch
    return launch


def linear_runner(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None, out_dtype: torch.dtype | None,
                  config: KernelConfig | None):
    """The plan (``humming_triton.plans``) of a ``triton_linear`` call: the same launch, bound to this signature
    -- a contiguous ``x`` of this shape, its data at this 16-byte alignment (what the kernel was specialised
    on); any other ``x`` gets None back (the full path).  None: no plan (empty or strided x)."""
    n, k = qw.N, qw.K
    if not x.is_contiguous() or x.dim() < 1 or x.numel() == 0:
        return None
    out_dtype = out_dtype or x.dtype
    x2 = x.reshape(-1, k)
    m, wbias, dev, align = x2.shape[0], qw.bias, x.device, x.data_ptr() % 16
    shape = (*x.shape[:-1], n)
    launch = _launch_for(x2, qw, bias if bias is not None else wbias, out_dtype, config, None)
    if isinstance(launch, tuple):
        fam, cfg = launch
        lean = fam.runner(x2, qw, bias if bias is not None else wbias, out_dtype, cfg, shape)
        if lean is not None:
            if wbias is None:
                return lean
            return lambda x, bias: lean(x, bias if bias is not None else wbias)

        def run_family(x, bias):
            b = bias if bias is not None else wbias
            return fam.run(x, x.reshape(m, k), qw, b, out_dtype, cfg, None).reshape(shape)
        return run_family
    split, tiles = launch.split, launch.tiles

    def run(x, bias):
        if x.data_ptr() % 16 != align or not x.is_contiguous():
            return None
        b = bias if bias is not None else wbias
        y = torch.empty(shape, dtype=out_dtype, device=dev)
        ws, cnt = split_buffers(split, m, n, tiles, dev)
        launch(x, y, b if b is not None else y, ws, cnt)
        return y
    return run


def split_buffers(split: int, m: int, n: int, tiles: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K's per-call state (store_output): an uninitialised fp32 workspace of SPLIT_K partial planes and a
    zeroed counter per output tile -- fresh each call, so concurrent streams never share them."""
    if split == 1:  # placeholders the kernel never reads: made once per device (not a fill kernel per call)
        bufs = _NO_SPLIT.get(device)
        if bufs is None:
            bufs = _NO_SPLIT[device] = (torch.empty(1, device=device), torch.empty(1, dtype=torch.int32,
                                                                                device=device))
        return bufs
    return (torch.empty(split * m * n, dtype=torch.float32, device=device),
            torch.zeros(tiles, dtype=torch.int32, device=device))


_NO_SPLIT: dict = {}


def default_config(call: Call, num_sms: int = configs.NUM_SMS_DEFAULT) -> KernelConfig:
    """The built-in choice for a call that arrives without a config (dispatch passes the measured one)."""
    s = call.scheme
    if s.act is not None:
        return act_config(call.m, call.n, call.k, s, num_sms)
    return configs.choose(call.m, call.n, call.k, s.bits, s.group_k(call.k), num_sms, s.zero != "none")


def _significant_bits(t) -> int:
    """Bits of precision a value of element/scale type ``t`` can need (implicit bit included)."""
    if isinstance(t, WideFloat):
        return {"fp32": 24, "fp16": 11, "bf16": 8}[t.name]
    if isinstance(t, FloatType):
        return 1 if t.special == "e8m0" else t.man + 1
    return t.bits  # integer codes (a zero point can add the sign)


def _weight_exact_bf16(scheme: QuantScheme) -> bool:
    return _significant_bits(scheme.weight) + _significant_bits(scheme.scale.dtype) <= 8 and scheme.zero == "none"


def act_config(m: int, n: int, k: int, scheme: QuantScheme, num_sms: int = configs.NUM_SMS_DEFAULT
               ) -> configs.DenseConfig:
    """The launch config of an activation-quantized scheme (configs.fp8_config with the scheme's facts)."""
    return configs.fp8_config(m, n, k, scheme.scale.block_k, scheme.act.group_k, num_sms, str(scheme.act.dtype),
                              _weight_exact_bf16(scheme))


def act_block_k(bk: int, scheme: QuantScheme, k: int) -> int:
    """configs.act_block_k with the scheme's facts; a clear error where no K tile fits."""
    out = configs.act_block_k(bk, k, scheme.scale.block_k, scheme.act.group_k, str(scheme.act.dtype),
                              _weight_exact_bf16(scheme))
    if out is None:
        raise ValueError(f"no K tile fits both the weight groups ({scheme.scale.block_k}) and the activation groups "
                         f"({scheme.act.group_k}) of {scheme.name}")
    return out


def _plan(x2: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None, call: Call, fam, cfg: KernelConfig,
          out_stride: int) -> Launch | None:
    """The single launch of a spec-planned family for this call signature; None for the multi-step ones."""
    cfg = fitted(cfg, call)
    fmt = launch_format(weight_format(qw), call.k, cfg.block_k)
    spec = fam.spec(fmt, call, cfg, bias is not None)
    if spec is None:
        return None
    (w, s, z, g), strides = weight_args(qw)
    tensors = dict(x_ptr=None, y_ptr=None, b_ptr=None, ws_ptr=None, cnt_ptr=None, w_ptr=w, s_ptr=s, z_ptr=z, g_ptr=g,
                   M=call.m, N=call.n, K=call.k, stride_xm=x2.stride(0), stride_ym=out_stride, **strides)
    if "xs_ptr" in spec.kernel.arg_names:
        tensors["xs_ptr"] = w  # the tiled kernel's activation-scale pointer: unused with 16-bit activations
    return Launch(spec, tensors)


def fitted(cfg: KernelConfig, call: Call) -> KernelConfig:
    """The config with its K tile fitted to the weight's scale groups and packed words."""
    s = call.scheme
    bk = configs.fit_block_k(cfg.block_k, s.group_k(call.k), call.k, s.bits)
    if s.act is not None and cfg.family == "act_tiled":
        bk = act_block_k(bk, s, call.k)
    return cfg if bk == cfg.block_k else replace(cfg, block_k=bk)


def act_constexprs(fmt: dict, call: Call, cfg: KernelConfig, has_bias: bool) -> dict:
    """The tiled kernel's constexprs for a quantized-activation scheme (the launcher and kernels.inspect)."""
    act = call.scheme.act
    kind = act_kind(act, cfg.block_m)
    fmt = launch_format(fmt, call.k, cfg.block_k)
    post = post_scale(fmt, cfg.block_k)
    kind = int_decode_kind(kind, fmt, post, call.k, act)
    if not post and kind in SCALED_KINDS:
        raise ValueError(f"the quantized-activation path needs BLOCK_K ({cfg.block_k}) to divide the "
                         f"weight group ({fmt['GROUP_K']}) of {call.scheme.name}")
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
                EVEN_K=call.k % cfg.block_k == 0, HAS_BIAS=has_bias, GROUP_M=cfg.group_m,
                POST_SCALE=post, DOT_F32=interpreting(), ACT_KIND=kind, ACT_GROUP_K=act.group_k or PER_TOKEN,
                **{**fmt, "HAS_GLOBAL": fmt["HAS_GLOBAL"] or act.global_scale})


def dequant_linear(x: torch.Tensor, x2: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None,
                   out_dtype: torch.dtype, cfg: KernelConfig, out: torch.Tensor | None) -> torch.Tensor:
    """Dequantize the weight once per call (Triton), then cuBLAS; a quantized-activation scheme quantizes x as
    it says first and runs its dequantized values in x's dtype."""
    if FAST_ACT_QUANT and block_scaled_act(qw.scheme.act):  # one launch, the torch composition's bits
        x2 = triton_dequantize_activation(x2, qw.scheme.act, qw.input_scale, x2.dtype)
    elif qw.scheme.act is not None:
        check_act_group(qw.scheme.act, qw.K)
        q = triton_quantize_activation(x2, qw.scheme.act, qw.input_scale)
        x2 = dequantize_activation(q).to(x2.dtype)
    w = triton_dequantize(qw, x2.dtype, cfg.block_n, cfg.block_k)
    y = torch.nn.functional.linear(x2, w, None if bias is None else bias.to(x2.dtype))
    return out.copy_(y) if out is not None else y.to(out_dtype)


def act_linear(x: torch.Tensor, x2: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None,
               out_dtype: torch.dtype, cfg: KernelConfig, out: torch.Tensor | None) -> torch.Tensor:
    """The quantized-activation tile loop: fp8 / int8 tensor cores (the scales multiply partial products), or
    e2m1 activations decoded to bf16."""
    n, k = qw.N, qw.K
    m = x2.shape[0]
    act = qw.scheme.act
    check_act_group(act, k)
    cfg = fitted(cfg, call_of(x2, qw))
    consts = act_constexprs(_format(qw), call_of(x2, qw), cfg, bias is not None)
    (w, s, z, g), strides = weight_args(qw)
    split = cfg.split_k
    y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=x.device)
    q = triton_quantize_activation(x2, act, qw.input_scale, scale_values=consts["ACT_KIND"] in SCALED_KINDS)
    if q.global_scale is not None:  # NV activations: both global scales multiply the accumulator once
        g = q.global_scale * qw.global_scale if qw.global_scale is not None else q.global_scale.reshape(1)
    b = bias if bias is not None else y
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), split)
    if m:
        ws, cnt = split_buffers(split, m, n, grid[0], x.device)
        dense_tiled_kernel[grid](q.codes, w, s, z, g, b, y, q.scales, ws, cnt, M=m, N=n, K=k,
                                 stride_xm=q.codes.stride(0), stride_ym=y.stride(0), stride_xsm=q.scales.stride(0),
                                 num_warps=cfg.num_warps, num_stages=cfg.num_stages, **strides, **consts)
    return y
