"""Small-M kernel (M = 1..16 decode batches): tensor cores with the tokens on the MMA's N side ("swap-AB").

Why: a [16, K] x [K, N] product on CUDA cores costs 16 FMAs per weight element (the GEMVs' cost grows with M),
and a 16-row tile on the MMA's M side forces ``mma.sync`` with the dequantized weight as the B operand.
Putting the weight tile ``[BLOCK_N, BLOCK_K]`` on the M side (``tl.dot(w, x.T)``) lets sm_90 use wgmma with
64-row instructions over N and the 16 tokens as its N dimension: the weight is decoded once per program, the
MMA cost is flat in M, and the time is the weight stream plus the decode.  The accumulator is
``[BLOCK_N, BLOCK_M]``; it is transposed once, after the K loop, for the shared epilogue.

Same format constexprs, decode helpers, POST_SCALE rule and split-K epilogue as the tiled kernel
(``_dense_tiled.py``); only 16-bit (and fp32, interpreter) activations.  INT4_16: signed int4 codes with a scale
per K tile decode straight to x's 16-bit type with packed instructions (``decode.load_int4_tile_16``).
"""
import triton
import triton.language as tl

from .decode import decode_scales, dequant_tile, load_group_params, load_int4_tile_16, store_output


@triton.jit
def swap_tile_matmul(x_rows, mask_m, w_ptr, s_ptr, z_ptr, perm_ptr, stride_wn, stride_sn, stride_sk, stride_zn,
                     stride_zk, offs_n, t_begin, t_end, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, POST_SCALE: tl.constexpr,
                     DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, HAS_PERM: tl.constexpr, INT4_16: tl.constexpr,
                     ASM: tl.constexpr,
                     BITS: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, ZERO_KIND: tl.constexpr,
                     W_IS_FLOAT: tl.constexpr, W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr,
                     W_BIAS: tl.constexpr, W_SPECIAL: tl.constexpr, SCALE_IS_CODE: tl.constexpr,
                     S_IS_FLOAT: tl.constexpr, S_SIGNED: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
                     S_BIAS: tl.constexpr, S_SPECIAL: tl.constexpr):
    """fp32 [BLOCK_N, BLOCK_M] = the dequantized weight rows ``offs_n`` times the x rows (pointers ``x_rows``
    [BLOCK_M, 1], valid where ``mask_m``) over K tiles t_begin .. t_end, transposed: the dense and grouped swap-AB
    kernels' loop.  HAS_PERM: act-order weights, x's column ``perm_ptr[k]`` meets stored column k."""
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for t in range(t_begin, t_end):
        k0 = t * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kx = offs_k
        if HAS_PERM:
            kx = tl.load(perm_ptr + offs_k, mask=offs_k < K, other=0)
        if EVEN_K:
            x = tl.load(x_rows + kx[None, :], mask=mask_m, other=0.0)
        else:
            x = tl.load(x_rows + kx[None, :], mask=mask_m & (offs_k[None, :] < K), other=0.0)
        if INT4_16:  # signed int4, scale per tile: packed decode straight to x's 16-bit type
            w = load_int4_tile_16(w_ptr, stride_wn, offs_n, k0, N, K, BLOCK_N, BLOCK_K, EVEN_K,
                                  x_rows.dtype.element_ty == tl.bfloat16, ASM)
        else:
            w = dequant_tile(w_ptr, s_ptr, z_ptr, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, offs_n,
                             k0, N, K, BLOCK_N, BLOCK_K, EVEN_K, not POST_SCALE, BITS, GROUP_K, GROUP_N, ZERO_KIND,
                             W_IS_FLOAT, W_SIGNED, W_EXP, W_MAN, W_BIAS, W_SPECIAL, SCALE_IS_CODE, S_IS_FLOAT,
                             S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
        if DOT_F32:  # the interpreter multiplies bf16 bit patterns: upcast (after the same rounding)
            part = tl.dot(w.to(x.dtype).to(tl.float32), tl.trans(x.to(tl.float32)), input_precision="ieee")
        else:
            part = tl.dot(w.to(x.dtype), tl.trans(x))
        if POST_SCALE:
            s = load_group_params(s_ptr, stride_sn, stride_sk, offs_n, k0, N, K, BLOCK_K, GROUP_K, GROUP_N)
            s = decode_scales(s, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
            acc += part * s  # s: [BLOCK_N, 1], one group over the whole K tile
        else:
            acc += part
    return acc


@triton.jit
def dense_swapab_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, g_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    POST_SCALE: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_GLOBAL: tl.constexpr, INT4_16: tl.constexpr, ASM: tl.constexpr,
    BITS: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, ZERO_KIND: tl.constexpr,
    W_IS_FLOAT: tl.constexpr, W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr,
    W_BIAS: tl.constexpr, W_SPECIAL: tl.constexpr, SCALE_IS_CODE: tl.constexpr,
    S_IS_FLOAT: tl.constexpr, S_SIGNED: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
    S_BIAS: tl.constexpr, S_SPECIAL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    tiles = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    t_begin = tl.program_id(1) * tiles
    t_end = tl.minimum(t_begin + tiles, tl.cdiv(K, BLOCK_K))
    acc = swap_tile_matmul(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm, mask_m[:, None], w_ptr, s_ptr, z_ptr,
                           w_ptr, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, offs_n, t_begin, t_end, N,
                           K, BLOCK_M, BLOCK_N, BLOCK_K, POST_SCALE, DOT_F32, EVEN_K, False, INT4_16, ASM, BITS,
                           GROUP_K, GROUP_N, ZERO_KIND, W_IS_FLOAT, W_SIGNED, W_EXP, W_MAN, W_BIAS, W_SPECIAL,
                           SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
    tile = tl.program_id(2) * tl.num_programs(0) + pid_n
    store_output(tl.trans(acc), y_ptr, b_ptr, g_ptr, ws_ptr, cnt_ptr, tile, tl.program_id(1), M, offs_m, offs_n,
                 mask_m, N, stride_ym, SPLIT_K, HAS_BIAS, HAS_GLOBAL)
