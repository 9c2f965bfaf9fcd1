"""Triton device helpers shared by every kernel family (dense GEMV, tiled GEMM, grouped MoE).

One decode helper per element-type family -- integers and ExMy floats -- driven by constexprs from
``format_args.format_constexprs``, plus the tile loaders that read the canonical ``kpack32`` layout:

* ``load_codes``   -> ``[BN, BK]`` int32 codes of rows ``n`` and columns ``k0 .. k0+BK`` of the weight.
* ``dequant_tile`` -> codes -> float32 weight values with zero point, group scales and global scale applied.

Codes are unpacked in registers: for 1/2/4/8 bits each thread loads whole int32 words (16-byte vectors when the
tile allows) and splits them with shifts; 3/5/6/7-bit codes cross word boundaries and are gathered from the two
words they may straddle.

The kernel modules import nothing but triton (no torch, no formats), so that another Triton version can compile
them on their own (scripts/compile_check.py).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def decode_int(c, BITS: tl.constexpr, SIGNED: tl.constexpr):
    """Integer code -> float32 without an I2F (a quarter-rate instruction that bottlenecked decode): OR the
    code into the mantissa of 2**23 and subtract 2**23.  Signed codes are flipped to offset binary first."""
    if SIGNED:
        u = c ^ (1 << (BITS - 1))
        return (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + (1 << (BITS - 1)))
    return (c | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def decode_float(c, EXP: tl.constexpr, MAN: tl.constexpr, BIAS: tl.constexpr, SIGNED: tl.constexpr,
                 SPECIAL: tl.constexpr):
    """ExMy code -> float32, exact.  The magnitude bits shifted into fp32's exponent/mantissa fields read as
    2**(e-127) * 1.m (or the fp32 subnormal 2**-126 * 0.m when e == 0); one multiply by 2**(127 - BIAS)
    rebases the exponent, subnormals included (fp32 multiplies keep subnormals: no flush-to-zero)."""
    if SPECIAL == 3:  # e8m0: 2**(e - 127), no zero; e == 0 is the fp32 subnormal 2**-127
        e = c & 255
        mag = (e << 23).to(tl.float32, bitcast=True)
        mag = tl.where(e == 0, 5.877471754111438e-39, mag)
        return tl.where(e == 255, float("nan"), mag)
    bits = (c & ((1 << (EXP + MAN)) - 1)) << (23 - MAN)
    if SIGNED:
        bits = bits | (((c >> (EXP + MAN)) & 1) << 31)
    v = bits.to(tl.float32, bitcast=True) * (2.0 ** (127 - BIAS))
    if SPECIAL == 1:  # fn: only the all-ones magnitude is NaN
        v = tl.where((c & ((1 << (EXP + MAN)) - 1)) == (1 << (EXP + MAN)) - 1, float("nan"), v)
    if SPECIAL == 2:  # ieee: the top exponent holds Inf (m == 0) and NaN
        e = (c >> MAN) & ((1 << EXP) - 1)
        m = c & ((1 << MAN) - 1)
        v = tl.where(e == (1 << EXP) - 1, tl.where(m == 0, float("inf"), float("nan")), v)
        if SIGNED:
            v = tl.where((e == (1 << EXP) - 1) & (m == 0) & (((c >> (EXP + MAN)) & 1) == 1), float("-inf"), v)
    return v


@triton.jit
def decode(c, BITS: tl.constexpr, IS_FLOAT: tl.constexpr, SIGNED: tl.constexpr, EXP: tl.constexpr,
           MAN: tl.constexpr, BIAS: tl.constexpr, SPECIAL: tl.constexpr):
    if IS_FLOAT:
        return decode_float(c, EXP, MAN, BIAS, SIGNED, SPECIAL)
    return decode_int(c, BITS, SIGNED)


@triton.jit
def load_codes(w_ptr, stride_wn, offs_n, k0, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               BITS: tl.constexpr, EVEN_K: tl.constexpr, SIGNED: tl.constexpr = False):
    """int32 codes [BLOCK_N, BLOCK_K] of weight rows offs_n, columns k0 .. k0 + BLOCK_K (0 outside); SIGNED
    (BITS dividing 32): two's-complement codes, sign-extended."""
    mask_n = offs_n < N
    if 32 % BITS == 0:
        EPW: tl.constexpr = 32 // BITS  # codes per word; BLOCK_K is a multiple of it, k0 word aligned
        WORDS: tl.constexpr = BLOCK_K // EPW
        offs_w = k0 // EPW + tl.arange(0, WORDS)
        ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_w[None, :]
        if EVEN_K:
            words = tl.load(ptrs, mask=mask_n[:, None], other=0)
        else:
            words = tl.load(ptrs, mask=mask_n[:, None] & (offs_w[None, :] < (K + EPW - 1) // EPW), other=0)
        if not SIGNED:
            words = words.to(tl.uint32, bitcast=True)
        codes = tl.reshape(split_words(words, EPW, BITS), (BLOCK_N, BLOCK_K))
        codes = codes.to(tl.int32, bitcast=True)
        if not EVEN_K:
            codes = tl.where((k0 + tl.arange(0, BLOCK_K))[None, :] < K, codes, 0)
        return codes
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        bit = offs_k * BITS
        word = bit // 32
        shift = (bit % 32).to(tl.uint32)
        mask = mask_n[:, None] & (offs_k[None, :] < K)
        row = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
        spill = (shift + BITS) > 32
        lo = tl.load(row + word[None, :], mask=mask, other=0).to(tl.uint32, bitcast=True)
        hi = tl.load(row + word[None, :] + 1, mask=mask & spill[None, :], other=0).to(tl.uint32, bitcast=True)
        # logical shifts on uint32; the high part only where the code spills into the next word
        up = tl.where(spill, 32 - shift, 0).to(tl.uint32)
        hi = tl.where(spill[None, :], hi << up[None, :], 0)
        codes = ((lo >> shift[None, :]) | hi) & ((1 << BITS) - 1)
        return codes.to(tl.int32)


@triton.jit
def _code(words, FIRST: tl.constexpr, BITS: tl.constexpr):
    if words.dtype == tl.int32:  # signed codes: shifted to the top, then an arithmetic shift sign-extends them
        c = (words << (32 - (FIRST + 1) * BITS)) >> (32 - BITS)
    else:
        c = (words >> (FIRST * BITS)) & ((1 << BITS) - 1)
    return c


# codes FIRST, FIRST + STEP, ... of each word on new trailing axes: (even-ranked, odd-ranked) joined, one
# function per count (Triton's dependency hashing does not terminate on a recursive jit function)
@triton.jit
def _codes2(words, FIRST: tl.constexpr, STEP: tl.constexpr, BITS: tl.constexpr):
    return tl.join(_code(words, FIRST, BITS), _code(words, FIRST + STEP, BITS))


@triton.jit
def _codes4(words, FIRST: tl.constexpr, STEP: tl.constexpr, BITS: tl.constexpr):
    return tl.join(_codes2(words, FIRST, 2 * STEP, BITS), _codes2(words, FIRST + STEP, 2 * STEP, BITS))


@triton.jit
def _codes8(words, FIRST: tl.constexpr, STEP: tl.constexpr, BITS: tl.constexpr):
    return tl.join(_codes4(words, FIRST, 2 * STEP, BITS), _codes4(words, FIRST + STEP, 2 * STEP, BITS))


@triton.jit
def _codes16(words, FIRST: tl.constexpr, STEP: tl.constexpr, BITS: tl.constexpr):
    return tl.join(_codes8(words, FIRST, 2 * STEP, BITS), _codes8(words, FIRST + STEP, 2 * STEP, BITS))


@triton.jit
def split_words(words, EPW: tl.constexpr, BITS: tl.constexpr):
    """The EPW codes of each uint32 word as new trailing axes whose flattened index is the code's rank.
    ``tl.join`` puts each new axis in the thread's registers, so the reshape to [rows, K] that follows moves no
    data -- a shift broadcast over a [rows, words, codes] tile made the compiler send every code through shared
    memory (sm_90 SASS of the tiled kernel: 64 STS + 64 LDS per thread per tile before, 8 vector STS after)."""
    if EPW == 1:
        return words
    elif EPW == 2:
        return _codes2(words, 0, 1, BITS)
    elif EPW == 4:
        return _codes4(words, 0, 1, BITS)
    elif EPW == 8:
        return _codes8(words, 0, 1, BITS)
    elif EPW == 16:
        return _codes16(words, 0, 1, BITS)
    else:
        return tl.join(_codes16(words, 0, 2, BITS), _codes16(words, 1, 2, BITS))


@triton.jit
def dequant_tile(w_ptr, s_ptr, z_ptr, stride_wn, stride_sn, stride_sk, stride_zn, stride_zk, offs_n, k0, N, K,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, APPLY_SCALE: tl.constexpr,
                 BITS: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, ZERO_KIND: tl.constexpr,
                 W_IS_FLOAT: tl.constexpr, W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr,
                 W_BIAS: tl.constexpr, W_SPECIAL: tl.constexpr, SCALE_IS_CODE: tl.constexpr,
                 S_IS_FLOAT: tl.constexpr, S_SIGNED: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
                 S_BIAS: tl.constexpr, S_SPECIAL: tl.constexpr):
    """float32 [BLOCK_N, BLOCK_K] weight tile: decode(q) or (q - zero), times the group scale if APPLY_SCALE
    (the global scale is left to the caller: it is one multiply of the accumulator)."""
    c = load_codes(w_ptr, stride_wn, offs_n, k0, N, K, BLOCK_N, BLOCK_K, BITS, EVEN_K)
    if ZERO_KIND == 0:
        v = decode(c, BITS, W_IS_FLOAT, W_SIGNED, W_EXP, W_MAN, W_BIAS, W_SPECIAL)
    else:
        z = load_group_params(z_ptr, stride_zn, stride_zk, offs_n, k0, N, K, BLOCK_K, GROUP_K, GROUP_N)
        v = decode_int(c, BITS, False) - broadcast_groups(z.to(tl.float32), BLOCK_N, BLOCK_K, GROUP_K)
    if APPLY_SCALE:
        s = load_group_params(s_ptr, stride_sn, stride_sk, offs_n, k0, N, K, BLOCK_K, GROUP_K, GROUP_N)
        s = decode_scales(s, SCALE_IS_CODE, S_IS_FLOAT, S_SIGNED, S_EXP, S_MAN, S_BIAS, S_SPECIAL)
        v = v * broadcast_groups(s, BLOCK_N, BLOCK_K, GROUP_K)
    return v


@triton.jit
def load_group_params(p_ptr, stride_pn, stride_pk, offs_n, k0, N, K, BLOCK_K: tl.constexpr,
                      GROUP_K: tl.constexpr, GROUP_N: tl.constexpr):
    """Per-group parameters (scales or zeros) for a [BLOCK_N, BLOCK_K] tile: [BLOCK_N, GROUPS] where GROUPS =
    BLOCK_K // GROUP_K when groups are smaller than the tile, else [BLOCK_N, 1] (one group spans the tile)."""
    rows = (offs_n // GROUP_N).to(tl.int64) * stride_pn
    mask_n = offs_n < N
    if GROUP_K < BLOCK_K:
        GROUPS: tl.constexpr = BLOCK_K // GROUP_K
        g = k0 // GROUP_K + tl.arange(0, GROUPS)
        return tl.load(p_ptr + rows[:, None] + g[None, :] * stride_pk,
                       mask=mask_n[:, None] & (g[None, :] < (K + GROUP_K - 1) // GROUP_K), other=0)
    else:
        return tl.load(p_ptr + rows[:, None] + (k0 // GROUP_K) * stride_pk, mask=mask_n[:, None], other=0)


@triton.jit
def broadcast_groups(p, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_K: tl.constexpr):
    """Expand per-group parameters p (from load_group_params) to a [BLOCK_N, BLOCK_K] tile."""
    if GROUP_K < BLOCK_K:
        GROUPS: tl.constexpr = BLOCK_K // GROUP_K
        p3 = tl.broadcast_to(p[:, :, None], (BLOCK_N, GROUPS, GROUP_K))
        return tl.reshape(p3, (BLOCK_N, BLOCK_K))
    else:
        return tl.broadcast_to(p, (BLOCK_N, BLOCK_K))


@triton.jit
def decode_scales(s, SCALE_IS_CODE: tl.constexpr, S_IS_FLOAT: tl.constexpr, S_SIGNED: tl.constexpr,
                  S_EXP: tl.constexpr, S_MAN: tl.constexpr, S_BIAS: tl.constexpr, S_SPECIAL: tl.constexpr):
    if SCALE_IS_CODE:
        return decode_float(s.to(tl.int32), S_EXP, S_MAN, S_BIAS, S_SIGNED, S_SPECIAL)
    return s.to(tl.float32)


@triton.jit
def store_output(acc, y_ptr, b_ptr, g_ptr, ws_ptr, cnt_ptr, tile, split, M, offs_m, offs_n, mask_m, N, stride_ym,
                 SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_GLOBAL: tl.constexpr):
    """Shared epilogue: global scale, then bias + cast + store.

    SPLIT_K > 1: split-K in one launch, deterministic.  Program ``split`` of output tile ``tile`` stores its fp32
    partial into slice ``split`` of the workspace ``ws_ptr`` ([SPLIT_K, M, N], uninitialised) and bumps the
    tile's counter (``cnt_ptr``, zeroed by the launcher); the program that finds the count at SPLIT_K - 1 is
    the last one, adds the partials in split order and writes the output.  The barrier + acq_rel counter make
    the other programs' partials visible to it (read from L2: .cg).  Before: an fp32 workspace memset, atomics
    and a separate bias/cast kernel -- three launches and a sum order that changed from run to run."""
    if HAS_GLOBAL:
        acc = acc * tl.load(g_ptr)
    mask = mask_m[:, None] & (offs_n[None, :] < N)
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        split64 = split.to(tl.int64)
        plane = (split64 * 0 + M) * N  # int64 even where Triton made M or N a constexpr (== 1)
        ws = ws_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(ws + split64 * plane, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is written before the release below
        done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if done == SPLIT_K - 1:
            total = tl.load(ws, mask=mask, other=0.0, cache_modifier=".cg")
            if acc.numel * SPLIT_K <= 32768:  # decode tiles: unrolled, every partial's load in flight at once
                for s in tl.static_range(1, SPLIT_K):
                    total += tl.load(ws + s * plane, mask=mask, other=0.0, cache_modifier=".cg")
            else:  # large tiles: one partial in registers at a time (unrolled, 128x128x4 spilled)
                for s in range(1, SPLIT_K):
                    total += tl.load(ws + s * plane, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _int4_nibble_16(h, J: tl.constexpr, BF16: tl.constexpr, ASM: tl.constexpr):
    """Nibble J of every int16 element of ``h`` (a signed int4 code) as an exact bf16 / fp16 value.

    ASM: two elements per instruction pair -- the nibbles of both 16-bit halves of a register are masked in place
    and XOR-ed into the mantissa of 128.0 (bf16) / 1024.0 (fp16) by one LOP3 (the XOR with 8 turns two's
    complement into offset binary), and one packed FMA subtracts 136 / 1032: ``code`` exactly.  That is 1 to 1.5
    instructions per weight element against ~5 for the fp32 decode (shift, mask, OR, FADD, F2F pack).  Without
    ASM (the interpreter, which cannot run inline assembly) the same values from plain Triton."""
    if ASM:
        if BF16:
            v = tl.inline_asm_elementwise(
                asm=f"{{ .reg .b32 t, one, off; shr.b32 t, $1, {4 * J}; lop3.b32 t, t, 0x000f000f, 0x43084308, 0x6a; "
                    "mov.b32 one, 0x3f803f80; mov.b32 off, 0xc308c308; fma.rn.bf16x2 $0, t, one, off; }",
                constraints="=r,r", args=[h], dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
            v = tl.inline_asm_elementwise(
                asm=f"{{ .reg .b32 t, one, off; shr.b32 t, $1, {4 * J}; lop3.b32 t, t, 0x000f000f, 0x64086408, 0x6a; "
                    "mov.b32 one, 0x3c003c00; mov.b32 off, 0xe408e408; fma.rn.f16x2 $0, t, one, off; }",
                constraints="=r,r", args=[h], dtype=tl.float16, is_pure=True, pack=2)
    else:
        f = (((h.to(tl.int32) >> (4 * J)) & 15) ^ 8).to(tl.float32) - 8.0
        v = f.to(tl.bfloat16) if BF16 else f.to(tl.float16)
    return v


@triton.jit
def load_int4_tile_16(w_ptr, stride_wn, offs_n, k0, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      EVEN_K: tl.constexpr, BF16: tl.constexpr, ASM: tl.constexpr):
    """Signed int4 codes [BLOCK_N, BLOCK_K] of weight rows offs_n from column k0, as bf16 / fp16 values (no
    scale, no zero point: the caller's POST_SCALE applies the group scale to the partial product).

    The canonical words are read as int16 halves (codes 4h .. 4h+3 of a word sit in its half h), nibble J of
    each half decoded by ``_int4_nibble_16`` and the four results joined on new trailing axes: element
    (n, e, J) is code 4e + J, so the reshape to [BLOCK_N, BLOCK_K] is the K order and moves no data."""
    HALVES: tl.constexpr = BLOCK_K // 4
    offs_h = k0 // 4 + tl.arange(0, HALVES)
    ptrs = w_ptr.to(tl.pointer_type(tl.int16)) + offs_n[:, None].to(tl.int64) * (2 * stride_wn) + offs_h[None, :]
    mask = offs_n[:, None] < N
    if not EVEN_K:
        mask = mask & (offs_h[None, :] < (K + 3) // 4)
    h = tl.load(ptrs, mask=mask, other=0)
    lo = tl.join(_int4_nibble_16(h, 0, BF16, ASM), _int4_nibble_16(h, 2, BF16, ASM))
    hi = tl.join(_int4_nibble_16(h, 1, BF16, ASM), _int4_nibble_16(h, 3, BF16, ASM))
    v = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
    if not EVEN_K:
        v = tl.where((k0 + tl.arange(0, BLOCK_K))[None, :] < K, v, 0.0)
    return v


@triton.jit
def load_int_tile_8(w_ptr, stride_wn, offs_n, k0, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, BITS: tl.constexpr):
    """Signed int4 / int8 codes [BLOCK_N, BLOCK_K] of weight rows offs_n from column k0, as int8 values for an
    int8 MMA (no scale, no zero point: the caller's POST_SCALE applies the group scale).  int8: the bytes as
    they are; int4: each code sign-extended out of its word by two shifts (``load_codes(SIGNED=True)``).  This
    replaces the fp32 round trip (I2F, then F2I back to int8: two quarter-rate conversions per element)."""
    if BITS == 8:
        offs_b = k0 + tl.arange(0, BLOCK_K)
        ptrs = w_ptr.to(tl.pointer_type(tl.int8)) + offs_n[:, None].to(tl.int64) * (4 * stride_wn) + offs_b[None, :]
        mask = offs_n[:, None] < N
        if not EVEN_K:
            mask = mask & (offs_b[None, :] < K)
        v = tl.load(ptrs, mask=mask, other=0)
    else:
        v = load_codes(w_ptr, stride_wn, offs_n, k0, N, K, BLOCK_N, BLOCK_K, BITS, EVEN_K, True).to(tl.int8)
    return v


@triton.jit
def exact_i32_to_f32(v, EXACT: tl.constexpr):
    """int32 -> float32 exactly.  EXACT (|v| <= 2^22, the caller's static bound): one integer add into the
    mantissa of 1.5 * 2^23 and one float subtract, both full rate, instead of the quarter-rate I2F."""
    if EXACT:
        f = (v + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
    else:
        f = v.to(tl.float32)
    return f
