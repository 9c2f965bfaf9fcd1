"""Block-scaled tile loop: ``tl.dot_scaled`` on e2m1 / e4m3 operands with their block scales (issue 16).

On SM 10.0 (tcgen05, ``kind::mxf4`` / ``kind::mxf8f6f4`` / ``kind::mxf4nvf4``) and SM 12.0 (block-scaled
``mma.sync``) the tensor cores apply the scales themselves; on older GPUs Triton would emulate the instruction by
upcasting to bf16, which is why the family (``families/dot_scaled.py``) is marked "block_scaled" and never offered
below SM 10.0.  Compiled, not run: no Blackwell GPU has executed it.

Operands, all read in their canonical layout (no per-call repacking):

* weight ``w_ptr``: the ``kpack32`` int32 words of e2m1 codes (8 per word, LSB first along K), read as bytes --
  byte ``j`` of a row holds codes ``2j`` (low nibble) and ``2j + 1`` (high nibble), which is exactly the packed
  e2m1 layout ``tl.dot_scaled`` takes (two codes per uint8, the first in the low bits, packed along K).  Loaded
  [BLOCK_N, BLOCK_K / 2] and transposed to the [K, N] right-hand side (``rhs_k_pack``).  W_FMT 1 (MXFP8): words
  of four e4m3 codes, LSB first, so byte ``j`` is code ``j``: loaded [BLOCK_N, BLOCK_K].
* weight scales ``s_ptr``: uint8 [N, K / G] codes, e8m0 (G = 32) or e4m3 (G = 16, NVFP4) -- the [N, K / G]
  ``rhs_scale`` shape ``tl.dot_scaled`` wants, untransposed.
* activations ``x_ptr``: ``triton_quantize_activation``'s uint8 [M, K] codes, one per byte.  X_FMT 0: e2m1
  codes, packed here two per byte (``lo | hi << 4``) before the MMA; X_FMT 1: e4m3 codes, used as they are.
* activation scales ``xs_ptr``: X_SCALE 1 e8m0 / 2 e4m3 uint8 [M, K / G] codes (``lhs_scale``); X_SCALE 0
  (per-token fp32 scales of e4m3 activations): the ``lhs_scale`` is a constant tile of e8m0 ones and the row
  scale multiplies the accumulator once (with ``lhs_scale=None`` both Triton 3.6 and 3.8 lower the e4m3 x e2m1
  product to a bf16 MMA -- ``tcgen05.mma ... kind::f16`` on sm_100 -- instead of the block-scaled one).
* W_AS_E4M3 (W4A8): the weight's e2m1 codes are widened to e4m3 codes in registers (exact) so that both operands
  are e4m3: sm_120's block-scaled ``mma.sync`` takes e2m1 x e2m1 or e4m3 x e4m3 from Triton 3.6 / 3.8, which
  emulate e4m3 x e2m1 there in bf16 (sm_100 lowers e4m3 x e2m1 natively, ``kind::mxf8f6f4``).

Tiles on a GPU: 128 rows (the family's candidates).  With BLOCK_M = 64 Triton lowers ``tl.dot_scaled`` on sm_100
to an emulated bf16 MMA, and NVFP4 at 64 rows crashes Triton 3.6's AccelerateMatmul pass.

NVFP4's two fp32 global scales (weight and activation) are one multiply of the accumulator (``g_ptr``, their
product, HAS_GLOBAL); bias, cast and split-K are ``decode.store_output``'s.

EMULATE (the interpreter only): the Triton 3.8 interpreter emulates ``tl.dot_scaled`` but reads every scale as
e8m0, so e4m3 (NVFP4) scales are decoded here instead and the operands meet in an fp32 ``tl.dot`` -- the
loads, packing and epilogue are the same code; the MMA itself is not exercised for NVFP4 on CPU.
"""
import triton
import triton.language as tl

from .decode import decode_float, store_output


