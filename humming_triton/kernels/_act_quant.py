"""Dynamic activation quantization (per token or per group of K), the prologue of the quantized-activation
GEMM paths: e4m3 or int8 codes with fp32 scales, e4m3 codes with e8m0 block scales (MXFP8), and e2m1 codes
(W4A4) with e8m0 (MX) or e4m3 + fp32 global (NV) block scales.

Matches ``formats.activation.quantize_activation`` code for code: ``s = amax / qmax`` rounded to fp32 (1 for an
all-zero group; qmax 448 for e4m3, 127 for int8), ``code = round-to-nearest-even(x / s)`` with the quotient in
float64 as the reference has it, saturating (fp32 scales: the same rounding found without a division, by an exact
float64 comparison with the midpoint -- ``act_quant_f32_kernel``).  e2m1 (qmax 6): the ideal scale amax / 6 (/ global) in float64,
rounded up to a power of two (e8m0: the exact ceil(log2), read off the float64 bits) or to the nearest e4m3
(at least its smallest subnormal); the quotient divides by that scale times the global.  e4m3 rounding is done on the float64 bits (3 mantissa bits kept; a
2**-9 quantum below 2**-6) so that the final conversion to fp8 is exact everywhere -- the Triton interpreter's own
float -> fp8 conversion does not round to nearest.

Non-finite inputs follow the reference's rule: the amax is taken over the finite values, and a group holding a
NaN or an Inf gets a NaN scale (fp32 NaN, e8m0 code 0xFF, e4m3 code 0x7F) and zero codes -- its GEMM row is NaN.
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
def e4m3_code(v):
    """The e4m3fn code of a non-negative float64 value on the e4m3 grid."""
    bits = v.to(tl.int64, bitcast=True)
    normal = ((((bits >> 52) & 2047) - 1016) << 3) | ((bits >> 49) & 7)  # biased exponent (bias 7), 3 bits
    return tl.where(v < 0.015625, v * 512.0, normal.to(tl.float64)).to(tl.int32)


@triton.jit
def round_to_e2m1(q):
    """float64 quotient -> the e2m1 code (ties to even, saturating at 6; negatives that round to 0 keep -0)."""
    a = tl.minimum(tl.abs(q), 8.0)
    big = 6755399441055744.0  # 1.5 * 2**52: adding and subtracting it rounds to an integer, ties to even
    r = tl.where(a < 2.0, ((a * 2.0 + big) - big) * 0.5,
                 tl.where(a < 4.0, (a + big) - big, ((a * 0.5 + big) - big) * 2.0))
    r = tl.minimum(r, 6.0)
    mag = tl.where(r < 2.0, r * 2.0, tl.where(r < 4.0, r + 2.0, r * 0.5 + 4.0)).to(tl.int32)
    return tl.where(q < 0, mag | 8, mag)


@triton.jit
def block_scale(a, gs, QMAX: tl.constexpr, SCALE_KIND: tl.constexpr):
    """Block amax (fp32) -> (stored scale code, effective float64 divisor, the scale's own float64 value) of an
    e2m1 (QMAX 6) or e4m3 (448) block with an e8m0 (SCALE_KIND 1) or e4m3-times-global (2) scale."""
    ideal = a.to(tl.float64) / QMAX
    if SCALE_KIND == 2:
        ideal = ideal / gs
    ideal = tl.where(ideal > 0, ideal, 1.0)
    if SCALE_KIND == 1:  # e8m0: 2**ceil(log2(ideal)), exact: the exponent, plus one if any mantissa bit is set
        bits = ideal.to(tl.int64, bitcast=True)
        e = ((bits >> 52) & 2047) - 1023 + ((bits & 4503599627370495) != 0).to(tl.int64)
        e = tl.minimum(tl.maximum(e, -127), 127)
        p2 = ((e + 1023) << 52).to(tl.float64, bitcast=True)
        return (e + 127).to(tl.int32), p2, p2
    sval = round_to_e4m3(tl.minimum(tl.maximum(ideal, 0.001953125), 448.0))  # never below the smallest subnormal
    return e4m3_code(sval), sval * gs, sval


@triton.jit
def _group_amax(x_row, k_begin, GROUP_K: tl.constexpr, K, BLOCK_K: tl.constexpr):
    """(amax over the finite values, whether any value is non-finite) of columns k_begin .. k_begin + GROUP_K of
    one row, walked BLOCK_K at a time -- the reference's rule (formats/activation.py)."""
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    nonfinite = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for k0 in range(k_begin, tl.minimum(k_begin + GROUP_K, K), BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        ax = tl.abs(tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32))
        finite = ax < float("inf")  # false for +-inf and NaN
        amax = tl.maximum(amax, tl.where(finite, ax, 0.0))
        nonfinite = tl.maximum(nonfinite, tl.where(finite, 0, 1))
    return tl.max(amax, axis=0), tl.max(nonfinite, axis=0) > 0


@triton.jit
def _block_codes(x, eff, KIND: tl.constexpr):
    """float64 values (a bad group's already zero) / their block's float64 divisor -> (e2m1 (KIND 3) or e4m3 codes
    as bytes, each code's signed value as fp32): IEEE float64 division, as the reference divides."""
    q = x / eff
    if KIND == 3:
        c = round_to_e2m1(q)
        v = e2m1_value(c).to(tl.float32)
        c = c.to(tl.uint8)
    else:
        v = round_to_e4m3(tl.minimum(tl.maximum(q, -448.0), 448.0)).to(tl.float32)
        c = v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return c, v


@triton.jit
def _stored_scale(code, eff, bad, SCALE_KIND: tl.constexpr, SCALE_VALUES: tl.constexpr):
    """A block's scale as stored: its exact fp32 value (SCALE_VALUES; NaN for a bad group), else its code byte
    (0xFF e8m0 / 0x7F e4m3 for a bad group)."""
    if SCALE_VALUES:
        out = tl.where(bad, float("nan"), eff.to(tl.float32))
    else:
        out = tl.where(bad, 255 if SCALE_KIND == 1 else 127, code).to(tl.uint8)
    return out


@triton.jit
def _stored_codes(c, v, sval, bad, gs32, out_ptr, VALUES: tl.constexpr):
    """What the codes' buffer holds: the bytes (VALUES 0); each code's value times its block scale in the 16-bit
    type of ``out_ptr`` (1: exact, e2m1 x e4m3 has at most 6 significant bits; a bad group NaN); or that product
    times the global scale, in fp32 and then rounded to ``out_ptr``'s type (2: ``dequantize_activation``'s steps
    in its order, bit for bit)."""
    if VALUES == 0:
        out = c
    else:
        y = v * tl.where(bad, float("nan"), sval.to(tl.float32))
        if VALUES == 2:
            y = y * gs32
        out = y.to(out_ptr.dtype.element_ty)
    return out


@triton.jit
def act_quant_kernel(x_ptr, codes_ptr, scales_ptr, gs_ptr, K, stride_xm, stride_cm, stride_sm, stride_sg,
                     KIND: tl.constexpr, SCALE_KIND: tl.constexpr, GROUP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                     SCALE_VALUES: tl.constexpr, GROUPS: tl.constexpr = 1, VALUES: tl.constexpr = 0):
    """Block-scaled activations (fp32 scales: ``act_quant_f32_kernel``).  KIND 1 e4m3 / 3 e2m1; SCALE_KIND 1 e8m0
    (e2m1 or e4m3 codes), 2 e4m3 times the global at gs_ptr (e2m1 codes).  SCALE_VALUES: store an e8m0 scale's
    value as fp32 instead of its code (for tile loops that multiply fp32 scales into partial products; the value
    is exact).  VALUES 1 / 2: ``codes_ptr`` gets dequantized values instead of codes (``_stored_codes``).
    GROUPS > 1 (power-of-two groups, BLOCK_K == GROUP_K, K a multiple of it): program (row, p) takes groups
    p * GROUPS .. p * GROUPS + GROUPS - 1 as one [GROUPS, GROUP_K] tile -- a program per 16- or 32-wide group left
    most of its threads idle (W4A4-NVFP4 ran 3.6 ms at 4096 x 8192 on the H100).  GROUPS == 1: program
    (row, group) walks its group BLOCK_K columns at a time."""
    row = tl.program_id(0).to(tl.int64)
    gs = 1.0
    gs32 = 1.0
    if SCALE_KIND == 2:
        gs32 = tl.load(gs_ptr).to(tl.float32)
        gs = gs32.to(tl.float64)
    QMAX: tl.constexpr = 6.0 if KIND == 3 else 448.0
    # non-finite inputs: a group holding a NaN or an Inf gets a NaN scale (e8m0 0xFF, e4m3 0x7F) and zero codes
    if GROUPS > 1:
        g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
        offs = g[:, None] * GROUP_K + tl.arange(0, GROUP_K)[None, :]
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
        ax = tl.abs(x)
        finite = ax < float("inf")  # false for +-inf and NaN
        bad = tl.max(tl.where(finite, 0, 1), axis=1) > 0
        code, eff, sval = block_scale(tl.max(tl.where(finite, ax, 0.0), axis=1), gs, QMAX, SCALE_KIND)
        tl.store(scales_ptr + row * stride_sm + g * stride_sg, _stored_scale(code, eff, bad, SCALE_KIND, SCALE_VALUES),
                 mask=g * GROUP_K < K)
        c, v = _block_codes(tl.where(bad[:, None], 0.0, x.to(tl.float64)), eff[:, None], KIND)
        tl.store(codes_ptr + row * stride_cm + offs, _stored_codes(c, v, sval[:, None], bad[:, None], gs32, codes_ptr,
                                                                   VALUES), mask=offs < K)
    else:
        gi = tl.program_id(1)
        k_begin = gi * GROUP_K
        a, bad = _group_amax(x_ptr + row * stride_xm, k_begin, GROUP_K, K, BLOCK_K)
        code, eff, sval = block_scale(a, gs, QMAX, SCALE_KIND)
        tl.store(scales_ptr + row * stride_sm + gi * stride_sg, _stored_scale(code, eff, bad, SCALE_KIND, SCALE_VALUES))
        for k0 in range(k_begin, tl.minimum(k_begin + GROUP_K, K), BLOCK_K):
            offs = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float64)
            c, v = _block_codes(tl.where(bad, 0.0, x), eff, KIND)
            tl.store(codes_ptr + row * stride_cm + offs, _stored_codes(c, v, sval, bad, gs32, codes_ptr, VALUES),
                     mask=offs < K)


