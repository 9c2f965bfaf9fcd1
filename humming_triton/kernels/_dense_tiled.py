"""Mid/prefill kernel: tiled ``tl.dot`` on tensor cores with the weight dequantized in registers.

Codes are decoded to float32, rounded to the activation dtype (exact for every <= 8-bit integer code and for
e2m1 / e4m3 / e5m2 values) and fed to the MMA.  When a scale group spans the whole K tile (POST_SCALE) the scale
multiplies the fp32 partial product instead of every weight element -- fewer multiplies and no rounding of
``q * s``; otherwise (groups smaller than the tile, float zero points) the weight is scaled before the dot.
Programs walk output tiles in GROUP_M-row bands so that consecutive programs reuse the same weight tiles in L2;
at mid M, SPLIT_K programs share an output tile (fp32 atomics) so that enough programs stream the weight.
"""
import triton
import triton.language as tl

from .decode import (broadcast_groups, decode_float, decode_scales, dequant_tile, exact_i32_to_f32,
                     load_group_params, load_int4_tile_16, load_int_tile_8, store_output)


@triton.jit
def tile_matmul(x_rows, xs_rows, mask_m, w_ptr, s_ptr, z_ptr, perm_ptr, stride_wn, stride_sn, stride_sk, stride_zn,
                stride_zk, offs_n, t_begin, t_end, N, K,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, POST_SCALE: tl.constexpr,
                DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, HAS_PERM: tl.constexpr, ACT_KIND: tl.constexpr,
                ACT_GROUP_K: tl.constexpr,
                BITS: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, ZERO_KIND: tl.constexpr,
                W_IS_FLOAT: tl.constexpr, W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr,
                W_BIAS: tl.constexpr, W_SPECIAL: tl.constexpr, SCALE_IS_CODE: tl.constexpr,
                S_IS_FLOAT: tl.constexpr, S_SIGNED: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
                S_BIAS: tl.constexpr, S_SPECIAL: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N] = x rows (pointers ``x_rows`` [BLOCK_M, 1], valid where ``mask_m``) times the
    dequantized weight rows ``offs_n``, over K tiles t_begin .. t_end (shared by the dense and grouped kernels).

    ACT_KIND 1 (e4m3) / 2 (int8): x rows hold activation codes with fp32 scales at ``xs_rows`` (one per
    ACT_GROUP_K columns); the weight codes' values are exact in that type (int4/e2m1/e4m3 in e4m3, int4/int8 in
    int8), so both operands feed an fp8 / int8 MMA and both scales multiply the partial product (POST_SCALE).
    ACT_KIND 5 (e4m3 codes, 64/128-row tiles): the same, but the codes meet the weight in a bf16 MMA -- the
    H200's fp8 wgmma does not accumulate exactly (scripts/fp8_probe.py), bf16 wgmma does, and every e4m3 x
    (int4 / e2m1 / e4m3) product is exact in fp32 either way.
    ACT_KIND 3 (e2m1 codes, e8m0 block scales) / 4 (e2m1, e4m3 block scales): x is decoded times its block
    scale in registers -- exact in bf16 (at most 6 significant bits) -- and meets the scaled weight in a bf16
    MMA (the global scales are the caller's, in the epilogue).

    ACT_KIND 6 (16-bit activations, signed int4 codes, POST_SCALE): the codes are decoded to x's type with packed
    instructions (``decode.load_int4_tile_16``); ACT_KIND 0 decodes any format through fp32.
    ACT_KIND 7 (int8 codes, signed int4 / int8 weights, POST_SCALE): ACT_KIND 2 with the weight unpacked to int8
    by integer operations (``decode.load_int_tile_8``) and the int32 partial converted exactly without I2F; a
    per-token activation scale multiplies the accumulator once, after the loop.  ACT_KIND 9: ACT_KIND 7 with one
    weight scale per row and one activation scale per token -- the MMA accumulates in int32 over all of K (exact,
    and asynchronous: no partial product to rescale per tile) and both scales multiply once, after the loop.  ACT_KIND 8 (e4m3 codes, signed
    int4 weights, POST_SCALE): ACT_KIND 5 with the weight decoded to bf16 by ``load_int4_tile_16``.

    HAS_PERM (act-order weights, 16-bit activations): the weight is stored in permuted K order, and x's column
    ``perm_ptr[k]`` meets stored column k -- gathered here instead of permuting x in memory per call."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_i = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)  # ACT_KIND 9's int32 sums (unused, so dropped, else)
    # ACT_KIND 7: |int32 partial| <= BLOCK_K * 2^(BITS-1) * 128 within the exact range of exact_i32_to_f32
    I32_EXACT: tl.constexpr = BLOCK_K * (1 << (BITS - 1)) * 128 <= 4194304
    X_SCALE_AFTER: tl.constexpr = ACT_KIND == 7 and ACT_GROUP_K >= (1 << 30)  # per-token scale (dense.PER_TOKEN)
    for t in range(t_begin, t_end):
        k0 = t * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kx = offs_k
        if HAS_PERM:
            kx = tl.load(perm_ptr + offs_k, mask=offs_k < K, other=0)
        if EVEN_K:
            x = tl.load(x_rows + kx[None, :], mask=mask_m, other=0)
        else:
            x = tl.load(x_rows + kx[None, :], mask=mask_m & (offs_k[None, :] < K), other=0)
        if ACT_KIND == 6 or ACT_KIND == 8:  # signed int4, a scale per tile: packed decode to a 16-bit type
            w16 = load_int4_tile_16(w_ptr, stride_wn, offs_n, k0, N, K, BLOCK_N, BLOCK_K, EVEN_K,
                                    ACT_KIND == 8 or x_rows.dtype.element_ty == tl.bfloat16, not DOT_F32)
        elif ACT_KIND == 7 or ACT_KIND == 9:
            wq = load_int_tile_8(w_ptr, stride_wn, offs_n, k0, N, K, BLOCK_N, BLOCK_K, EVEN_K, BITS)
        else:
            w = dequant_tile(w_ptr, s_ptr, z_ptr, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, offs_n,
                             k0, N, K, BLOCK_N, BLOCK_K, EVEN_K, not POST_SCALE, BITS, GROUP_K, GROUP_N, ZERO_KIND,
                             W_IS_FLOAT, W_SIGNED, W_EXP, W_MAN, W_BIAS, W_SPECIAL, SCALE_IS_CODE, S_IS_FLOAT,
                             S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
        if ACT_KIND == 6:
            if DOT_F32:  # the interpreter (and its bf16 bit-pattern products): upcast the exact values
                part = tl.dot(x.to(tl.float32), tl.trans(w16.to(tl.float32)), input_precision="ieee")
            else:
                part = tl.dot(x, tl.trans(w16))
        elif ACT_KIND == 1:
            part = tl.dot(x.to(tl.float8e4nv, bitcast=True), tl.trans(w.to(tl.float8e4nv)))
            part = part * tl.load(xs_rows + k0 // ACT_GROUP_K, mask=mask_m, other=0.0)
        elif ACT_KIND == 5:  # e4m3 codes on a bf16 MMA: exact products, and bf16 wgmma accumulates exactly
            xb = x.to(tl.float8e4nv, bitcast=True)
            if DOT_F32:
                part = tl.dot(xb.to(tl.float32), tl.trans(w), input_precision="ieee")
            else:
                part = tl.dot(xb.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
            part = part * tl.load(xs_rows + k0 // ACT_GROUP_K, mask=mask_m, other=0.0)
        elif ACT_KIND == 8:
            xb = x.to(tl.float8e4nv, bitcast=True)
            if DOT_F32:
                part = tl.dot(xb.to(tl.float32), tl.trans(w16.to(tl.float32)), input_precision="ieee")
            else:
                part = tl.dot(xb.to(tl.bfloat16), tl.trans(w16))
            part = part * tl.load(xs_rows + k0 // ACT_GROUP_K, mask=mask_m, other=0.0)
        elif ACT_KIND == 9:
            acc_i = tl.dot(x.to(tl.int8, bitcast=True), tl.trans(wq), acc_i, out_dtype=tl.int32)
        elif ACT_KIND == 7:
            part = exact_i32_to_f32(tl.dot(x.to(tl.int8, bitcast=True), tl.trans(wq)), I32_EXACT)
            if not X_SCALE_AFTER:
                part = part * tl.load(xs_rows + k0 // ACT_GROUP_K, mask=mask_m, other=0.0)
        elif ACT_KIND == 2:
            part = tl.dot(x.to(tl.int8, bitcast=True), tl.trans(w.to(tl.int8))).to(tl.float32)
            part = part * tl.load(xs_rows + k0 // ACT_GROUP_K, mask=mask_m, other=0.0)
        elif ACT_KIND == 3 or ACT_KIND == 4:
            GROUPS: tl.constexpr = BLOCK_K // ACT_GROUP_K
            g = k0 // ACT_GROUP_K + tl.arange(0, GROUPS)
            sc = tl.load(xs_rows + g[None, :], mask=mask_m & (g[None, :] < K // ACT_GROUP_K), other=0).to(tl.int32)
            if ACT_KIND == 3:
                sv = decode_float(sc, 8, 0, 127, False, 3)
            else:
                sv = decode_float(sc, 4, 3, 7, False, 1)
            xv = decode_float(x.to(tl.int32), 2, 1, 1, True, 0) * broadcast_groups(sv, BLOCK_M, BLOCK_K, ACT_GROUP_K)
            if DOT_F32:
                part = tl.dot(xv, tl.trans(w.to(tl.bfloat16).to(tl.float32)), input_precision="ieee")
            else:
                part = tl.dot(xv.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
        else:
            wt = tl.trans(w.to(x.dtype))
            if DOT_F32:  # the interpreter multiplies bf16 bit patterns: upcast (after the same rounding)
                part = tl.dot(x.to(tl.float32), wt.to(tl.float32), input_precision="ieee")
            else:
                part = tl.dot(x, wt)
        if ACT_KIND == 9:
            pass
        elif POST_SCALE:
            s = load_group_params(s_ptr, stride_sn, stride_sk, offs_n, k0, N, K, BLOCK_K, GROUP_K, GROUP_N)
            s = decode_scales(s, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
            acc += part * tl.reshape(s, (1, BLOCK_N))
        else:
            acc += part
    if ACT_KIND == 9:
        s = load_group_params(s_ptr, stride_sn, stride_sk, offs_n, 0, N, K, BLOCK_K, GROUP_K, GROUP_N)
        s = decode_scales(s, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
        acc = acc_i.to(tl.float32) * tl.reshape(s, (1, BLOCK_N)) * tl.load(xs_rows, mask=mask_m, other=0.0)
    if X_SCALE_AFTER:
        acc = acc * tl.load(xs_rows, mask=mask_m, other=0.0)
    return acc


@triton.jit
def dense_tiled_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, g_ptr, b_ptr, y_ptr, xs_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, stride_ym, stride_xsm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, POST_SCALE: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_GLOBAL: tl.constexpr, ACT_KIND: tl.constexpr, ACT_GROUP_K: tl.constexpr,
    BITS: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, ZERO_KIND: tl.constexpr,
    W_IS_FLOAT: tl.constexpr, W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr,
    W_BIAS: tl.constexpr, W_SPECIAL: tl.constexpr, SCALE_IS_CODE: tl.constexpr,
    S_IS_FLOAT: tl.constexpr, S_SIGNED: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
    S_BIAS: tl.constexpr, S_SPECIAL: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    band = GROUP_M * num_n
    first_m = (pid // band) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % band) % rows
    pid_n = (pid % band) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tiles = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    t_begin = tl.program_id(1) * tiles
    t_end = tl.minimum(t_begin + tiles, tl.cdiv(K, BLOCK_K))
    acc = tile_matmul(x_ptr + offs_m[:, None] * stride_xm, xs_ptr + offs_m[:, None] * stride_xsm,
                      offs_m[:, None] < M, w_ptr, s_ptr, z_ptr, x_ptr, stride_wn, stride_sn, stride_sk, stride_zn,
                      stride_zk, offs_n, t_begin, t_end, N, K, BLOCK_M, BLOCK_N, BLOCK_K, POST_SCALE, DOT_F32, EVEN_K,
                      False, ACT_KIND, ACT_GROUP_K, BITS, GROUP_K, GROUP_N, ZERO_KIND, W_IS_FLOAT, W_SIGNED, W_EXP, W_MAN, W_BIAS,
                      W_SPECIAL, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
    store_output(acc, y_ptr, b_ptr, g_ptr, ws_ptr, cnt_ptr, pid, tl.program_id(1), M, offs_m, offs_n, offs_m < M, N,
                 stride_ym, SPLIT_K, HAS_BIAS,
                 HAS_GLOBAL)
