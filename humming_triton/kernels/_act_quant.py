"""Dynamic activation quantization to e4m3 (per token or per group of K), the prologue of the fp8 GEMM path.

Matches ``formats.activation.quantize_activation``: ``s = amax / 448`` in fp32 (1 for an all-zero group),
``code = round-to-nearest-even(x / s)`` on the e4m3 grid, saturating at +-448.  The rounding is done on the
fp32 bits (3 mantissa bits kept; a 2**-9 quantum below 2**-6) so that the final conversion to fp8 is exact
everywhere -- the Triton interpreter's own float -> fp8 conversion does not round to nearest.
"""
import triton
import triton.language as tl


@triton.jit
def round_to_e4m3(v):
    """fp32 values in [-448, 448] -> the nearest e4m3fn value (ties to even), still as fp32."""
    a = tl.abs(v)
    bits = a.to(tl.int32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & 0x7FF00000).to(tl.float32, bitcast=True)
    # below 2**-6 the grid is uniform with step 2**-9: the 1.5 * 2**23 trick rounds to an integer, ties to even
    sub = ((a * 512.0 + 12582912.0) - 12582912.0) * (1.0 / 512.0)
    r = tl.where(a < 0.015625, sub, normal)
    return tl.where(v < 0, -r, r)


@triton.jit
def act_quant_fp8_kernel(x_ptr, codes_ptr, scales_ptr, K, stride_xm, stride_cm, stride_sm,
                         GROUP_K: tl.constexpr, BLOCK_K: tl.constexpr):
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
    s = tl.where(a > 0, a / 448.0, 1.0)
    tl.store(scales_ptr + row * stride_sm + g, s)
    for k0 in range(k_begin, tl.minimum(k_begin + GROUP_K, K), BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
        q = round_to_e4m3(tl.minimum(tl.maximum(x / s, -448.0), 448.0))
        tl.store(codes_ptr + row * stride_cm + offs, q.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=offs < K)
