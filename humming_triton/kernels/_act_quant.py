"""Dynamic activation quantization to e4m3 or int8 (per token or per group of K), the prologue of the fp8 /
int8 GEMM paths.

Matches ``formats.activation.quantize_activation`` code for code: ``s = amax / qmax`` rounded to fp32 (1 for an
all-zero group; qmax 448 for e4m3, 127 for int8), ``code = round-to-nearest-even(x / s)`` with the quotient in
float64 as the reference has it, saturating.  e4m3 rounding is done on the float64 bits (3 mantissa bits kept; a
2**-9 quantum below 2**-6) so that the final conversion to fp8 is exact everywhere -- the Triton interpreter's own
float -> fp8 conversion does not round to nearest.
"""
import triton
import triton.language as tl


@triton.jit
def round_to_e4m3(v):
    """float64 values in [-448, 448] -> the nearest e4m3fn value (ties to even), still as float64.  The quotient
    x / s stays in float64 until this rounding: in fp32 it is often rounded onto an exact e4m3 midpoint
    (fp16 inputs make short quotients), which then breaks the tie the wrong way."""
    a = tl.abs(v)
    bits = a.to(tl.int64, bitcast=True)
    lsb = (bits >> 49) & 1  # the last of the 3 mantissa bits kept (float64 has 52)
    normal = ((bits + 0xFFFFFFFFFFFF + lsb) & 0x7FFE000000000000).to(tl.float64, bitcast=True)
    # below 2**-6 the grid is uniform with step 2**-9: the 1.5 * 2**52 trick rounds to an integer, ties to even
    sub = ((a * 512.0 + 6755399441055744.0) - 6755399441055744.0) * (1.0 / 512.0)
    r = tl.where(a < 0.015625, sub, normal)
    return tl.where(v < 0, -r, r)


@triton.jit
def act_quant_kernel(x_ptr, codes_ptr, scales_ptr, K, stride_xm, stride_cm, stride_sm,
                     KIND: tl.constexpr, GROUP_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (row, group): GROUP_K columns of one row (the whole row for per-token, walked BLOCK_K at a time)."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    k_begin = g * GROUP_K
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(k_begin, tl.minimum(k_begin + GROUP_K, K), BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    a = tl.max(amax, axis=0)
    QMAX: tl.constexpr = 448.0 if KIND == 1 else 127.0
    # IEEE division (div_rn): "/" on fp32 compiles to an approximate division on the GPU; the reference rounds
    # amax / qmax to fp32 exactly
    s = tl.where(a > 0, tl.div_rn(a, QMAX), 1.0)
    tl.store(scales_ptr + row * stride_sm + g, s)
    for k0 in range(k_begin, tl.minimum(k_begin + GROUP_K, K), BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float64)
        q = x / s.to(tl.float64)  # exact enough: float64 division is IEEE on the GPU, as in the reference
        if KIND == 1:
            c = round_to_e4m3(tl.minimum(tl.maximum(q, -448.0), 448.0)).to(tl.float32)
            c = c.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        else:  # int8: 1.5 * 2**52 rounds to an integer, ties to even; saturate to [-128, 127]
            r = (q + 6755399441055744.0) - 6755399441055744.0
            c = tl.minimum(tl.maximum(r, -128.0), 127.0).to(tl.int32).to(tl.int8).to(tl.uint8, bitcast=True)
        tl.store(codes_ptr + row * stride_cm + offs, c, mask=offs < K)
