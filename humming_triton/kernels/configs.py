"""Launch configurations: how fast it runs, never what it computes (a tile size cannot change a result
beyond fp32 summation order).

Lookup order: ``autotune_configs/<device-slug>.json`` written by the tuning sweep (``python -m
humming_triton.tune``; exact (M bucket, N, K, scheme) match), then the built-in heuristics below.  Nothing here tunes at run time.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

CONFIG_DIR = Path(os.environ.get("HUMMING_TRITON_CONFIG_DIR", Path(__file__).resolve().parents[2] / "autotune_configs"))
GEMV_MAX_M = 8
NUM_SMS_DEFAULT = 132


@dataclass(frozen=True)
class DenseConfig:
    family: str  # "gemv" | "gemv_words" | "tiled" | "dequant_mm"
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


def m_bucket(m: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(m, 1))))


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


@functools.lru_cache(maxsize=None)
def _tuned(device_slug: str) -> dict:
    path = CONFIG_DIR / f"{device_slug}.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text()).get("dense", {})


DEQUANT_MM_MIN_M = 512  # measured on H200: from here dequantize-once + cuBLAS beats in-tile dequantization


def heuristic(m: int, n: int, k: int, bits: int, num_sms: int = NUM_SMS_DEFAULT, zero_point: bool = False
              ) -> DenseConfig:
    if m <= GEMV_MAX_M:
        bm = m_bucket(m)
        if 32 % bits == 0:  # the word-major GEMV, bm rows sharing each decoded tile (falls back where it cannot run)
            family, bn, bk = "gemv_words", 4, max(128, 1024 // bm)
        else:
            family, bn = "gemv", 8
            bk = 512 if bm == 1 else max(64, 4096 // (bm * bn))
        bk = min(bk, max(32, _pow2_floor(k)))
        programs = -(-n // bn) * -(-m // bm)
        k_tiles = -(-k // bk)
        split = 1  # split K only while the row tiles alone leave the GPU short of ~4 programs per SM
        while programs * split < 4 * num_sms and split * 2 <= max(1, k_tiles // 2):
            split *= 2
        return DenseConfig(family, bm, bn, bk, split, num_warps=4, num_stages=1)
    if m >= DEQUANT_MM_MIN_M:
        return DenseConfig("dequant_mm", 1, 32, 128)
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
    return DenseConfig("tiled", bm, bn, bk, split, 8, warps, stages)


def tuned_key(m: int, n: int, k: int, scheme_name: str) -> str:
    return f"{m_bucket(m)}|{n}|{k}|{scheme_name}"


def choose(m: int, n: int, k: int, bits: int, group_k: int, device_slug: str | None = None,
           num_sms: int = NUM_SMS_DEFAULT, scheme_name: str = "", zero_point: bool = False) -> DenseConfig:
    cfg = None
    if device_slug:
        entry = _tuned(device_slug).get(tuned_key(m, n, k, scheme_name))
        if entry:
            cfg = DenseConfig(**{f: v for f, v in entry.items() if f in DenseConfig.__dataclass_fields__})
    cfg = cfg or heuristic(m, n, k, bits, num_sms, zero_point)
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
            return DenseConfig("dequant_mm", 1, 32, 128)
        return replace(cfg, block_k=bk)
    if m >= DEQUANT_MM_MIN_M and act_dtype != "int8":
        return DenseConfig("dequant_mm", 1, 32, 128)
    bm = 16 if m <= 16 else 64 if m <= 64 else 128
    bn = 64 if m <= 64 else 128
    # 128x128x128 spills on sm_90 (kernels.inspect); 64 does not
    bk = act_block_k(64 if bm == 128 else 128, k, weight_group_k, act_group_k, act_dtype)
    programs = -(-m // bm) * -(-n // bn)
    split = 1
    while programs * split < num_sms and split * 2 <= max(1, -(-k // bk) // 4):
        split *= 2
    return DenseConfig("tiled", bm, bn, bk, split, 8, 4 if bm <= 64 else 8, 3)


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