@triton.jit
def _e2m1_scaled_f32(codes, sc, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, G: tl.constexpr):
    """Unpacked e2m1 codes [ROWS, BLOCK_K] (int32) times their e4m3 block scales [ROWS, BLOCK_K / G], fp32."""
    v = decode_float(codes, 2, 1, 1, True, 0)
    s = decode_float(sc.to(tl.int32), 4, 3, 7, False, 1)
    s3 = tl.broadcast_to(s[:, :, None], (ROWS, BLOCK_K // G, G))
    return v * tl.reshape(s3, (ROWS, BLOCK_K))


@triton.jit
def _e2m1_bytes_to_e4m3(wb, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """Packed e2m1 bytes [ROWS, BLOCK_K / 2] -> e4m3 codes [ROWS, BLOCK_K] (uint8), value for value: a normal
    e2m1 magnitude (e, m) is e4m3 ((e + 6) << 3) | (m << 2), the subnormal 0.5 is 0x30, zero stays 0."""
    c = tl.reshape(tl.join(wb & 15, wb >> 4), (ROWS, BLOCK_K)).to(tl.int32)
    mag = c & 7
    e = mag >> 1
    v = tl.where(e == 0, tl.where(mag == 1, 0x30, 0), ((e + 6) << 3) | ((mag & 1) << 2))
    return (v | ((c & 8) << 4)).to(tl.uint8)


@triton.jit
def dense_scaled_kernel(
    x_ptr, w_ptr, s_ptr, g_ptr, b_ptr, y_ptr, xs_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_wn, stride_sn, stride_ym, stride_xsm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_GLOBAL: tl.constexpr,
    X_FMT: tl.constexpr, X_SCALE: tl.constexpr, W_SCALE: tl.constexpr, SCALE_GROUP: tl.constexpr,
    W_FMT: tl.constexpr, W_AS_E4M3: tl.constexpr, EMULATE: tl.constexpr,
):
    """y [M, N] = x [M, K] @ w[N, K]^T with both operands block-scaled.  ``stride_wn`` counts int32 words and
    ``stride_sn`` / ``stride_xsm`` scale codes; W_SCALE 1 e8m0 / 2 e4m3; SCALE_GROUP 32 (MX) or 16 (NV)."""
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
    mask_m = offs_m < M
    mask_n = offs_n < N
    tiles = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    t_begin = tl.program_id(1) * tiles
    t_end = tl.minimum(t_begin + tiles, tl.cdiv(K, BLOCK_K))

    HALF_K: tl.constexpr = BLOCK_K // 2
    W_BYTES: tl.constexpr = HALF_K if W_FMT == 0 else BLOCK_K  # weight bytes per row per K tile
    GROUPS: tl.constexpr = BLOCK_K // SCALE_GROUP
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    xs_rows = xs_ptr + offs_m[:, None].to(tl.int64) * stride_xsm
    w_rows = w_ptr.to(tl.pointer_type(tl.uint8)) + offs_n[:, None].to(tl.int64) * (4 * stride_wn)
    s_rows = s_ptr + offs_n[:, None].to(tl.int64) * stride_sn
    S_OTHER: tl.constexpr = 127 if W_SCALE == 1 else 0  # e8m0 1.0 / e4m3 0.0 outside K: the codes are 0 there
    X_OTHER: tl.constexpr = 127 if X_SCALE == 1 else 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(t_begin, t_end):
        k0 = t * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        offs_b = (k0 // 2 if W_FMT == 0 else k0) + tl.arange(0, W_BYTES)
        offs_g = k0 // SCALE_GROUP + tl.arange(0, GROUPS)
        if EVEN_K:
            x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None], other=0)
            wb = tl.load(w_rows + offs_b[None, :], mask=mask_n[:, None], other=0)
            sw = tl.load(s_rows + offs_g[None, :], mask=mask_n[:, None], other=S_OTHER)
        else:
            x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & (offs_k[None, :] < K), other=0)
            wb = tl.load(w_rows + offs_b[None, :],
                         mask=mask_n[:, None] & (offs_b[None, :] < (K // 2 if W_FMT == 0 else K)), other=0)
            sw = tl.load(s_rows + offs_g[None, :], mask=mask_n[:, None] & (offs_g[None, :] < K // SCALE_GROUP),
                         other=S_OTHER)
        if X_SCALE != 0:
            if EVEN_K:
                sx = tl.load(xs_rows + offs_g[None, :], mask=mask_m[:, None], other=X_OTHER)
            else:
                sx = tl.load(xs_rows + offs_g[None, :], mask=mask_m[:, None] & (offs_g[None, :] < K // SCALE_GROUP),
                             other=X_OTHER)
        if EMULATE:  # interpreter, e4m3 scales (NVFP4): decode both sides, fp32 dot
            wc = tl.reshape(tl.join(wb & 15, wb >> 4), (BLOCK_N, BLOCK_K)).to(tl.int32)
            wv = _e2m1_scaled_f32(wc, sw, BLOCK_N, BLOCK_K, SCALE_GROUP)
            xv = _e2m1_scaled_f32(x.to(tl.int32), sx, BLOCK_M, BLOCK_K, SCALE_GROUP)
            acc += tl.dot(xv, tl.trans(wv), input_precision="ieee")
        else:
            if W_SCALE == 2:
                sw = sw.to(tl.float8e4nv, bitcast=True)
            if X_FMT == 0:  # e2m1 codes one per byte -> two per byte, the first in the low nibble
                lo, hi = tl.split(tl.reshape(x, (BLOCK_M, HALF_K, 2)))
                xa = lo | (hi << 4)
                if X_SCALE == 2:
                    sx = sx.to(tl.float8e4nv, bitcast=True)
                acc = tl.dot_scaled(xa, sx, "e2m1", tl.trans(wb), sw, "e2m1", acc)
            else:
                if X_SCALE == 0:  # unit e8m0 scales (127 = 1.0): without an lhs_scale Triton emulates the MMA in bf16
                    sx = tl.full((BLOCK_M, GROUPS), 127, tl.uint8)
                if W_FMT == 1:  # MXFP8 x MXFP8
                    acc = tl.dot_scaled(x, sx, "e4m3", tl.trans(wb), sw, "e4m3", acc)
                elif W_AS_E4M3:  # e2m1 -> e4m3 codes (exact): an e4m3 x e4m3 block-scaled MMA
                    acc = tl.dot_scaled(x, sx, "e4m3", tl.trans(_e2m1_bytes_to_e4m3(wb, BLOCK_N, BLOCK_K)), sw,
                                        "e4m3", acc)
                else:
                    acc = tl.dot_scaled(x, sx, "e4m3", tl.trans(wb), sw, "e2m1", acc)
    if X_SCALE == 0:  # per-token fp32 activation scales: constant along K, one multiply of the accumulator
        acc = acc * tl.load(xs_ptr + offs_m.to(tl.int64) * stride_xsm, mask=mask_m, other=0.0)[:, None]
    store_output(acc, y_ptr, b_ptr, g_ptr, ws_ptr, cnt_ptr, pid, tl.program_id(1), M, offs_m, offs_n, mask_m, N,
                 stride_ym, SPLIT_K, HAS_BIAS, HAS_GLOBAL)
