"""Decode-regime kernel (small M): stream each weight byte once, reduce on CUDA cores in fp32.

At M <= ~8 a GEMM is pure weight streaming, tensor cores buy nothing, so each program decodes a
[BLOCK_N, BLOCK_K] tile in registers and reduces ``x[m, k] * w[n, k]`` over k with FMAs.  When N alone gives
too few programs to fill the GPU, SPLIT_K programs share a row range and add fp32 partials atomically.
"""
import triton
import triton.language as tl

from .decode import decode, decode_scales, dequant_tile, load_group_params, store_output


@triton.jit
def dense_gemv_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, g_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_GLOBAL: tl.constexpr,
    BITS: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, ZERO_KIND: tl.constexpr,
    W_IS_FLOAT: tl.constexpr, W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr,
    W_BIAS: tl.constexpr, W_SPECIAL: tl.constexpr, SCALE_IS_CODE: tl.constexpr,
    S_IS_FLOAT: tl.constexpr, S_SIGNED: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
    S_BIAS: tl.constexpr, S_SPECIAL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    k_span = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_begin = pid_k * k_span
    k_end = tl.minimum(k_begin + k_span, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        # when one scale group spans the tile, the scale multiplies the partial sum (once per row), not every
        # element; smaller groups are scaled per element (a per-group reduction costs more shuffles than that)
        w = dequant_tile(w_ptr, s_ptr, z_ptr, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, offs_n, k0,
                         N, K, BLOCK_N, BLOCK_K, EVEN_K, GROUP_K < BLOCK_K, BITS, GROUP_K, GROUP_N, ZERO_KIND,
                         W_IS_FLOAT, W_SIGNED, W_EXP, W_MAN, W_BIAS, W_SPECIAL, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED,
                         S_EXP, S_MAN, S_BIAS, S_SPECIAL)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0).to(tl.float32)
        part = tl.sum(x[:, None, :] * w[None, :, :], axis=2)
        if GROUP_K >= BLOCK_K:
            s = load_group_params(s_ptr, stride_sn, stride_sk, offs_n, k0, N, K, BLOCK_K, GROUP_K, GROUP_N)
            s = decode_scales(s, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
            part = part * tl.reshape(s, (1, BLOCK_N))
        acc += part
    tile = pid_m * tl.num_programs(0) + pid_n
    store_output(acc, y_ptr, b_ptr, g_ptr, ws_ptr, cnt_ptr, tile, pid_k, M, offs_m, offs_n, offs_m < M, N, stride_ym,
                 SPLIT_K, HAS_BIAS,
                 HAS_GLOBAL)


@triton.jit
def _word_tile(w_ptr, s_ptr, rows_w, rows_s, offs_w, mask_n, w_end, x_rows, mask_m, K, stride_sk,
               EPW: tl.constexpr, GROUP_K: tl.constexpr):
    """The loads of one tile: words [BLOCK_N, BLOCK_W], their group scales, and x [ROWS, EPW, BLOCK_W]
    (x[r, e, w] is the activation of row r for code e of word w)."""
    mw = mask_n[:, None] & (offs_w[None, :] < w_end)
    words = tl.load(rows_w + offs_w[None, :], mask=mw, other=0)
    s = tl.load(rows_s + ((offs_w * EPW) // GROUP_K)[None, :] * stride_sk, mask=mw, other=0)
    xk = offs_w[None, :] * EPW + tl.arange(0, EPW)[:, None]
    xv = tl.load(x_rows[:, None, None] + xk[None, :, :], mask=mask_m[:, None, None] & (xk < K)[None, :, :],
                 other=0.0)
    return words, s, xv


@triton.jit
def dense_gemv_words_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, g_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, K, magic, stride_xm, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, stride_ym,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, SPLIT_K: tl.constexpr,
    PREFETCH: tl.constexpr, FUSED_FMA: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_GLOBAL: tl.constexpr,
    BITS: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, ZERO_KIND: tl.constexpr,
    W_IS_FLOAT: tl.constexpr, W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr,
    W_BIAS: tl.constexpr, W_SPECIAL: tl.constexpr, SCALE_IS_CODE: tl.constexpr,
    S_IS_FLOAT: tl.constexpr, S_SIGNED: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
    S_BIAS: tl.constexpr, S_SPECIAL: tl.constexpr,
):
    """Decode GEMV for codes that never straddle a word (1/2/4/8 bits), ROWS activation rows per program.

    Why a second GEMV: the generic kernel unpacks codes into a [rows, K] tile, and the reshape plus a
    cross-lane reduction per tile cost 15 SASS instructions per weight element -- decode was ALU-bound.
    Here the tile stays word-major, [codes per word, rows, words] (times ROWS activation rows, which share
    the decode), accumulated element-wise and reduced once after the K loop.

    Integer codes are decoded without shifting them down: masked in place and OR-ed into the mantissa of
    2**23 (``magic`` is a runtime argument so that it sits in a register and mask + OR fuse into one LOP3),
    one fused FMA with the scale gives ``code * 2**pos * scale`` and x is pre-divided by 2**pos (exact); codes
    whose field would reach the exponent come from the word shifted right by 16.  The zero point (2**(BITS-1)
    for signed codes, after an XOR to offset binary) is subtracted once per word as
    ``zero * scale * sum(x over the word)``.  That is 3 instructions per element (LOP3, FFMA, FFMA).  Float codes
    go through decode_float (the compiler folds the shift down and decode_float's shift up into one).
    Requires every word to lie in one scale group (GROUP_K a multiple of 32 // BITS, or >= K).
    """
    EPW: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    HIGH: tl.constexpr = 23 - BITS  # codes at bit positions above this are taken from the word >> 16
    FLIP_U: tl.constexpr = (1 << (BITS - 1)) * 4294967295 // MASK  # the sign bit of every code in a word
    FLIP: tl.constexpr = FLIP_U - 4294967296 if FLIP_U >= 2147483648 else FLIP_U
    INT_PATH: tl.constexpr = not W_IS_FLOAT or ZERO_KIND != 0
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(2) * ROWS + tl.arange(0, ROWS)
    mask_m = offs_m < M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    pos = tl.arange(0, EPW) * BITS
    lpos = tl.where(pos > HIGH, pos - 16, pos)
    x_unscale = tl.exp2(-lpos.to(tl.float32))[:, None]
    n_words = tl.cdiv(K, EPW)
    w_span = tl.cdiv(tl.cdiv(n_words, BLOCK_W), SPLIT_K) * BLOCK_W
    w_begin = pid_k * w_span
    w_end = tl.minimum(w_begin + w_span, n_words)
    rows_w = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows_s = s_ptr + (offs_n[:, None] // GROUP_N).to(tl.int64) * stride_sn
    rows_z = z_ptr + (offs_n[:, None] // GROUP_N).to(tl.int64) * stride_zn
    x_rows = x_ptr + offs_m.to(tl.int64) * stride_xm
    if ROWS == 1:
        acc = tl.zeros((EPW, BLOCK_N, BLOCK_W), dtype=tl.float32)
    else:
        acc = tl.zeros((ROWS, EPW, BLOCK_N, BLOCK_W), dtype=tl.float32)
    corr = tl.zeros((ROWS, BLOCK_N, BLOCK_W), dtype=tl.float32)
    if PREFETCH:
        words, s, xv = _word_tile(w_ptr, s_ptr, rows_w, rows_s, w_begin + tl.arange(0, BLOCK_W), mask_n, w_end,
                                  x_rows, mask_m, K, stride_sk, EPW, GROUP_K)
    for w0 in range(w_begin, w_end, BLOCK_W):
        offs_w = w0 + tl.arange(0, BLOCK_W)
        if PREFETCH:  # issue the next tile's loads before decoding this one (Triton pipelines only tl.dot loads)
            words_next, s_next, xv_next = _word_tile(w_ptr, s_ptr, rows_w, rows_s, offs_w + BLOCK_W, mask_n, w_end,
                                                     x_rows, mask_m, K, stride_sk, EPW, GROUP_K)
        else:
            words, s, xv = _word_tile(w_ptr, s_ptr, rows_w, rows_s, offs_w, mask_n, w_end, x_rows, mask_m, K,
                                      stride_sk, EPW, GROUP_K)
        sf = decode_scales(s, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
        xf = xv.to(tl.float32)
        if INT_PATH:
            flip = W_SIGNED and ZERO_KIND == 0
            ww = words ^ FLIP if flip else words
            hi = (ww.to(tl.uint32, bitcast=True) >> 16).to(tl.int32, bitcast=True)
            src = tl.where((pos > HIGH)[:, None, None], hi[None, :, :], ww[None, :, :])
            f = ((src & (MASK << lpos)[:, None, None]) | magic).to(tl.float32, bitcast=True)
            if FUSED_FMA:  # exact: f * s is not rounded before the (exact) 2**23 * s comes off
                v = tl.fma(f, sf[None, :, :], -8388608.0 * sf[None, :, :])
            else:  # the interpreter's fma rounds the product: subtract first (exact), then scale
                v = (f - 8388608.0) * sf[None, :, :]
            xu = xf * x_unscale
            if ZERO_KIND != 0:
                mw = mask_n[:, None] & (offs_w[None, :] < w_end)
                zero = tl.load(rows_z + ((offs_w * EPW) // GROUP_K)[None, :] * stride_zk, mask=mw, other=0)
                corr += (zero.to(tl.float32) * sf)[None, :, :] * tl.sum(xf, axis=1)[:, None, :]
            elif flip:
                corr += ((1 << (BITS - 1)) * sf)[None, :, :] * tl.sum(xf, axis=1)[:, None, :]
        else:
            codes = (words.to(tl.uint32, bitcast=True)[None, :, :] >> pos[:, None, None]) & MASK
            v = decode(codes.to(tl.int32, bitcast=True), BITS, W_IS_FLOAT, W_SIGNED, W_EXP, W_MAN, W_BIAS,
                       W_SPECIAL)
            v = v * sf[None, :, :]
            xu = xf
        if ROWS == 1:
            acc += tl.reshape(xu, (EPW, BLOCK_W))[:, None, :] * v
        else:
            acc += xu[:, :, None, :] * v[None, :, :, :]
        if PREFETCH:
            words, s, xv = words_next, s_next, xv_next
    if ROWS == 1:
        out = tl.reshape(tl.sum(tl.sum(acc, axis=0), axis=1), (1, BLOCK_N))
    else:
        out = tl.sum(tl.sum(acc, axis=1), axis=2)
    out = out - tl.sum(corr, axis=2)
    tile = tl.program_id(2) * tl.num_programs(0) + pid_n
    store_output(out, y_ptr, b_ptr, g_ptr, ws_ptr, cnt_ptr, tile, pid_k, M, offs_m, offs_n, mask_m, N, stride_ym,
                 SPLIT_K, HAS_BIAS, HAS_GLOBAL)
