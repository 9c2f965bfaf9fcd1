"""Built-in launch heuristics: the config a call gets when dispatch has no measured entry for it (CPU tests
under the interpreter, a GPU never tuned).  How fast it runs, never what it computes.

The measured choice lives in ``autotune_configs/<device>.json`` (written by ``python -m humming_triton.tune``,
read by ``humming_triton.dispatch``); nothing here tunes at run time.
"""
from __future__ import annotations

from dataclasses import replace

from ..calls import KernelConfig, m_bucket  # noqa: F401 -- m_bucket: re-exported for callers

DenseConfig = KernelConfig  # the one config object of every family (old name kept for callers)
GEMV_MAX_M = 8
NUM_SMS_DEFAULT = 132


def _pow2_floor(v: int) -> int:
    return 1 << (max(v, 1).bit_length() - 1)


def fit_block_k(bk: int, group_k: int, k: int, bits: int) -> int:
    """BLOCK_K must tile the scale groups (one divides the other) and start on a packed-word boundary."""
    if group_k < k:
        p = group_k & -group_k  # largest power of two dividing the group
        if p != group_k:
            bk = min(bk, p)
    epw = 32 // bits if 32 % bits == 0 else 1
    return max(bk, epw)


DEQUANT_MM_MIN_M = 512  # measured on H200: from here dequantize-once + cuBLAS beats in-tile dequantization


