"""Grouped (MoE) GEMM: rows sorted by expert, each expert's rows times its own quantized weight.

Work is split into BLOCK_M-row tiles *per expert* (an expert's last tile may be partial), numbered across
experts by a cumulative tile count computed on the device -- no host sync, so the launch is CUDA-graph
capturable.  The grid is an upper bound (cdiv(T, BLOCK_M) + E tiles); programs past the last real tile
exit at once.  The K loop is the dense tiled kernel's (``tile_matmul``), pointed at the expert's slices; SWAP_AB (16-bit
activations) runs the dense swap-AB kernel's loop instead (``swap_tile_matmul``: the dequantized weight is the
MMA's register-sourced A operand, an expert's rows its N side).
"""
import triton
import triton.language as tl

from ._dense_swapab import swap_tile_matmul
from ._dense_tiled import tile_matmul
from .decode import store_output


@triton.jit
def grouped_tiled_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, g_ptr, b_ptr, y_ptr, offsets_ptr, tile_cum_ptr, xs_ptr, perm_ptr, ws_ptr, cnt_ptr,
    T, N, K, E, stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_sk, stride_ze, stride_zn, stride_zk,
    stride_be, stride_ym, stride_xsm, stride_ge, stride_pe,
    E_POW2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    POST_SCALE: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_GLOBAL: tl.constexpr, HAS_PERM: tl.constexpr, ACT_KIND: tl.constexpr, ACT_GROUP_K: tl.constexpr,
    SWAP_AB: tl.constexpr, BITS: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, ZERO_KIND: tl.constexpr,
    W_IS_FLOAT: tl.constexpr, W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr,
    W_BIAS: tl.constexpr, W_SPECIAL: tl.constexpr, SCALE_IS_CODE: tl.constexpr,
    S_IS_FLOAT: tl.constexpr, S_SIGNED: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
    S_BIAS: tl.constexpr, S_SPECIAL: tl.constexpr,
):
    tile = tl.program_id(0)
    # tile_cum[e] = tiles of experts < e; the expert of this tile is the number of e >= 1 with tile_cum[e] <= tile
    idx = tl.arange(0, E_POW2)
    cum = tl.load(tile_cum_ptr + 1 + idx, mask=idx < E, other=2147483647)
    e = tl.sum((cum <= tile).to(tl.int32), axis=0)
    if e >= E:
        return
    first_tile = tl.load(tile_cum_ptr + e)
    row_begin = tl.load(offsets_ptr + e) + (tile - first_tile) * BLOCK_M
    row_end = tl.load(offsets_ptr + e + 1)
    offs_m = row_begin + tl.arange(0, BLOCK_M)
    mask_m = offs_m < row_end
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e64 = e.to(tl.int64)
    k_tiles = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)  # SPLIT_K programs share a tile's K (decode: few rows)
    t_begin = tl.program_id(2) * k_tiles
    t_end = tl.minimum(t_begin + k_tiles, tl.cdiv(K, BLOCK_K))
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    if SWAP_AB:  # ACT_KIND 0 / 6 only (16-bit activations)
        acc = tl.trans(swap_tile_matmul(
            x_rows, mask_m[:, None], w_ptr + e64 * stride_we, s_ptr + e64 * stride_se, z_ptr + e64 * stride_ze,
            perm_ptr + e64 * stride_pe, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, offs_n, t_begin, t_end,
            N, K, BLOCK_M, BLOCK_N, BLOCK_K, POST_SCALE, DOT_F32, EVEN_K, HAS_PERM, ACT_KIND == 6, not DOT_F32,
            BITS, GROUP_K, GROUP_N, ZERO_KIND, W_IS_FLOAT, W_SIGNED, W_EXP, W_MAN, W_BIAS, W_SPECIAL, SCALE_IS_CODE,
            S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL))
    else:
        # ACT_KIND 0 (16-bit activations): xs_ptr is unused; otherwise x holds activation codes, xs their scales
        acc = tile_matmul(x_rows, xs_ptr + offs_m[:, None].to(tl.int64) * stride_xsm, mask_m[:, None],
                          w_ptr + e64 * stride_we, s_ptr + e64 * stride_se, z_ptr + e64 * stride_ze,
                          perm_ptr + e64 * stride_pe, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, offs_n,
                          t_begin, t_end, N, K, BLOCK_M, BLOCK_N, BLOCK_K, POST_SCALE, DOT_F32, EVEN_K, HAS_PERM,
                          ACT_KIND, ACT_GROUP_K, BITS, GROUP_K, GROUP_N,
                          ZERO_KIND, W_IS_FLOAT, W_SIGNED, W_EXP, W_MAN, W_BIAS, W_SPECIAL, SCALE_IS_CODE, S_IS_FLOAT,
                          S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
    store_output(acc, y_ptr, b_ptr + e64 * stride_be, g_ptr + e64 * stride_ge, ws_ptr, cnt_ptr,
                 tile * tl.num_programs(1) + tl.program_id(1), tl.program_id(2), T, offs_m, offs_n, mask_m, N,
                 stride_ym, SPLIT_K, HAS_BIAS, HAS_GLOBAL)