@triton.jit
def e2m1_value(code):
    """The float64 value of an e2m1 code (sign bit 8; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6)."""
    m = (code & 7).to(tl.float64)
    v = tl.where(m < 4.0, m * 0.5, tl.where(m < 6.0, m - 2.0, (m - 4.0) * 2.0))
    return tl.where((code & 8) != 0, -v, v)


@triton.jit
def pow2_f64(e):
    """2**e as float64 for integer e in [-1022, 1023], exact (the exponent field written directly)."""
    return ((e.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _e8m0_exponent(a):
    """fp32 block amax (finite, >= 0) -> the unbiased e8m0 exponent ceil(log2(a / 6)) that ``block_scale`` finds
    in float64, read off a's bits with no division: a = 2**E * 1.m and 1.m / 1.5 lies in (2/3, 4/3], so
    a / 6 = 2**(E - 2) * 1.m / 1.5 rounds up to 2**(E - 1) exactly when 1.m > 1.5 (mantissa above 0x400000).
    A zero block's exponent is 0 (the reference's scale 1); below fp32's normals (a < 2**-126, a / 6 < 2**-128)
    the clamp at -127 holds."""
    bits = a.to(tl.int32, bitcast=True)
    field = (bits >> 23) & 255
    e = field - 129 + ((bits & 0x7FFFFF) > 0x400000).to(tl.int32)
    e = tl.where(field == 0, -127, tl.maximum(e, -127))
    return tl.where(a > 0, e, 0)


@triton.jit
def _pow2_f32(e):
    """2**e as fp32 for integer e in [-126, 127], exact (the exponent field written directly)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_round_f32(q):
    """|q| (fp32, the quotient by an e8m0 scale, exact) -> the nearest e2m1 magnitude as fp32 (ties to even,
    saturating at 6): step 0.5 below 2, 1 below 4, 2 above -- ``round_to_e2m1``'s grid, in fp32 (each product
    by a power of two is exact; adding 1.5 * 2**23 rounds to an integer, ties to even)."""
    a = tl.minimum(tl.abs(q), 8.0)
    big = 12582912.0
    r = tl.where(a < 2.0, ((a * 2.0 + big) - big) * 0.5,
                 tl.where(a < 4.0, (a + big) - big, ((a * 0.5 + big) - big) * 2.0))
    return tl.minimum(r, 6.0)


@triton.jit
def _e4m3_byte_f32(v):
    """A non-negative fp32 value <= 448 -> (its nearest e4m3fn value, ties to even, as fp32; its code): 3 mantissa
    bits kept above 2**-6, a 2**-9 quantum below (``round_to_e4m3`` / ``e4m3_code`` in fp32 bit operations)."""
    bits = v.to(tl.int32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & 0x7FF00000).to(tl.float32, bitcast=True)
    big = 12582912.0
    k = (v * 512.0 + big) - big  # the subnormal grid's integer multiple, ties to even
    sub = v < 0.015625
    r = tl.where(sub, k * (1.0 / 512.0), normal)
    rb = r.to(tl.int32, bitcast=True)
    code = tl.where(r < 0.015625, k.to(tl.int32), ((((rb >> 23) & 255) - 120) << 3) | ((rb >> 20) & 7))
    return r, code


@triton.jit
def _e4m3_signed_byte(mag, neg):
    """The e4m3 byte of magnitude ``mag`` (fp32 >= 0; rounded ties-to-even, saturated by cvt.rn.satfinite) with
    the sign bit where ``neg``: the sign as a bit, not through ``-x`` (Triton 3.6 compiles it to 0 - x, which is
    +0 for x = +0 where the reference writes -0)."""
    return mag.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True) | \
        tl.where(neg, 128, 0).to(tl.uint8)


@triton.jit
def act_quant_mx_rows_kernel(x_ptr, codes_ptr, rs_ptr, K, stride_xm, stride_cm, BLOCK_K: tl.constexpr,
                             ONE_PASS: tl.constexpr, CODE_VALUES: tl.constexpr = False,
                             CVT_E4M3: tl.constexpr = False):
    """MXFP4 activations (e2m1 codes, an e8m0 scale per 32 of K: the reference's quantization, code for code)
    written as e4m3 codes with one fp32 power-of-two scale per row, for fp8 GEMMs with row-wise scales.

    Row scale 2**r with r = e_row - 6, e_row the largest block exponent of the row (that of its finite amax: the
    block exponent grows with the block amax).  Each value code * 2**e is stored as code * 2**(e - r): exact on
    e4m3's grid for e - r in [-8, 6] (6 * 2**6 = 384 <= 448; 0.5 * 2**-8 is e4m3's smallest subnormal), i.e. for
    blocks within 14 binades of the row's largest.  A block further below is rounded to nearest on that grid:
    each of its values moves by at most 2**-10 * 2**r = 2**-16 * 2**e_row, below 2**-18 of the row's largest
    value.  Non-finite inputs: the row scale is NaN (the reference gives that group a NaN scale, so the GEMM row
    is NaN) and the group's codes are zero.  CODE_VALUES: store each code's value in the 16-bit float type of
    ``codes_ptr`` (exact: e4m3 is a subset of fp16 and of bf16), for the decode kernel on code values.

    All in fp32 and int32 with no division (the float64 version ran 15 µs for one row of 8192 and 175 µs for
    4096 rows on the H100): the block exponent is read off the amax's bits (``_e8m0_exponent``), x * 2**-e is
    exact, and every rounding is an fp32 add of 1.5 * 2**23 or a mask of the bits.  One program per row;
    ONE_PASS (BLOCK_K >= K): the row read once into registers, else two passes over BLOCK_K-wide chunks."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    GROUPS: tl.constexpr = BLOCK_K // 32
    offs = tl.arange(0, GROUPS)[:, None] * 32 + tl.arange(0, 32)[None, :]
    if ONE_PASS:  # the row in registers: one read of x
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        ax = tl.abs(x)
        finite = ax < float("inf")  # false for +-inf and NaN
        amax = tl.max(tl.where(finite, ax, 0.0), axis=1)
        any_bad = tl.max(tl.max(tl.where(finite, 0, 1), axis=1), axis=0) > 0
        row_amax = tl.max(amax, axis=0)
    else:  # the whole row as one "group" of the block quantizer's amax walk
        row_amax, any_bad = _group_amax(x_row, 0, 1 << 30, K, BLOCK_K)
    r = _e8m0_exponent(row_amax) - 6
    # r is in [-133, 120]: 2**r as float64 bits then fp32 (2**-133 is an fp32 subnormal, exact)
    tl.store(rs_ptr + row, tl.where(any_bad, float("nan"), pow2_f64(r).to(tl.float32)))
    for k0 in range(0, K, BLOCK_K):
        if not ONE_PASS:
            x = tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
            ax = tl.abs(x)
            finite = ax < float("inf")
            amax = tl.max(tl.where(finite, ax, 0.0), axis=1)
        bad = tl.max(tl.where(finite, 0, 1), axis=1) > 0
        e = _e8m0_exponent(amax)  # in [-127, 126]: a finite amax is below 2**128
        q = tl.where(bad[:, None], 0.0, ax) * _pow2_f32(-e)[:, None]  # exact: a power of two, no overflow (q <= 6)
        mag = _e2m1_round_f32(q)
        # values more than 12 binades below the row scale round to 0 on e4m3's grid (6 * 2**-13 < 2**-10)
        exact = mag * _pow2_f32(tl.maximum(e - r, -13))[:, None]
        neg = (x < 0) & ~bad[:, None]  # a non-finite group's codes are +0
        if CVT_E4M3 and not CODE_VALUES:  # the hardware's ties-to-even conversion of an exact value: the same code
            out = _e4m3_signed_byte(exact, neg)
        else:
            v, code = _e4m3_byte_f32(exact)
            if CODE_VALUES:
                out = tl.where(neg, -v, v).to(codes_ptr.dtype.element_ty)  # exact: e4m3 values are bf16 / fp16 values
            else:
                out = (code | tl.where(neg, 128, 0)).to(tl.uint8)
        tl.store(codes_ptr + row * stride_cm + k0 + offs, out, mask=k0 + offs < K)


@triton.jit
def _rescaled(x, s):
    """(|x| * f, s * f): f = 2^64 where the group's scale is below 2^-60, else 1 -- exact, and afterwards neither
    1 / s nor any product of the rounding below overflows or underflows."""
    f = tl.where(s < 8.673617379884035e-19, 1.8446744073709552e19, 1.0)  # 2^-60 -> 2^64
    return tl.abs(x) * f, s * f


@triton.jit
def _fp32_codes(x, s, INT8: tl.constexpr, F32_COMPARE: tl.constexpr = False):
    """x / s (fp32 x, fp32 scales > 0, per group: [GROUPS, 1] or a scalar) -> e4m3 (or int8) code *values* as
    fp32: the reference's round-to-nearest-even of the exact quotient, saturating at 448 (int8: [-128, 127]),
    with one division per group.  A group whose scale is below 2^-60 is scaled up by 2^64 first (exact: x and s
    alike) so that neither 1 / s nor any product below overflows or underflows.

    ``|x| * (1 / s)`` is within 2^-21 of |x / s|: close enough to find the grid point ``lo`` below the quotient (or
    the one just above it, which rounds the same way) and the midpoint ``mid`` to the next one.  Which side of
    ``mid`` the exact quotient lies on is ``|x|`` against ``mid * s`` -- exact in float64 (5 (int8: 9) x 24 bits)
    -- so ties go to even and no rounding error can move a code.

    F32_COMPARE (opt-in, untimed): the same comparison in fp32, exactly: s = s_hi + s_lo with 12 significant bits
    each, so mid * s_hi and mid * s_lo are exact (<= 21 bits), |x| - mid * s_hi is exact (Sterbenz: the two are
    within a factor 2), and that difference is compared with mid * s_lo -- five full-rate fp32 instructions for
    two fp32 -> fp64 conversions (16 per SM per clock on Hopper), a DMUL and two DSETPs."""
    ax, s = _rescaled(x, s)
    q = ax * tl.div_rn(1.0, s)
    if INT8:
        lo = tl.floor(tl.minimum(q, 128.0))
        mid = lo + 0.5
        up = lo + 1.0
        odd = (lo.to(tl.int32) & 1) != 0
    else:
        qc = tl.minimum(q, 448.0)
        bits = qc.to(tl.int32, bitcast=True) & 0x7FF00000  # the e4m3 grid point below: 3 mantissa bits kept
        sub = qc < 0.015625  # below 2**-6 the grid is uniform with step 2**-9
        k = tl.floor(qc * 512.0)
        lo = tl.where(sub, k * (1.0 / 512.0), bits.to(tl.float32, bitcast=True))
        mid = tl.where(sub, (k + 0.5) * (1.0 / 512.0), (bits | 0x80000).to(tl.float32, bitcast=True))
        up = tl.where(sub, (k + 1.0) * (1.0 / 512.0), (bits + 0x100000).to(tl.float32, bitcast=True))
        odd = tl.where(sub, (k.to(tl.int32) & 1) != 0, (bits & 0x100000) != 0)
    if F32_COMPARE:
        s_hi = (s.to(tl.int32, bitcast=True) & -4096).to(tl.float32, bitcast=True)  # 12 significant bits kept
        s_lo = s - s_hi
        d = ax - mid * s_hi
        e = mid * s_lo
        r = tl.where((d > e) | ((d == e) & odd), up, lo)
    else:
        edge = mid.to(tl.float64) * s.to(tl.float64)
        axd = ax.to(tl.float64)
        r = tl.where((axd > edge) | ((axd == edge) & odd), up, lo)
    if INT8:
        v = tl.minimum(tl.maximum(tl.where(x < 0, -r, r), -128.0), 127.0)
    else:
        r = tl.minimum(r, 448.0)
        v = tl.where(x < 0, r * -1.0, r)  # not -r: Triton 3.6 compiles it to 0 - r, +0 where the reference has -0
    return v


@triton.jit
def _stored(v, codes_ptr, INT8: tl.constexpr, CODE_VALUES: tl.constexpr):
    """Code values (fp32) as stored: the value in the 16-bit type of ``codes_ptr`` (CODE_VALUES), else the byte."""
    if CODE_VALUES:  # one return statement: Triton 3.6 rejects returns under an if
        c = v.to(codes_ptr.dtype.element_ty)
    elif INT8:
        c = v.to(tl.int32).to(tl.int8).to(tl.uint8, bitcast=True)
    else:
        c = v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return c


@triton.jit
def _e4m3_near_quotient(x, s):
    """x / s (fp32, scales > 0) to within 2 fp32 ulps, and whether it lies within 8 ulps of an
    e4m3 rounding midpoint -- the only place where rounding it instead of the exact quotient can pick another code.
    |q - x / s| < 2 ulps: 1 / s and the product are each rounded once.  The midpoints of e4m3's grid are the fp32
    values whose low 20 mantissa bits are 0x80000 (3 mantissa bits kept, the next one set); below 2^-6 the grid
    is uniform with step 2^-9, and adding 2^-6 maps it onto the binade [2^-6, 2^-5), where the step is 2^-9 too
    (the sum's rounding adds half an ulp)."""
    f = tl.where(s < 8.673617379884035e-19, 1.8446744073709552e19, 1.0)  # 2^-60 -> 2^64, as _rescaled
    q = (x * f) * tl.div_rn(1.0, s * f)  # |q| may pass 448 (s rounded down, a subnormal s): the conversion saturates
    aq = tl.abs(q)
    low = (aq + tl.where(aq < 0.015625, 0.015625, 0.0)).to(tl.int32, bitcast=True) & 0xFFFFF
    return q, (low - 0x7FFF8).to(tl.uint32, bitcast=True) <= 16  # |low - 0x80000| <= 8


@triton.jit
def _e4m3_exact_magnitude(x, s):
    """|x / s| (fp32, scales > 0) as a value whose round-to-nearest-even conversion to e4m3 is the exact
    quotient's code: the near-exact quotient (``_e4m3_near_quotient``), except that an element within 8 ulps of a
    midpoint is moved to the midpoint itself or one fp32 ulp to the side the exact quotient lies on.  That side
    is |x| against mid * s, exact in fp32 (``_fp32_codes``' F32_COMPARE: s = s_hi + s_lo with 12 significant bits
    each; a midpoint has at most 5, so mid * s_hi and mid * s_lo are exact, and |x| - mid * s_hi is exact because
    the two are within a factor 2 where the element is near).  Per element, no branch and no reduction over the
    tile: the tile-wide fallback's reduction and its second rounding pass cost the one-row launches (M = 16 / 256)
    more than the conversion saved (session 30)."""
    ax, s = _rescaled(x, s)
    aq = ax * tl.div_rn(1.0, s)
    shift = tl.where(aq < 0.015625, 0.015625, 0.0)  # the subnormal grid mapped onto [2^-6, 2^-5), as there
    t = (aq + shift).to(tl.int32, bitcast=True)
    near = ((t & 0xFFFFF) - 0x7FFF8).to(tl.uint32, bitcast=True) <= 16  # as _e4m3_near_quotient (inline: fewer
    # instructions than its signed quotient, 736 against 768 static SASS at K = 2048)
    mid = ((t & -1048576) | 0x80000).to(tl.float32, bitcast=True) - shift  # exact: the same binade's midpoint
    s_hi = (s.to(tl.int32, bitcast=True) & -4096).to(tl.float32, bitcast=True)
    d = ax - mid * s_hi
    e = mid * (s - s_hi)
    m = mid.to(tl.int32, bitcast=True)
    side = tl.where(d > e, m + 1, tl.where(d < e, m - 1, m)).to(tl.float32, bitcast=True)
    return tl.where(near, side, aq)


@triton.jit
def _codes_out(x, s, codes_ptr, INT8: tl.constexpr, CODE_VALUES: tl.constexpr, F32_COMPARE: tl.constexpr,
               CVT_E4M3: tl.constexpr):
    """The stored codes of x / s (``_fp32_codes`` rounding, ``_stored`` form).  CVT_E4M3 (e4m3 bytes only): the
    hardware's round-to-nearest-even conversion (cvt.rn.satfinite.e4m3x2.f32, two codes per instruction) of the
    near-exact quotient, which is the exact quotient's code unless the quotient sits within a few ulps of a
    midpoint; a tile holding such an element (~1e-5 of random values) takes ``_fp32_codes``' exact comparison
    instead.  Why: the exact rounding is ~40 instructions per element and ncu put the default kernel at 68 % of
    the SM's issue rate; this path measured 9-12 % faster on the H100 (session 29), the same bytes.  CVT_E4M3 = 2:
    the conversion of ``_e4m3_exact_magnitude`` instead, near midpoints fixed element by element (no fallback)."""
    if CVT_E4M3 == 2 and not INT8 and not CODE_VALUES:
        out = _e4m3_signed_byte(_e4m3_exact_magnitude(x, s), x < 0)
    elif CVT_E4M3 and not INT8 and not CODE_VALUES:
        q, near = _e4m3_near_quotient(x, s)
        if tl.max(tl.ravel(near.to(tl.int32)), axis=0) > 0:
            q = _fp32_codes(x, s, INT8, F32_COMPARE)  # exact code values: their conversion below is exact
        # one conversion after the branch: an fp8 tensor yielded out of it lost every 8th byte (Triton 3.6, H100);
        # the sign as a bit from x, as the reference sets it (x = -0.0 keeps code 0x00, a negative x that rounds
        # to 0 gets 0x80)
        out = _e4m3_signed_byte(tl.abs(q), x < 0)
    else:
        out = _stored(_fp32_codes(x, s, INT8, F32_COMPARE), codes_ptr, INT8, CODE_VALUES)
    return out


@triton.jit
def _group_scale(a, QMAX: tl.constexpr):
    """fp32 scale of a group with finite amax ``a``: amax / qmax rounded once (IEEE division: "/" on fp32 compiles
    to an approximate division on the GPU; the reference rounds amax / qmax to fp32 exactly), 1 for an all-zero
    group, and fp32's smallest normal where a positive amax / qmax rounds to 0 (a subnormal amax below
    qmax * 2^-150), as the reference clamps a scale that would lose its group (``formats.quantize.round_scale``)."""
    s = tl.where(a > 0, tl.div_rn(a, QMAX), 1.0)
    return tl.where(s == 0, 1.1754943508222875e-38, s)


@triton.jit
def act_quant_f32_kernel(x_ptr, codes_ptr, scales_ptr, K, stride_xm, stride_cm, stride_sm, stride_sg,
                         INT8: tl.constexpr, GROUP_K: tl.constexpr, GROUPS: tl.constexpr, BLOCK_K: tl.constexpr,
                         CODE_VALUES: tl.constexpr, F32_COMPARE: tl.constexpr = False,
                         CVT_E4M3: tl.constexpr = False):
    """e4m3 (or INT8) codes with fp32 scales ``s = amax / qmax`` (qmax 448 / 127; 1 for an all-zero group), per
    token or per group of K.  Program (row, p): groups p * GROUPS .. p * GROUPS + GROUPS - 1 of one row.

    BLOCK_K >= GROUP_K: one pass, the groups held in registers as a [GROUPS, BLOCK_K] tile; else (one long group
    per program) two passes over BLOCK_K-wide chunks.  No division per element (``_fp32_codes``): the float64
    division and rounding of ``act_quant_kernel`` made the quantizer ~120-230 µs of a 4096 x 8192 call.  CODE_VALUES: store each code's value in the 16-bit float type of
    ``codes_ptr`` (exact: e4m3 and int8 are subsets of fp16 and of bf16) for the MMA kernels on code values."""
    QMAX: tl.constexpr = 127.0 if INT8 else 448.0
    row = tl.program_id(0).to(tl.int64)
    groups = tl.cdiv(K, GROUP_K)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    if BLOCK_K >= GROUP_K:
        col = tl.arange(0, BLOCK_K)
        offs = g[:, None] * GROUP_K + col[None, :]
        mask = (col[None, :] < GROUP_K) & (offs < K) & (g[:, None] < groups)
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
        ax = tl.abs(x)
        finite = ax < float("inf")  # false for +-inf and NaN
        a = tl.max(tl.where(finite, ax, 0.0), axis=1)
        bad = tl.max(tl.where(finite, 0, 1), axis=1) > 0
        s = _group_scale(a, QMAX)
        tl.store(scales_ptr + row * stride_sm + g * stride_sg, tl.where(bad, float("nan"), s), mask=g < groups)
        out = _codes_out(tl.where(bad[:, None], 0.0, x), s[:, None], codes_ptr, INT8, CODE_VALUES, F32_COMPARE,
                         CVT_E4M3)
        tl.store(codes_ptr + row * stride_cm + offs, out, mask=mask)
    else:
        gi = tl.program_id(1)
        k_begin = gi * GROUP_K
        a, bad = _group_amax(x_ptr + row * stride_xm, k_begin, GROUP_K, K, BLOCK_K)
        s = _group_scale(a, QMAX)
        tl.store(scales_ptr + row * stride_sm + gi * stride_sg, tl.where(bad, float("nan"), s))
        for k0 in range(k_begin, tl.minimum(k_begin + GROUP_K, K), BLOCK_K):
            offs = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
            out = _codes_out(tl.where(bad, 0.0, x), s, codes_ptr, INT8, CODE_VALUES, F32_COMPARE, CVT_E4M3)
            tl.store(codes_ptr + row * stride_cm + offs, out, mask=offs < K)


@triton.jit
def act_quant_token_rows_kernel(x_ptr, codes_ptr, scales_ptr, M, K, stride_xm, stride_cm, stride_sm,
                                INT8: tl.constexpr, BLOCK_K: tl.constexpr, CODE_VALUES: tl.constexpr,
                                F32_COMPARE: tl.constexpr = False, CVT_E4M3: tl.constexpr = False):
    """``act_quant_f32_kernel``'s per-token case (one group of K <= BLOCK_K per row), persistent: program p
    quantizes rows p, p + P, p + 2P, ... and loads each next row before it works on the current one (a register
    double buffer).  Why: one row per program ran at 32 % of the copy rate on the H200 (4096 x 8192: 74 µs, session
    28) -- with one or two 512-thread programs per SM each waits for its row, reduces, rounds and stores in turn,
    and nothing overlaps the loads.  Same codes and scales (``_fp32_codes``, ``_group_scale``)."""
    QMAX: tl.constexpr = 127.0 if INT8 else 448.0
    first = tl.program_id(0)
    step = tl.num_programs(0)
    offs = tl.arange(0, BLOCK_K)
    in_k = offs < K
    x_next = tl.load(x_ptr + first.to(tl.int64) * stride_xm + offs, mask=in_k & (first < M), other=0.0)
    for row in range(first, M, step):
        x = x_next.to(tl.float32)
        following = row + step
        x_next = tl.load(x_ptr + tl.cast(following, tl.int64) * stride_xm + offs, mask=in_k & (following < M),
                         other=0.0)
        ax = tl.abs(x)
        finite = ax < float("inf")  # false for +-inf and NaN
        a = tl.max(tl.where(finite, ax, 0.0), axis=0)
        bad = tl.max(tl.where(finite, 0, 1), axis=0) > 0
        s = _group_scale(a, QMAX)
        r64 = tl.cast(row, tl.int64)
        tl.store(scales_ptr + r64 * stride_sm, tl.where(bad, float("nan"), s))
        out = _codes_out(tl.where(bad, 0.0, x), s, codes_ptr, INT8, CODE_VALUES, F32_COMPARE, CVT_E4M3)
        tl.store(codes_ptr + r64 * stride_cm + offs, out, mask=in_k)


@triton.jit
def global_scale_kernel(x_ptr, M, K, stride_xm, ws_ptr, out_ptr, denom, BLOCK: tl.constexpr):
    """NV's per-tensor activation scale in one launch (``formats.activation.global_act_scale`` is the reference):
    every program takes the amax of |x| over the finite values of its BLOCK elements into ``ws[0]`` (fp32 bits:
    non-negative floats order as integers), and the last program to finish -- an acq_rel counter in ``ws[1]`` --
    writes ``max(amax / denom, 1e-30)`` (float64 steps, fp32 result).  ``ws``: two zeroed int32 per call."""
    pid = tl.program_id(0)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    row, col = idx // K, idx % K
    a = tl.abs(tl.load(x_ptr + row.to(tl.int64) * stride_xm + col, mask=idx < M * K, other=0.0).to(tl.float32))
    a = tl.where(a < float("inf"), a, 0.0)  # NaN and +-inf do not count (NaN < inf is false)
    tl.atomic_max(ws_ptr, tl.max(a, axis=0).to(tl.int32, bitcast=True), sem="relaxed")
    done = tl.atomic_add(ws_ptr + 1, 1, sem="acq_rel")
    if done == tl.num_programs(0) - 1:
        amax = tl.atomic_add(ws_ptr, 0, sem="acquire").to(tl.float32, bitcast=True)
        tl.store(out_ptr, tl.maximum(amax.to(tl.float64) / denom, 1e-30).to(tl.float32))