def heuristic(m: int, n: int, k: int, bits: int, num_sms: int = NUM_SMS_DEFAULT, zero_point: bool = False
              ) -> KernelConfig:
    if m == 1:
        if 32 % bits == 0:  # the word-major GEMV (falls back to the generic one where a word spans two groups)
            family, bn, bk = "gemv_words", 4, 1024
        else:
            family, bn, bk = "gemv", 8, 512
        bk = min(bk, max(32, _pow2_floor(k)))
        programs = -(-n // bn)
        k_tiles = -(-k // bk)
        split = 1  # split K only while the row tiles alone leave the GPU short of ~4 programs per SM
        while programs * split < 4 * num_sms and split * 2 <= max(1, k_tiles // 2):
            split *= 2
        return KernelConfig(family, 1, bn, bk, split, num_warps=4, num_stages=1)
    # M = 2..8 takes the 16-row tiles below: the multi-row word-major GEMV measured 3-13x slower on the H200
    # (2026-12-01 decode suite) and the tiled kernel's time at M = 16 bounds it
    if m >= DEQUANT_MM_MIN_M:
        return KernelConfig("dequant_mm", 1, 32, 128)
    bm = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    bn = 64 if m <= 64 else 128
    # zero points and < 4-bit codes cost registers in the decode: a narrower tile keeps them from spilling
    light = bits >= 4 and not zero_point
    bn = bn if light or m <= 64 else 64
    bk = 128 if m <= 64 and light else 64
    warps = 4 if bm <= 64 else 8
    stages = 3 if bm <= 64 else 4
    if 32 % bits:
        # 3/5/6/7-bit codes are gathered from two words each: smaller tiles, two stages (no register spills
        # and under the 228 KB of shared memory; checked with humming_triton.kernels.inspect)
        bm, bn, bk, warps, stages = (16, 32, 128, 4, 2) if m <= 16 else (64, 64, 64, 4, 2)
    programs = -(-m // bm) * -(-n // bn)
    split = 1
    while programs * split < num_sms and split * 2 <= max(1, -(-k // bk) // 4):
        split *= 2  # mid M: too few output tiles to stream the weight at full bandwidth
    return KernelConfig("tiled", bm, bn, bk, split, 8, warps, stages)


def choose(m: int, n: int, k: int, bits: int, group_k: int, num_sms: int = NUM_SMS_DEFAULT,
           zero_point: bool = False) -> KernelConfig:
    cfg = heuristic(m, n, k, bits, num_sms, zero_point)
    return replace(cfg, block_k=fit_block_k(cfg.block_k, group_k, k, bits))


def grouped_tiles(rows: int, experts: int, bits: int, zero_point: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) of the grouped MoE kernel: 16-row tiles when experts get few rows each
    (decode), 64 otherwise; narrower N tiles where the decode needs more registers (zero points, codes
    that straddle words) -- spill-free on sm_90 per humming_triton.kernels.inspect.grouped_report."""
    bm = 16 if rows <= 16 * experts else 64
    heavy = zero_point or 32 % bits != 0
    return bm, 32 if heavy and bm == 64 else 64, 64


def fp8_config(m: int, n: int, k: int, weight_group_k: int, act_group_k: int,
               num_sms: int = NUM_SMS_DEFAULT, act_dtype: str = "e4m3fn", weight_exact_bf16: bool = True
               ) -> DenseConfig:
    """Tiled config for the fp8 / int8 (activation-quantized) path: both scales multiply partial products, so
    BLOCK_K must divide the weight group and the activation group (fp8 MMAs need K tiles of at least 32).

    e4m3 activations: on the H200 the fp8 wgmma that 64/128-row tiles get does not accumulate exactly in fp32
    (~1 % of outputs came out 2-3x past the exact-product tolerance, even with a 32-wide K tile; 16-row mma.sync
    tiles matched -- scripts/fp8_probe.py).  So 16-row tiles use the fp8 MMA, and larger tiles feed the e4m3
    codes to a bf16 MMA (exact products, exact accumulation; dense.act_kind), up to DEQUANT_MM_MIN_M like the
    WnA16 tiles; from there both operands are dequantized for cuBLAS (``dequant_mm``).  int8 wgmma is exact.
    e2m1 activations (W4A4) run the WnA16 tiles with the activations decoded to bf16 in registers
    (``weight_exact_bf16``: whether every code times its scale is exact in bf16)."""
    if act_dtype == "e2m1":  # W4A4: the bf16 tile loop on decoded activations, where WnA16 would tile
        cfg = heuristic(max(m, GEMV_MAX_M + 1), n, k, 4, num_sms)
        bk = act_block_k(cfg.block_k, k, weight_group_k, act_group_k, act_dtype, weight_exact_bf16)
        if cfg.family == "dequant_mm" or bk is None:
            return KernelConfig("dequant_mm", 1, 32, 128)
        return replace(cfg, family="act_tiled", block_k=bk)
    if m >= DEQUANT_MM_MIN_M and act_dtype != "int8":
        return KernelConfig("dequant_mm", 1, 32, 128)
    bm = 16 if m <= 16 else 64 if m <= 64 else 128
    bn = 64 if m <= 64 else 128
    # 128x128x128 spills on sm_90 (kernels.inspect); 64 does not
    bk = act_block_k(64 if bm == 128 else 128, k, weight_group_k, act_group_k, act_dtype)
    programs = -(-m // bm) * -(-n // bn)
    split = 1
    while programs * split < num_sms and split * 2 <= max(1, -(-k // bk) // 4):
        split *= 2
    return KernelConfig("act_tiled", bm, bn, bk, split, 8, 4 if bm <= 64 else 8, 3)


def act_block_k(bk: int, k: int, weight_group_k: int, act_group_k: int, act_dtype: str,
                weight_exact_bf16: bool = True) -> int | None:
    """The K tile of an activation-quantized tile loop, at most ``bk``; None when no tile fits.

    fp8 / int8: both scales multiply partial products, so the tile divides both groups; fp8/int8 MMAs need
    K >= 32.  e2m1: a whole number of activation groups per tile (x is scaled before the bf16 MMA); when code x
    scale is not exact in bf16 (``weight_exact_bf16`` false, e.g. fp16 scales) and the weight group is at least
    the activation group, one weight group per tile, so that its scale multiplies the fp32 partial product and
    the MMA sees the exact codes (smaller weight groups: the scaled weight is rounded to bf16)."""
    if act_dtype == "e2m1":
        bk = max(fit_block_k(bk, weight_group_k or k, k, 4), act_group_k)
        if not weight_exact_bf16 and weight_group_k and act_group_k <= weight_group_k < min(bk, k):
            bk = weight_group_k & -weight_group_k
        fits = bk % act_group_k == 0 and (not weight_group_k or weight_group_k >= k or weight_group_k % bk == 0
                                          or bk % weight_group_k == 0)
        return bk if fits else None
    for g in (weight_group_k, act_group_k):
        if g and g < k:
            bk = min(bk, g & -g)
    return max(bk, 32)
