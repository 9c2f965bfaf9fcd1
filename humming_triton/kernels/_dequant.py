"""Dequantize a canonical QuantWeight to a dense [N, K] tensor on the GPU.

Used for large-M prefill where a dense tensor-core GEMM (cuBLAS) on the dequantized weight beats dequantizing
inside every output tile (at M = 4096 each weight tile would be decoded 32 times), and to give users a fast
``dequantize`` of any format.
"""
import triton
import triton.language as tl

from .decode import dequant_tile


@triton.jit
def dequant_kernel(
    w_ptr, s_ptr, z_ptr, g_ptr, out_ptr, N, K, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, stride_on,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_GLOBAL: tl.constexpr,
    BITS: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, ZERO_KIND: tl.constexpr,
    W_IS_FLOAT: tl.constexpr, W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr,
    W_BIAS: tl.constexpr, W_SPECIAL: tl.constexpr, SCALE_IS_CODE: tl.constexpr,
    S_IS_FLOAT: tl.constexpr, S_SIGNED: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
    S_BIAS: tl.constexpr, S_SPECIAL: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    w = dequant_tile(w_ptr, s_ptr, z_ptr, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, offs_n, k0, N, K,
                     BLOCK_N, BLOCK_K, EVEN_K, True, BITS, GROUP_K, GROUP_N, ZERO_KIND, W_IS_FLOAT, W_SIGNED, W_EXP,
                     W_MAN, W_BIAS, W_SPECIAL, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
    if HAS_GLOBAL:
        w = w * tl.load(g_ptr)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * stride_on + offs_k[None, :], w.to(out_ptr.dtype.element_ty),
             mask=mask)
