"""Decode-regime kernel (small M): stream each weight byte once, reduce on CUDA cores in fp32.

At M <= ~8 a GEMM is pure weight streaming, tensor cores buy nothing, so each program decodes a
[BLOCK_N, BLOCK_K] tile in registers and reduces ``x[m, k] * w[n, k]`` over k with FMAs.  When N alone gives
too few programs to fill the GPU, SPLIT_K programs share a row range and add fp32 partials atomically.
"""
import triton
import triton.language as tl

from .decode import decode_scales, dequant_tile, load_group_params, store_output


@triton.jit
def dense_gemv_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, g_ptr, b_ptr, y_ptr,
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
    store_output(acc, y_ptr, b_ptr, g_ptr, offs_m, offs_n, offs_m < M, N, stride_ym, SPLIT_K, HAS_BIAS,
                 HAS_GLOBAL)
