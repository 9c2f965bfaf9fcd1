"""Decode-regime kernel (small M): stream each weight byte once, reduce on CUDA cores in fp32.

At M <= ~8 a GEMM is pure weight streaming, tensor cores buy nothing, so each program decodes a
[BLOCK_N, BLOCK_K] tile in registers and reduces ``x[m, k] * w[n, k]`` over k with FMAs.  When N alone gives
too few programs to fill the GPU, SPLIT_K programs share a row range and add fp32 partials atomically.
"""
import triton
import triton.language as tl

from .decode import decode, decode_codes, decode_int, decode_scales, load_group_params, load_words, unpack_words


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
    # iterate over tile indices so that every k offset is a visible multiple of BLOCK_K: without that
    # divisibility Triton cannot prove 16-byte alignment and falls back to 2-byte loads of x
    tiles = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    t_begin = pid_k * tiles
    t_end = tl.minimum(t_begin + tiles, tl.cdiv(K, BLOCK_K))
    k_begin = t_begin * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    mask_m = offs_m[:, None] < M
    # software pipelining by hand (Triton pipelines only loads that feed tl.dot): the next tile's words, x and
    # scales are loaded before this tile is decoded, so two tiles' loads are in flight per program
    lo, hi = load_words(w_ptr, stride_wn, offs_n, k_begin, N, K, BLOCK_N, BLOCK_K, BITS, EVEN_K)
    offs_k = k_begin + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask_m & (offs_k[None, :] < K), other=0.0)
    s = load_group_params(s_ptr, stride_sn, stride_sk, offs_n, k_begin, N, K, BLOCK_K, GROUP_K, GROUP_N)
    z = load_group_params(z_ptr, stride_zn, stride_zk, offs_n, k_begin, N, K, BLOCK_K, GROUP_K, GROUP_N)
    for t in range(t_begin, t_end):
        k0 = t * BLOCK_K
        k1 = k0 + BLOCK_K
        lo_n, hi_n = load_words(w_ptr, stride_wn, offs_n, k1, N, K, BLOCK_N, BLOCK_K, BITS, EVEN_K)
        offs_k = k1 + tl.arange(0, BLOCK_K)
        x_n = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                      mask=mask_m & (offs_k[None, :] < K), other=0.0)
        s_n = load_group_params(s_ptr, stride_sn, stride_sk, offs_n, k1, N, K, BLOCK_K, GROUP_K, GROUP_N)
        z_n = load_group_params(z_ptr, stride_zn, stride_zk, offs_n, k1, N, K, BLOCK_K, GROUP_K, GROUP_N)

        c = unpack_words(lo, hi, k0, K, BLOCK_N, BLOCK_K, BITS, EVEN_K)
        sd = decode_scales(s, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
        # when one scale group spans the tile, the scale multiplies the partial sum (once per row), not every
        # element; smaller groups are scaled per element (a per-group reduction costs more shuffles than that)
        w = decode_codes(c, z, sd, BLOCK_N, BLOCK_K, GROUP_K < BLOCK_K, BITS, GROUP_K, ZERO_KIND, W_IS_FLOAT,
                         W_SIGNED, W_EXP, W_MAN, W_BIAS, W_SPECIAL)
        part = tl.sum(x.to(tl.float32)[:, None, :] * w[None, :, :], axis=2)
        if GROUP_K >= BLOCK_K:
            part = part * tl.reshape(sd, (1, BLOCK_N))
        acc += part
        lo, hi, x, s, z = lo_n, hi_n, x_n, s_n, z_n
    if HAS_GLOBAL:
        acc = acc * tl.load(g_ptr)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(y_ptrs, acc, mask=mask)  # fp32 workspace; bias and cast after the last split


@triton.jit
def dense_gemv_words_kernel(
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
    """GEMV for 1/2/4/8-bit codes with groups of at least one word, kept as [rows, words, codes-per-word].

    Never reshaping the unpacked codes to [rows, K] lets x be loaded in the same 3-D shape: each thread then
    owns a word's worth of contiguous k (8 x bf16 for int4 = one 16-byte load) instead of scattered 2-byte
    loads, and scales/zeros are gathered per word.  The next tile's loads are issued before this tile is
    decoded (manual pipelining)."""
    EPW: tl.constexpr = 32 // BITS
    WORDS: tl.constexpr = BLOCK_K // EPW
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    tiles = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    t_begin = pid_k * tiles
    t_end = tl.minimum(t_begin + tiles, tl.cdiv(K, BLOCK_K))
    mask_n = offs_n < N
    j = tl.arange(0, EPW)
    words_per_row = tl.cdiv(K, EPW)
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    x_rows = x_ptr + offs_m[:, None, None] * stride_xm
    mask_m = offs_m[:, None, None] < M
    s_rows = s_ptr + (offs_n // GROUP_N)[:, None].to(tl.int64) * stride_sn
    z_rows = z_ptr + (offs_n // GROUP_N)[:, None].to(tl.int64) * stride_zn

    offs_w = t_begin * WORDS + tl.arange(0, WORDS)
    kk = offs_w[:, None] * EPW + j[None, :]
    words = tl.load(w_rows + offs_w[None, :], mask=mask_n[:, None] & (offs_w[None, :] < words_per_row), other=0)
    x = tl.load(x_rows + kk[None, :, :], mask=mask_m & (kk[None, :, :] < K), other=0.0)
    g = (offs_w * EPW) // GROUP_K
    s = tl.load(s_rows + g[None, :] * stride_sk, mask=mask_n[:, None] & (offs_w[None, :] < words_per_row), other=0)
    z = tl.load(z_rows + g[None, :] * stride_zk, mask=mask_n[:, None] & (offs_w[None, :] < words_per_row), other=0)
    # per-word partial sums accumulate across tiles; the cross-thread reduction over words runs once at the end
    acc3 = tl.zeros((BLOCK_M, BLOCK_N, WORDS), dtype=tl.float32)
    for t in range(t_begin, t_end):
        offs_w1 = (t + 1) * WORDS + tl.arange(0, WORDS)
        kk1 = offs_w1[:, None] * EPW + j[None, :]
        in_k = mask_n[:, None] & (offs_w1[None, :] < words_per_row)
        words_n = tl.load(w_rows + offs_w1[None, :], mask=in_k, other=0)
        x_n = tl.load(x_rows + kk1[None, :, :], mask=mask_m & (kk1[None, :, :] < K), other=0.0)
        g1 = (offs_w1 * EPW) // GROUP_K
        s_n = tl.load(s_rows + g1[None, :] * stride_sk, mask=in_k, other=0)
        z_n = tl.load(z_rows + g1[None, :] * stride_zk, mask=in_k, other=0)

        c = (words[:, :, None] >> (j * BITS)[None, None, :]) & ((1 << BITS) - 1)  # [BLOCK_N, WORDS, EPW]
        if ZERO_KIND == 0:
            v = decode(c, BITS, W_IS_FLOAT, W_SIGNED, W_EXP, W_MAN, W_BIAS, W_SPECIAL)
        else:
            v = decode_int(c, BITS, False) - z.to(tl.float32)[:, :, None]
        sd = decode_scales(s, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
        # codes past K are zero words, and x there is 0: no extra mask needed
        part = tl.sum(x.to(tl.float32)[:, None, :, :] * v[None, :, :, :], axis=3)  # [BLOCK_M, BLOCK_N, WORDS]
        acc3 += part * sd[None, :, :]
        words, x, s, z = words_n, x_n, s_n, z_n
    acc = tl.sum(acc3, axis=2)
    if HAS_GLOBAL:
        acc = acc * tl.load(g_ptr)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(y_ptrs, acc, mask=mask)
