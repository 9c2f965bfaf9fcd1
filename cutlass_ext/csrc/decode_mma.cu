// Weight-only decode GEMM for M <= 16 tokens on mma.sync (sm_80+):  y[M, N] = x[M, K] @ W[N, K]^T.
//
// Why native: at decode the kernel streams the packed weight once and its time is set by instructions per weight
// byte and by the bytes kept in flight (benchmarks/results/h200/ANALYSIS.md).  Here every thread loads its weight
// with one 16-byte load per 64 K straight into registers -- the layout is repacked once at load (repack in
// decode_mma.py) so that the bytes a thread loads are exactly its mma A fragments -- and converts two codes per
// instruction (LOP3 / PRMT into the mantissa of a magic number, one packed subtract).  Tokens sit on the mma's
// N side (8 per n-tile), weight rows on M (16 per warp); warps of one CTA split K and add their partials in a fixed
// order through shared memory: one launch, no workspace, deterministic.
//
// K inside one 64-wide chunk is permuted (the same permutation for x and W, so the product is unchanged): thread
// t of a quad owns logical k in [16 t, 16 t + 16), so its activation operand is two 16-byte loads.  In step s
// (0..3) of a chunk, mma slot kappa = 2t + h maps to k = 16t + 4s + h and kappa = 8 + 2t + h to k = 16t + 4s + 2 + h.
//
// Codes arrive as unsigned offsets u (signed codes are stored with +2^(bits-1)); w = (u - c) * s, with c the zero
// point (or 2^(bits-1)).  (u - c) is an exact small integer in fp16 / bf16, so each scale group's mma partial sum is
// exact up to fp32 accumulation, and the group's scale multiplies the fp32 partial (one FFMA per output element
// per group, never one per weight element).
//
// e4m3 weights (KIND 18, fp16 activations, sm_89+) convert two codes per cvt.rn.f16x2.e4m3x2; e4m3 is a subset of
// fp16, so the products are exact.  Quantized-activation schemes (W8A8, W4A8) run here at decode sizes on their
// activation *codes*: e4m3 / int8 codes are exact in fp16 and in bf16, the per-token activation scale
// multiplies the fp32 result (row_scales), so the products are the same as an fp8 / int8 MMA's and the sums are
// fp32 -- at least as accurate as torch._scaled_mm without fast accumulation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace {

__device__ __forceinline__ uint32_t lop_and_or(uint32_t a, uint32_t mask, uint32_t magic) {
  uint32_t d;  // (a & mask) | magic in one LOP3
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(a), "r"(mask), "r"(magic));
  return d;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

template <typename T>
struct Act;

template <>
struct Act<__half> {
  static constexpr uint32_t MAGIC16 = 0x64006400u;  // 1024.0 in both halves: 1024 + u is exact for u < 1024
  static constexpr float MAGIC = 1024.0f;
  static __device__ __forceinline__ uint32_t add2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("add.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(d) : "f"(lo), "f"(hi));
    return d;
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Act<__nv_bfloat16> {
  static constexpr uint32_t MAGIC16 = 0x43004300u;  // 128.0 in both halves: 128 + u is exact for u < 128
  static constexpr float MAGIC = 128.0f;
  static __device__ __forceinline__ uint32_t add2(uint32_t a, uint32_t b) {
    uint32_t d;  // a * 1 + b: sm_80 has fma.rn.bf16x2 (ptxas makes it an HADD2)
    asm("{ .reg .b32 one;\n"
        "  mov.b32 one, 0x3f803f80;\n"
        "  fma.rn.bf16x2 %0, %1, one, %2; }"
        : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(d) : "f"(lo), "f"(hi));
    return d;
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// The per-row subtrahend of one scale group, in the form the decode of BITS needs.
template <typename T, int BITS>
struct Bias {
  uint32_t g = 0, g8 = 0;  // packed 16-bit -(MAGIC + c) for rows g and g + 8 (int4; int8 with fp16)
  float fg = 0.0f, fg8 = 0.0f;  // 2^23 + c (int8 with bf16: decoded through fp32, 128 + u is not exact in bf16)
  __device__ __forceinline__ void set(float cg, float cg8) {
    if constexpr (BITS == 8 && std::is_same<T, __nv_bfloat16>::value) {
      fg = 8388608.0f + cg;
      fg8 = 8388608.0f + cg8;
    } else {
      g = Act<T>::pack(-(Act<T>::MAGIC + cg), -(Act<T>::MAGIC + cg));
      g8 = Act<T>::pack(-(Act<T>::MAGIC + cg8), -(Act<T>::MAGIC + cg8));
    }
  }
};

// One k16 step: this thread's A fragment from its code word(s).
template <typename T, int BITS>
__device__ __forceinline__ void decode_int4(uint32_t q, const Bias<T, BITS>& b, uint32_t (&a)[4]) {
  // nibble p is the low half of a[p], nibble p + 4 its high half (repack's layout)
  a[0] = Act<T>::add2(lop_and_or(q, 0x000F000Fu, Act<T>::MAGIC16), b.g);
  a[1] = Act<T>::add2(lop_and_or(q >> 4, 0x000F000Fu, Act<T>::MAGIC16), b.g8);
  a[2] = Act<T>::add2(lop_and_or(q >> 8, 0x000F000Fu, Act<T>::MAGIC16), b.g);
  a[3] = Act<T>::add2(lop_and_or(q >> 12, 0x000F000Fu, Act<T>::MAGIC16), b.g8);
}

template <typename T>
__device__ __forceinline__ uint32_t int8_pair(uint32_t q, int lo_byte, uint32_t bias16, float fbias) {
  if constexpr (std::is_same<T, __half>::value) {  // fp16: bytes into the low mantissa of 1024.0
    const uint32_t sel = lo_byte == 0 ? 0x5150u : 0x5352u;
    return Act<T>::add2(prmt(q, 0x64646464u, sel), bias16);
  }
  const uint32_t s0 = lo_byte == 0 ? 0x7440u : 0x7442u, s1 = lo_byte == 0 ? 0x7441u : 0x7443u;
  const float v0 = __uint_as_float(prmt(q, 0x4B000000u, s0)) - fbias;  // 2^23 + u - (2^23 + c)
  const float v1 = __uint_as_float(prmt(q, 0x4B000000u, s1)) - fbias;
  return Act<T>::pack(v0, v1);
}

// e4m3 codes (KIND 18, fp16): bytes 0-1 / 2-3 of a word are the low / high register's halves, as for int8.
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t q, bool high) {
  uint32_t d = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint16_t h = static_cast<uint16_t>(high ? q >> 16 : q);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(h));
#else
  (void)q, (void)high;  // never launched: ht_decode_mma refuses KIND 18 where the binary is older than sm_89
#endif
  return d;
}

__device__ __forceinline__ void decode_e4m3(uint32_t qg, uint32_t qg8, uint32_t (&a)[4]) {
  a[0] = e4m3x2_f16x2(qg, false);
  a[1] = e4m3x2_f16x2(qg8, false);
  a[2] = e4m3x2_f16x2(qg, true);
  a[3] = e4m3x2_f16x2(qg8, true);
}

template <typename T, int BITS>
__device__ __forceinline__ void decode_int8(uint32_t qg, uint32_t qg8, const Bias<T, BITS>& b, uint32_t (&a)[4]) {
  a[0] = int8_pair<T>(qg, 0, b.g, b.fg);
  a[1] = int8_pair<T>(qg8, 0, b.g8, b.fg8);
  a[2] = int8_pair<T>(qg, 2, b.g, b.fg);
  a[3] = int8_pair<T>(qg8, 2, b.g8, b.fg8);
}

// e2m1 (MX / NV FP4).  Bits s e1 e0 m placed at bf16 bits 15 and 8..6 give the value times 2^-126 (e = 0 lands
// in bf16's subnormals, so the map is one and the same for every code); one multiply by the block scale times
// 2^(126 - j) makes it the value times scale times 2^-j, exact (a power of two, or an e4m3 value: the products
// need at most 5 significant bits).  j is per row (repack: e8m0, from the row's largest scale; e4m3: 16), so the
// folded scale stays a bf16 normal; the fp32 result is multiplied by 2^j (the row's channel scale).  Each thread's
// 16 codes of a chunk share one block scale per row (the k permutation keeps a thread's k inside one group of 16
// or 32), so the scale multiplies the weights, not the fp32 partials.
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;  // a * b + (-0): exact where the product is, and -0 keeps the sign of a zero product
  asm("{ .reg .b32 nz;\n  mov.b32 nz, 0x80008000;\n  fma.rn.bf16x2 %0, %1, %2, nz; }" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t e2m1_pair(uint32_t a, uint32_t b, uint32_t scale2) {
  // a: the two magnitudes at bits 6..8 / 22..24, b: their signs at bits 15 / 31 (garbage elsewhere in both)
  uint32_t v;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(v) : "r"(a), "r"(0x01c001c0u), "r"(b & 0x80008000u));  // (a & M) | b
  return bf16x2_mul(v, scale2);  // x scale x 2^(126 - j)
}

__device__ __forceinline__ void decode_e2m1(uint32_t q, uint32_t sg, uint32_t sg8, uint32_t (&a)[4]) {
  // nibble p is the low half of a[p], nibble p + 4 its high half (the int4 layout)
  a[0] = e2m1_pair(q << 6, q << 12, sg);
  a[1] = e2m1_pair(q << 2, q << 8, sg8);
  a[2] = e2m1_pair(q >> 2, q << 4, sg);
  a[3] = e2m1_pair(q >> 6, q, sg8);
}

// Block-scale codes of rows g (low byte) and g + 8 (high byte) -> bf16x2 (S, S) per row, S = scale x 2^(126 - j).
// e8m0: repack stores each code as S's bf16 exponent field, e + 126 - j clamped to 0..255 (0: a block 2^126 under
// its row's largest, whose products an fp32 sum would not keep; 255: the NaN code, inf as before the fold).
template <int KIND>
__device__ __forceinline__ void fp4_scales(uint32_t code16, uint32_t& sg, uint32_t& sg8) {
  if constexpr (KIND == 40) {
    const uint32_t lo = (code16 & 0xffu) << 7, hi = (code16 >> 1) & 0x7f80u;
    sg = lo | (lo << 16);
    sg8 = hi | (hi << 16);
  } else {  // e4m3 x 2^110 (j = 16) -> fp32 -> bf16, exact: 2^-9 .. 448 lands in 2^101 .. 2^119
    float f[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t b = (code16 >> (8 * i)) & 0xffu, e = (b >> 3) & 15u, m = b & 7u;
      const float sub = float(m) * __uint_as_float(228u << 23);  // e = 0: m 2^-9 x 2^110
      float v = e == 0 ? sub : __uint_as_float(((e + 230u) << 23) | (m << 20));
      f[i] = (b & 0x80u) ? -v : v;
    }
    sg = Act<__nv_bfloat16>::pack(f[0], f[0]);
    sg8 = Act<__nv_bfloat16>::pack(f[1], f[1]);
  }
}

enum { DT_F16 = 0, DT_BF16 = 1, DT_F32 = 2 };

__device__ __forceinline__ float load_float(const void* p, size_t i, int dt) {
  if (dt == DT_F32) return static_cast<const float*>(p)[i];
  if (dt == DT_BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ void store_float(void* p, size_t i, float v, int dt) {
  if (dt == DT_F32)
    static_cast<float*>(p)[i] = v;
  else if (dt == DT_BF16)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<__half*>(p)[i] = __float2half_rn(v);
}

__host__ __device__ constexpr int code_loads(int kind) { return kind == 8 || kind == 18 ? 2 : 1; }

struct Params {
  const uint4* w;        // [tiles, chunks, LOADS, 32] x 16 bytes
  const void* x;         // [M, ldx] fp16 / bf16, 16-byte aligned rows
  const float2* scales;  // [tiles, groups, 8] (s[row g], s[row g + 8])
  const float2* zeros;   // same shape, the zero point c per row; null: c = 2^(bits-1) for every row
  const uint16_t* fp4_scales;  // e2m1: [tiles, chunks, 32] block-scale codes of rows (g, g + 8) for each lane
  const void* bias;      // [N] or null, of bias_dtype
  void* y;               // [M, ldy] of out_dtype
  int M, N, K, ldx, ldy;
  int chunks;            // ceil(K / 64)
  int group_chunks;      // chunks per scale group; 0: one scale per row (channel)
  int groups;            // scale groups along K (1 for channel)
  int chunks_per_warp;   // a multiple of group_chunks
  float out_scale;       // multiplies the result (a global weight scale), 1 if none
  const float* row_scales;  // [M] or null: multiplies row m of the result (a per-token activation scale)
  const float* act_scales;  // XG kernels: [M, act_ld] fp32, the activations' scale per token and scale group
  int act_ld;
  int bias_dtype, out_dtype;  // DT_F16 / DT_BF16 / DT_F32
  // grouped (MoE) launches: grid.y = experts; expert e owns rows offsets[e] <= r < offsets[e + 1] of x and y, and
  // every weight array above holds the experts one after another (bias: [E, N]); null offsets: a dense launch
  const void* offsets;
  int offsets_i64;
  const float* out_scales;  // per expert (NVFP4 experts' global scales), or null: out_scale
  int experts;
  // grouped: 0 (GRID_EXPERTS), CTA row y of the grid runs expert y, all its passes in a loop; 1 (GRID_ROWS), the
  // grid has one CTA row per routed row (fewer rows than experts) and CTA row y runs the expert whose rows start at
  // y, if any -- every non-empty expert starts at a distinct row, so no expert is missed and no CTA is launched for
  // an expert without rows (decode: 8 routed rows of 128 experts launched 16x the CTAs that had work); 2
  // (GRID_PASSES), CTA row y runs pass y of all the experts' passes in expert order, one pass per CTA (pass_at)
  int row_grid;
};

// What one pass of the tile loop reads and writes: one expert's weight, up to 8 NT rows of x and y.
struct View {
  const uint4* w;
  const float* row_scales;
  const float* act_scales;
  const float2* scales;
  const float2* zeros;
  const uint16_t* fp4_scales;
  const void* bias;
  const void* x;
  void* y;
  int M;
  float out_scale;
};

// A scale group's partial sums into acc: times the weight's scales of rows g / g + 8 and, with XG, the activations'
// scale of each token in that group (the thread's tokens 2t, 2t + 1 of each token tile).
template <int NT, bool XG>
__device__ __forceinline__ void fold(float (&acc)[NT][4], const float (&part)[NT][4], float2 s, const View& v,
                                     int ld, int grp, int t) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    if constexpr (XG) {
      const int m = 2 * t + 8 * j;
      const float a0 = m < v.M ? v.act_scales[(size_t)m * ld + grp] : 0.0f;
      const float a1 = m + 1 < v.M ? v.act_scales[(size_t)(m + 1) * ld + grp] : 0.0f;
      acc[j][0] += part[j][0] * (s.x * a0), acc[j][1] += part[j][1] * (s.x * a1);
      acc[j][2] += part[j][2] * (s.y * a0), acc[j][3] += part[j][3] * (s.y * a1);
    } else {
      acc[j][0] += part[j][0] * s.x, acc[j][1] += part[j][1] * s.x;
      acc[j][2] += part[j][2] * s.y, acc[j][3] += part[j][3] * s.y;
    }
  }
}

// Two token tiles of 4-bit dense codes: x in ping-pong by half chunks, the kernel bounded to 64 registers (two
// CTAs per SM).  M = 16 ran 3-9 % faster than whole chunks unbounded (session 13); unbounded, half chunks alone
// ran 3-24 % slower.  8-bit codes keep whole chunks unbounded (bounded they spill: 2-5 % slower); so does the
// grouped kernel (bounded it spills 144-360 bytes: MoE 256-token rows 1.6x slower, session 14).
template <int KIND, int NT, bool GROUPED>
__host__ __device__ constexpr bool half_chunk_x() {
  return NT > 1 && !GROUPED && (KIND == 4 || KIND >= 40);
}

// KIND: 4 int4, 8 int8 (codes as unsigned offsets, fp32 group scales), 18 e4m3 (fp16 only), 40 e2m1 + e8m0,
// 41 e2m1 + e4m3 (bf16 only).  XG: activation codes with a scale per token and weight scale group (act_scales).
template <typename T, int KIND, int NT, bool ZERO, int U, bool GROUPED, bool XG = false>
__device__ __forceinline__ void decode_tile(const Params& p, const View& v) {
  constexpr bool FP4 = KIND >= 40;
  constexpr int BITS = FP4 ? 4 : (KIND == 18 ? 8 : KIND);
  constexpr int LOADS = code_loads(KIND);  // 16-byte loads of codes per thread per chunk
  const int lane = threadIdx.x, kw = threadIdx.y, tw = threadIdx.z, KW = blockDim.y;
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * blockDim.z + tw;
  const int tiles = (p.N + 15) >> 4;
  extern __shared__ float red[];  // [TW][KW][32][4 NT]

  float acc[NT][4], part[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = part[j][i] = 0.0f;

  const int c0 = kw * p.chunks_per_warp;
  const int c1 = min(p.chunks, c0 + p.chunks_per_warp);
  float2 s_cur = make_float2(1.0f, 1.0f);
  int grp = 0;  // XG: the scale group of part
  const bool active = tile < tiles && c0 < c1;
  if (active) {
    const uint4* wp = v.w + (size_t)tile * p.chunks * LOADS * 32 + lane;
    const T* xrow[NT];
    bool xok[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      xok[j] = g + 8 * j < v.M;
      xrow[j] = static_cast<const T*>(v.x) + (size_t)(xok[j] ? g + 8 * j : 0) * p.ldx + 16 * t;
    }
    const bool channel = p.group_chunks == 0;
    const float2* sp = v.scales + ((size_t)tile * p.groups + (channel ? 0 : c0 / p.group_chunks)) * 8 + g;
    const float2* zp = ZERO ? v.zeros + (sp - v.scales) : nullptr;
    const float c_sym = float(1 << (BITS - 1));
    if constexpr (!FP4) s_cur = *sp;  // e2m1: read after the loop (2^j of rows g / g + 8, j folded into the scales)
    float2 z_cur = ZERO ? *zp : make_float2(c_sym, c_sym);
    Bias<T, BITS> bias;
    bias.set(z_cur.x, z_cur.y);

    // Steps s0 .. s1 - 1 of one chunk's decode and MMAs into part (shared by every loop shape below); x[h][j]:
    // token tile j's words of steps 2h, 2h + 1.
    auto compute_steps = [&](const uint4 (&wcur)[LOADS], const uint4 (&x)[2][NT], uint32_t scur, int s0, int s1) {
      const uint32_t* wq = reinterpret_cast<const uint32_t*>(wcur);
      uint32_t sg = 0, sg8 = 0;
      if constexpr (FP4) fp4_scales<KIND>(scur, sg, sg8);
#pragma unroll
      for (int s = s0; s < s1; ++s) {
        uint32_t a[4];
        if constexpr (FP4)
          decode_e2m1(wq[s], sg, sg8, a);
        else if constexpr (KIND == 18)
          decode_e4m3(wq[2 * s], wq[2 * s + 1], a);
        else if constexpr (BITS == 4)
          decode_int4(wq[s], bias, a);
        else
          decode_int8(wq[2 * s], wq[2 * s + 1], bias, a);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint32_t* xr = reinterpret_cast<const uint32_t*>(&x[s >> 1][j]) + 2 * (s & 1);
          Act<T>::mma(part[j], a, xr[0], xr[1]);
        }
      }
    };
    auto compute = [&](const uint4 (&wcur)[LOADS], const uint4 (&x)[2][NT], uint32_t scur) {
      compute_steps(wcur, x, scur, 0, 4);
    };
    // A scale group ends (never after the range's last chunk: that fold follows the loop): scale its partials.
    auto end_group = [&]() {
      fold<NT, XG>(acc, part, s_cur, v, p.act_ld, grp++, t);
#pragma unroll
      for (int j = 0; j < NT; ++j) part[j][0] = part[j][1] = part[j][2] = part[j][3] = 0.0f;
      sp += 8;
      s_cur = *sp;
      if constexpr (ZERO) {
        zp += 8;
        z_cur = *zp;
        bias.set(z_cur.x, z_cur.y);
      }
    };
    const uint16_t* s_base = FP4 ? v.fp4_scales + (size_t)tile * p.chunks * 32 + lane : nullptr;
    // x past K must read as zero (the padded codes there are not zero values); a token slot past M loads nothing
    // and keeps the zeros its registers start with (measured faster at M = 1 than every lane reading row 0).
    const int full_chunks = p.K >> 6, k_lane = p.K - 16 * t;
    if constexpr (XG) grp = c0 / p.group_chunks;

    if constexpr (U % 2 == 1) {
      // D = U + 1 weight register sets, the loop unrolled by D so that none is ever copied: while chunk c is
      // computed from set c % D, chunks c + 1 .. c + U are in flight (the set of chunk c - 1 was refilled with
      // chunk c + U just before), and x, an L1 / L2 hit, is in ping-pong one chunk ahead.  U = 1 keeps 512 bytes
      // per warp in flight; U = 3 1.5 KB (two token tiles, few warps per SM: 1-6 % faster, session 12).  The loop covers the
      // whole chunks; a partial last chunk (K % 64, channel scales only: a scale group is whole chunks) follows it
      // with its x masked.  Group ends: GE = 0 none (channel scales), 2 only after every second chunk (an even
      // number of chunks per group: the range starts on a group boundary), 1 after every chunk.
      constexpr int D = U + 1;
      constexpr bool XH = half_chunk_x<KIND, NT, GROUPED>();
      const int cfull = min(c1, full_chunks);
      // running pointers, advanced D chunks per iteration: the loads address them with constant offsets
      const uint4* wq = wp + (size_t)c0 * LOADS * 32;
      const uint16_t* sq = FP4 ? s_base + (size_t)c0 * 32 : nullptr;
      const T* xq[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) xq[j] = xrow[j] + c0 * 64;
      uint4 wb[D][LOADS], xb[2][2][NT];
      uint32_t sb[D];
#pragma unroll
      for (int d = 0; d < D; ++d) sb[d] = 0;
#pragma unroll
      for (int j = 0; j < NT; ++j) xb[0][0][j] = xb[0][1][j] = xb[1][0][j] = xb[1][1][j] = make_uint4(0, 0, 0, 0);
      // chunk (iteration start) + d into a register set
      auto load_w = [&](uint4 (&w)[LOADS], uint32_t& sc, int d) {
#pragma unroll
        for (int l = 0; l < LOADS; ++l) w[l] = __ldcs(wq + (d * LOADS + l) * 32);
        if constexpr (FP4) sc = __ldcs(sq + d * 32);
      };
      // in_k false only for the lanes past K of a partial chunk
      auto load_x = [&](uint4 (&xv)[2][NT], int d, bool in_k) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
          if (xok[j] && in_k) {
            const uint4* xp = reinterpret_cast<const uint4*>(xq[j] + d * 64);
            xv[0][j] = __ldg(xp);
            xv[1][j] = __ldg(xp + 1);
          }
      };
      // XH (two token tiles): x in ping-pong by half chunks -- half h (steps 2h, 2h + 1) always in buffer h, loaded
      // two steps ahead -- 4 NT registers of x in flight instead of 16 NT, so that two 512-thread CTAs fit an SM
      uint4 xh[2][NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) xh[0][j] = xh[1][j] = make_uint4(0, 0, 0, 0);
      auto load_xh = [&](uint4 (&xv)[NT], int d, int h) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
          if (xok[j]) {
            xv[j] = __ldg(reinterpret_cast<const uint4*>(xq[0] + j * 8 * p.ldx + d * 64) + h);  // one pointer live
          }
      };
      auto advance = [&]() {
        wq += D * LOADS * 32;
        if constexpr (FP4) sq += D * 32;
#pragma unroll
        for (int j = 0; j < NT; ++j) xq[j] += D * 64;
      };
      auto run = [&](auto ge) {
        constexpr int GE = decltype(ge)::value;
        const int per = GE == 2 ? p.group_chunks >> 1 : p.group_chunks;  // pairs (GE 2) or chunks per group
        int left = per;
        const int n = cfull - c0;
#pragma unroll
        for (int d = 0; d < U; ++d)
          if (d < n) load_w(wb[d], sb[d], d);
        if (n > 0) {
          if constexpr (XH)
            load_xh(xh[0], 0, 0);
          else
            load_x(xb[0], 0, true);
        }
        for (int i = 0; i < n; i += D) {
#pragma unroll
          for (int q = 0; q < D; ++q) {
            if (q > 0 && i + q >= n) break;
            if (i + q + U < n) load_w(wb[(q + U) % D], sb[(q + U) % D], q + U);
            if constexpr (XH) {
              load_xh(xh[1], q, 1);  // buffer 1 is free: the previous chunk's steps 2-3 are done
              compute_steps(wb[q], xh, sb[q], 0, 2);
              if (i + q + 1 < n) load_xh(xh[0], q + 1, 0);  // steps 0-1 are done with buffer 0
              compute_steps(wb[q], xh, sb[q], 2, 4);
            } else {
              if (i + q + 1 < n) load_x(xb[(q + 1) & 1], q + 1, true);
              compute(wb[q], xb[q & 1], sb[q]);
            }
            if (GE == 1 || (GE == 2 && q % 2 == 1)) {  // q is unrolled: resolved at compile time
              if (--left == 0 && c0 + i + q + 1 < c1) left = per, end_group();
            }
          }
          advance();
        }
      };
      if (channel)
        run(std::integral_constant<int, 0>{});
      else if ((p.group_chunks & 1) == 0)
        run(std::integral_constant<int, 2>{});
      else
        run(std::integral_constant<int, 1>{});
      if (cfull < c1) {  // the partial last chunk, fresh registers (its lanes past K must read zeros)
        wq = wp + (size_t)cfull * LOADS * 32;
        if constexpr (FP4) sq = s_base + (size_t)cfull * 32;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          xq[j] = xrow[j] + cfull * 64;
          xb[0][0][j] = xb[0][1][j] = make_uint4(0, 0, 0, 0);
        }
        load_w(wb[0], sb[0], 0);
        load_x(xb[0], 0, cfull * 64 < k_lane);
        compute(wb[0], xb[0], sb[0]);
      }
    } else {
      // U >= 2 (even): the weight streams U chunks ahead through a ring of registers, each slot refilled right
      // after its chunk is consumed, and x (L1 / L2 hits) is double-buffered one chunk ahead.
      const uint4* wnext = wp + (size_t)c0 * LOADS * 32;
      const T* xnext[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) xnext[j] = xrow[j] + c0 * 64;
      int xchunk = c0;  // the chunk load_x reads next
      uint4 wb[U][LOADS], xb[2][2][NT];
      uint32_t sb[U];  // e2m1: the block-scale codes of each chunk in flight
      const uint16_t* snext = FP4 ? s_base + (size_t)c0 * 32 : nullptr;
      auto load_w = [&](uint4 (&w)[LOADS], uint32_t& sc) {
#pragma unroll
        for (int l = 0; l < LOADS; ++l) w[l] = __ldcs(wnext + l * 32);
        wnext += LOADS * 32;
        if constexpr (FP4) {
          sc = __ldcs(snext);
          snext += 32;
        }
      };
      auto load_x = [&](uint4 (&xv)[2][NT]) {
        const bool in_k = xchunk < full_chunks || xchunk * 64 < k_lane;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint4* xp = reinterpret_cast<const uint4*>(xnext[j]);
          if (xok[j] && in_k) {
            xv[0][j] = __ldg(xp);
            xv[1][j] = __ldg(xp + 1);
          } else {
            xv[0][j] = xv[1][j] = make_uint4(0, 0, 0, 0);
          }
          xnext[j] += 64;
        }
        ++xchunk;
      };
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (c0 + u < c1) load_w(wb[u], sb[u]);
      load_x(xb[0]);
      int left = channel ? 0x7fffffff : p.group_chunks;  // chunks until the current scale group ends
      for (int c = c0; c < c1; c += U) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int cc = c + u;
          if (cc < c1) {  // (cc - c0) % 2 == u % 2: U is even
            if (cc + 1 < c1) load_x(xb[(u + 1) & 1]);
            compute(wb[u], xb[u & 1], sb[u]);
            if (cc + U < c1) load_w(wb[u], sb[u]);
            if (--left == 0 && cc + 1 < c1) left = p.group_chunks, end_group();
          }
        }
      }
    }
  }
  // the last (or only) group's partials (an idle warp's are zero: XG must not read a group past the last)
  if constexpr (FP4) {
    if (tile < tiles) s_cur = v.scales[(size_t)tile * 8 + g];  // channel: one group
  }
  if (!XG || active) fold<NT, XG>(acc, part, s_cur, v, p.act_ld, grp, t);
  if (KW > 1) {
    float* mine = red + ((size_t)(tw * KW + kw) * 32 + lane) * 4 * NT;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) mine[4 * j + i] = acc[j][i];
    __syncthreads();
    if (kw == 0) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
      for (int r = 0; r < KW; ++r) {  // fixed order: the result does not depend on scheduling
        const float* theirs = red + ((size_t)(tw * KW + r) * 32 + lane) * 4 * NT;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[j][i] += theirs[4 * j + i];
      }
    }
    if constexpr (GROUPED) __syncthreads();  // the next pass reuses the buffer
    if (kw != 0) return;
  }
  if (tile >= tiles) return;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = tile * 16 + g + 8 * (i >> 1), m = 2 * t + (i & 1) + 8 * j;
      if (n < p.N && m < v.M) {
        float r = acc[j][i] * v.out_scale;
        if (v.row_scales != nullptr) r *= v.row_scales[m];
        if (v.bias != nullptr) r += load_float(v.bias, n, p.bias_dtype);
        store_float(v.y, (size_t)m * p.ldy + n, r, p.out_dtype);
      }
    }
}

// Dense and grouped launches are separate kernels: registers are allocated per kernel, and the grouped pass loop
// in the dense kernel took it from 64 to the 128 cap (measured: M = 1 rows 17-36 % slower on the H200).
// One token tile is bounded to 64 registers (two 512-thread CTAs per SM): without the bound the ping-pong loop took
// int8 to 71 and the grouped kernel to 104, and those M = 8 / 128 MoE rows ran 4-18 % slower (session 11).  Two
// tiles are bounded only with half-chunk x (half_chunk_x): with whole chunks in flight, capped at 64 they
// rematerialise (+33 % loop instructions, 30-100 % slower, session 10).
// HT_DENSE_NT2_REGS (an experiment's build, --decode-defines; 0 = off): the half-chunk two-tile kernels capped at
// that many registers (one 512-thread CTA per SM) instead of 64 -- at 64 the M = 16 MXFP4 / NVFP4 configs the H200
// table picks spill 108 bytes (ptxas -v, session 30); untimed.
#ifndef HT_DENSE_NT2_REGS
#define HT_DENSE_NT2_REGS 0
#endif
template <int KIND, int NT>
constexpr bool dense_capped() { return HT_DENSE_NT2_REGS > 0 && NT == 2 && half_chunk_x<KIND, NT, false>(); }
template <typename T, int KIND, int NT, bool ZERO, int U, bool XG>
__global__ void
__launch_bounds__(512, (NT == 1 || half_chunk_x<KIND, NT, false>()) && !dense_capped<KIND, NT>() ? 2 : 1)
    __maxnreg__((dense_capped<KIND, NT>() ? HT_DENSE_NT2_REGS : 128)) decode_mma_kernel(const Params p) {
  const View v{p.w, p.row_scales, p.act_scales, p.scales, p.zeros, p.fp4_scales, p.bias, p.x, p.y, p.M,
               p.out_scale};
  decode_tile<T, KIND, NT, ZERO, U, false, XG>(p, v);
}

__device__ __forceinline__ long long row_offset(const Params& p, int e) {
  return p.offsets_i64 ? static_cast<const long long*>(p.offsets)[e] : static_cast<const int*>(p.offsets)[e];
}

// row_grid: the expert whose rows start at routed row y, or -1.  The expert holding row y is the number of experts
// that end at or before it (offsets are sorted); the whole CTA counts them together, one barrier per blockDim experts.
__device__ __forceinline__ int expert_starting_at(const Params& p, long long y) {
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  int ended = 0;
  for (int base = 0; base < p.experts; base += threads) {
    const int i = base + tid;
    ended += __syncthreads_count(i < p.experts && row_offset(p, i + 1) <= y);
  }
  return ended < p.experts && row_offset(p, ended) == y ? ended : -1;
}

// Pass grid: the expert and first row of pass y (ROWS rows of one expert; the experts' passes in expert order), or
// -1 past the last pass.  Each lane counts the passes of RUN consecutive experts (their offsets loaded at once: one
// memory latency per 32 RUN experts, not one per 32), a warp scan places the lanes' runs, and the lane whose run
// holds pass y finds the expert.  Every warp does the same (no barrier) and finds the same pass.
template <int ROWS>
__device__ __forceinline__ int pass_at(const Params& p, int y, long long& m0) {
  constexpr int RUN = 8;
  const int lane = threadIdx.x;  // blockDim.x == 32
  int before = 0;                // passes of the experts before this round
  for (int base = 0; base < p.experts && before <= y; base += 32 * RUN) {
    const int i0 = base + lane * RUN;
    long long off[RUN + 1];
#pragma unroll
    for (int j = 0; j <= RUN; ++j) off[j] = row_offset(p, min(i0 + j, p.experts));  // past the last: no passes
    int n[RUN], total = 0;
#pragma unroll
    for (int j = 0; j < RUN; ++j) total += n[j] = (int)((off[j + 1] - off[j] + ROWS - 1) / ROWS);
    int s = total;  // inclusive prefix sum over the lanes
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int t = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s += t;
    }
    const int first = before + s - total;  // the lane's first pass
    const unsigned hit = __ballot_sync(0xffffffffu, first <= y && y < first + total);
    if (hit) {
      const int src = __ffs(hit) - 1;
      int e = 0;
      long long row = 0;
      if (lane == src) {
        int f = first;
#pragma unroll
        for (int j = 0; j < RUN; ++j) {
          if (f <= y && y < f + n[j]) e = i0 + j, row = off[j] + (long long)(y - f) * ROWS;
          f += n[j];
        }
      }
      m0 = __shfl_sync(0xffffffffu, row, src);
      return __shfl_sync(0xffffffffu, e, src);
    }
    before += __shfl_sync(0xffffffffu, s, 31);
  }
  return -1;
}

// ROWS: the row grid (p.row_grid), a kernel of its own so that the expert grid's build is unchanged (the lookup in
// the same kernel took every grouped build 8-48 bytes more stack); one token tile only, where rows < experts.
// HT_GROUPED_NT1_REGS: one token tile of w4a16 (int4 codes, no zero points, bf16 activations: what was timed)
// capped at that many registers; every other kind, and 0, keeps the bound before session 30 (two 512-thread CTAs per
// SM: 64).  Why 80: at 64 the grouped pass loop spills where the dense kernel does not (sm_90, int4 bf16: U = 1 236
// bytes, U = 3 544; ptxas -v, session 26); at 80, U = 1 spills 40 and U = 2 none.  Timed on the H200 (session 30,
// scripts/grouped_probe.py --sweep, both builds in one run, w4a16): the table's configs 4-13 % faster at Qwen3 /
// Mixtral 16-64 tokens.  MXFP4 / NVFP4 / int8 / e4m3 / zero-point / fp16 kernels spill too but were not timed
// capped.  Another value: python3 -m cutlass_ext.build --decode-defines.
#ifndef HT_GROUPED_NT1_REGS
#define HT_GROUPED_NT1_REGS 80
#endif
// HT_GROUPED_NT1_ALL=1 (an experiment's build): the cap on every kind's one-token-tile kernel, for their A/B
#ifndef HT_GROUPED_NT1_ALL
#define HT_GROUPED_NT1_ALL 0
#endif
template <typename T, int KIND, bool ZERO>
constexpr int grouped_nt1_regs() {
  constexpr bool w4a16 = std::is_same<T, __nv_bfloat16>::value && KIND == 4 && !ZERO;
  return HT_GROUPED_NT1_REGS > 0 && (HT_GROUPED_NT1_ALL || w4a16) ? HT_GROUPED_NT1_REGS : 64;
}
// the capped kernels: __maxnreg__; the others keep exactly the bound they were timed with (two CTAs per SM)
#define HT_GROUPED_BOUNDS __launch_bounds__(512, NT == 1 && grouped_nt1_regs<T, KIND, ZERO>() == 64 ? 2 : 1) \
  __maxnreg__((NT == 1 ? grouped_nt1_regs<T, KIND, ZERO>() : 128))
// GRID: GRID_EXPERTS / GRID_ROWS / GRID_PASSES (Params::row_grid).  The pass grid runs one pass per CTA, with no
// loop around the tile: a loop around decode_tile (any loop, even one that breaks after its first pass) costs the
// one-token-tile kernels 36-1100 bytes of spills under their register bounds, a single pass 0-36 (ptxas -v, sm_90,
// session 31: MXFP4 U = 1 356 -> 8, int8 U = 1 576 -> 12, w4a16 U = 1 at 80 registers 40 -> 0, using 75).
enum { GRID_EXPERTS = 0, GRID_ROWS = 1, GRID_PASSES = 2 };
template <typename T, int KIND, int NT, bool ZERO, int U, int GRID>
__global__ void HT_GROUPED_BOUNDS decode_mma_grouped_kernel(const Params p) {
  constexpr int LOADS = code_loads(KIND);
  View v{p.w, p.row_scales, nullptr, p.scales, p.zeros, p.fp4_scales, p.bias, p.x, p.y, p.M, p.out_scale};
  long long first = 0;  // GRID_PASSES: the pass's first row
  const int e = GRID == GRID_ROWS     ? expert_starting_at(p, blockIdx.y)
                : GRID == GRID_PASSES ? pass_at<8 * NT>(p, blockIdx.y, first)
                                      : (int)blockIdx.y;
  if (e < 0) return;  // no expert starts at this row / no pass here: the whole CTA leaves together
  const long long r0 = GRID == GRID_PASSES ? first : row_offset(p, e), r1 = row_offset(p, e + 1);
  if (r1 <= r0) return;  // no rows routed to this expert: the whole CTA leaves together
  const size_t tiles = (p.N + 15) / 16;
  v.w += (size_t)e * tiles * p.chunks * LOADS * 32;
  v.scales += (size_t)e * tiles * p.groups * 8;
  if (ZERO) v.zeros += (size_t)e * tiles * p.groups * 8;
  if (KIND >= 40) v.fp4_scales += (size_t)e * tiles * p.chunks * 32;
  if (p.bias != nullptr)
    v.bias = static_cast<const char*>(p.bias) + (size_t)e * p.N * (p.bias_dtype == DT_F32 ? 4 : 2);
  if (p.out_scales != nullptr) v.out_scale = p.out_scales[e];
  const size_t ysz = p.out_dtype == DT_F32 ? 4 : 2;
  for (long long m0 = r0; m0 < r1; m0 += 8 * NT) {  // 8 NT rows per pass; the weight tile re-streams from L2
    v.M = (int)min((long long)(8 * NT), r1 - m0);
    v.x = static_cast<const T*>(p.x) + m0 * p.ldx;
    v.y = static_cast<char*>(p.y) + m0 * p.ldy * ysz;
    if (p.row_scales != nullptr) v.row_scales = p.row_scales + m0;
    decode_tile<T, KIND, NT, ZERO, U, true>(p, v);
    if constexpr (GRID == GRID_PASSES) break;  // one pass per CTA: no back edge, no spills
  }
}

template <typename T, int BITS, int NT, bool ZERO, int U, bool XG>
cudaError_t launch(const Params& p, int experts, int kw, int tw, cudaStream_t stream) {
  const int tiles = (p.N + 15) / 16;
  dim3 block(32, kw, tw), grid((tiles + tw - 1) / tw, experts);
  const size_t smem = kw > 1 ? (size_t)tw * kw * 32 * 4 * NT * sizeof(float) : 0;
  if constexpr (XG) {  // dense launches only
    decode_mma_kernel<T, BITS, NT, ZERO, U, true><<<grid, block, smem, stream>>>(p);
  } else if constexpr (NT == 4) {  // 32 rows per pass: grouped launches only (dense M is at most 16)
    if (p.offsets == nullptr) return cudaErrorInvalidValue;
    if (p.row_grid == GRID_PASSES)
      decode_mma_grouped_kernel<T, BITS, NT, ZERO, U, GRID_PASSES><<<grid, block, smem, stream>>>(p);
    else
      decode_mma_grouped_kernel<T, BITS, NT, ZERO, U, GRID_EXPERTS><<<grid, block, smem, stream>>>(p);
  } else {
    if (p.offsets == nullptr)
      decode_mma_kernel<T, BITS, NT, ZERO, U, false><<<grid, block, smem, stream>>>(p);
    else if (p.row_grid == GRID_ROWS)
      decode_mma_grouped_kernel<T, BITS, NT, ZERO, U, NT == 1 ? GRID_ROWS : GRID_EXPERTS><<<grid, block, smem, stream>>>(p);
    else if (p.row_grid == GRID_PASSES)
      decode_mma_grouped_kernel<T, BITS, NT, ZERO, U, GRID_PASSES><<<grid, block, smem, stream>>>(p);
    else
      decode_mma_grouped_kernel<T, BITS, NT, ZERO, U, GRID_EXPERTS><<<grid, block, smem, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T, int BITS, int NT, bool ZERO, bool XG = false>
cudaError_t pick_unroll(const Params& p, int experts, int unroll, int kw, int tw, cudaStream_t s) {
  switch (unroll) {
    case 1: return launch<T, BITS, NT, ZERO, 1, XG>(p, experts, kw, tw, s);
    case 2: return launch<T, BITS, NT, ZERO, 2, XG>(p, experts, kw, tw, s);
    case 3:  // four token tiles: one or two chunks in flight only (registers)
      if constexpr (NT < 4) return launch<T, BITS, NT, ZERO, 3, XG>(p, experts, kw, tw, s);
      return cudaErrorInvalidValue;
    case 4:
      if constexpr (NT < 4) return launch<T, BITS, NT, ZERO, 4, XG>(p, experts, kw, tw, s);
      return cudaErrorInvalidValue;
    case 8:  // two token tiles with eight chunks in flight: not built (registers)
      if constexpr (NT == 1 && !XG) return launch<T, BITS, NT, ZERO, 8, XG>(p, experts, kw, tw, s);
      return cudaErrorInvalidValue;
    default: return cudaErrorInvalidValue;
  }
}

// Activation codes with group scales (XG): e4m3 and int8 weights with fp16 codes (W8A8 with g<K> activation
// scales), dense launches, one or two token tiles.
template <int BITS>
cudaError_t pick_act_groups(const Params& p, int nt, int unroll, int kw, int tw, cudaStream_t s) {
  if (nt == 1) return pick_unroll<__half, BITS, 1, false, true>(p, 1, unroll, kw, tw, s);
  if (nt == 2) return pick_unroll<__half, BITS, 2, false, true>(p, 1, unroll, kw, tw, s);
  return cudaErrorInvalidValue;
}

template <typename T, int BITS>
cudaError_t pick_rest(const Params& p, int experts, int nt, bool zero, int unroll, int kw, int tw, cudaStream_t s) {
  // e4m3 and e2m1 have no zero points (the else keeps their ZERO kernels from being instantiated at all)
  if constexpr (BITS >= 18) {
    if (nt == 1) return pick_unroll<T, BITS, 1, false>(p, experts, unroll, kw, tw, s);
    if (nt == 2) return pick_unroll<T, BITS, 2, false>(p, experts, unroll, kw, tw, s);
    if (nt == 4) return pick_unroll<T, BITS, 4, false>(p, experts, unroll, kw, tw, s);
  } else {
    if (nt == 1) return zero ? pick_unroll<T, BITS, 1, true>(p, experts, unroll, kw, tw, s)
                             : pick_unroll<T, BITS, 1, false>(p, experts, unroll, kw, tw, s);
    if (nt == 2) return zero ? pick_unroll<T, BITS, 2, true>(p, experts, unroll, kw, tw, s)
                             : pick_unroll<T, BITS, 2, false>(p, experts, unroll, kw, tw, s);
    if (nt == 4) return zero ? pick_unroll<T, BITS, 4, true>(p, experts, unroll, kw, tw, s)
                             : pick_unroll<T, BITS, 4, false>(p, experts, unroll, kw, tw, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

extern "C" {

// 5: e8m0 block-scale codes carry 126 - j (repack); 6: one struct argument (ctypes converts each argument of a
// call: 33 of them cost ~8 µs of host time per launch on this project's CPUs, a struct pointer ~1.3); 7: routed_rows;
// 8: grid (the pass grid)
int ht_decode_mma_abi() { return 8; }

// One launch's arguments, in this order (cutlass_ext/native.py's DecodeCall mirrors it field for field).
struct HtDecodeCall {
  int device, dtype, bits, zero, unroll, kw, tw;
  const void *w, *x, *scales, *zeros, *fp4_scales, *bias;
  int bias_dtype;
  void* y;
  int out_dtype, M, N, K, ldx, ldy, group_chunks, groups, chunks_per_warp;
  float out_scale;
  const float *row_scales, *act_scales;
  int act_ld;
  const void* offsets;
  int offsets_i64, experts;
  const float* out_scales;
  int routed_rows;  // grouped: the rows of x (grid 1 and 2), else 0
  int grid;         // grouped: 0 a CTA row per expert, 1 per routed row (taken below experts rows), 2 per pass
  void* stream;
};

// dtype (the activations'): 0 fp16, 1 bf16; bias_dtype / out_dtype: 0 fp16, 1 bf16, 2 fp32; bits: 4, 8, 18 (e4m3,
// fp16 activations, sm_89+), 40 (e2m1 + e8m0), 41 (e2m1 + e4m3).  row_scales: null, or [M] fp32 multiplying the
// rows of the result (dense launches; grouped: [rows] of x).  act_scales: null, or [M, act_ld] fp32 scales of
// activation codes per token and weight scale group (dense, fp16, int8 / e4m3 weights with group scales).
// Returns a cudaError_t (0: launched).
// device: the CUDA device of every pointer and of stream (this library's runtime keeps its own current device).
// Grouped (MoE): offsets [experts + 1] (int32, or int64 when offsets_i64) of x / y rows per expert, every weight
// array expert-major; M is then the rows per pass (8: one token tile, 16: two, 32: four -- unroll 1 or 2 only),
// any number of rows per expert.  grid: the grouped launch's CTA rows -- 0, one per expert (each runs all its
// passes); 1, one per routed row, where routed_rows < experts (one token tile only), else 0; 2, one per pass: at
// most routed_rows / M + min(experts, routed_rows) of them (each expert wastes less than one pass), else 0 where
// that exceeds the grid's 65535 rows.
int ht_decode_mma(const HtDecodeCall* call) {
  const auto [device, dtype, bits, zero, unroll, kw, tw, w, x, scales, zeros, fp4_scales, bias, bias_dtype, y,
              out_dtype, M, N, K, ldx, ldy, group_chunks, groups, chunks_per_warp, out_scale, row_scales,
              act_scales, act_ld, offsets, offsets_i64, experts, out_scales, routed_rows, grid, stream] = *call;
  if (M < 1 || M > (offsets == nullptr ? 16 : 32) || kw < 1 || tw < 1 || 32 * kw * tw > 512 || experts < 1)
    return cudaErrorInvalidValue;  // grouped launches: M is the rows per pass (8, 16 or 32)
  if (bits >= 40 && (dtype != 1 || zero)) return cudaErrorInvalidValue;  // e2m1: bf16 activations, no zero point
  if (bits == 18 && (dtype != 0 || zero)) return cudaErrorInvalidValue;  // e4m3: fp16 activations, no zero point
  if (bias_dtype < 0 || bias_dtype > 2 || out_dtype < 0 || out_dtype > 2) return cudaErrorInvalidValue;
  if (act_scales != nullptr && (offsets != nullptr || dtype != 0 || zero || (bits != 8 && bits != 18) ||
                                group_chunks < 1 || act_ld < groups))
    return cudaErrorInvalidValue;  // group scales of activation codes: dense, fp16, int8 / e4m3, grouped weight
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return err;
  if (bits == 18) {  // cvt.rn.f16x2.e4m3x2 is sm_89+: the binary this device runs must have been built for it
    cudaFuncAttributes attr;  // (an sm_89 GPU runs the sm_80 cubin of an 80,90 build, whose e4m3 decode is empty)
    err = cudaFuncGetAttributes(&attr, decode_mma_kernel<__half, 18, 1, false, 1, false>);
    if (err != cudaSuccess) return err;
    if (attr.binaryVersion < 89) return cudaErrorNotSupported;
  }
  Params p{static_cast<const uint4*>(w), x, static_cast<const float2*>(scales), static_cast<const float2*>(zeros),
           static_cast<const uint16_t*>(fp4_scales), bias, y, M, N, K, ldx, ldy, (K + 63) / 64, group_chunks, groups,
           chunks_per_warp, out_scale, row_scales, act_scales, act_ld, bias_dtype, out_dtype, offsets,
           offsets_i64, out_scales, experts, 0};
  const int nt = M <= 8 ? 1 : M <= 16 ? 2 : 4;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  int grid_y = experts;  // CTA rows of a grouped launch
  if (offsets != nullptr && grid == GRID_ROWS && routed_rows > 0 && routed_rows < experts) {
    if (nt != 1) return cudaErrorInvalidValue;  // the row grid is built for one token tile (8 rows per pass) only
    p.row_grid = GRID_ROWS, grid_y = routed_rows;
  } else if (offsets != nullptr && grid == GRID_PASSES && routed_rows > 0) {
    const long long passes = routed_rows / (8 * nt) + min(experts, routed_rows);
    if (passes <= 65535) p.row_grid = GRID_PASSES, grid_y = (int)passes;
  } else if (offsets != nullptr && grid != GRID_EXPERTS && grid != GRID_ROWS) {
    return cudaErrorInvalidValue;
  }
  if (act_scales != nullptr)
    return bits == 18 ? pick_act_groups<18>(p, nt, unroll, kw, tw, s) : pick_act_groups<8>(p, nt, unroll, kw, tw, s);
  if (dtype == 0 && bits == 4) return pick_rest<__half, 4>(p, grid_y, nt, zero, unroll, kw, tw, s);
  if (dtype == 0 && bits == 8) return pick_rest<__half, 8>(p, grid_y, nt, zero, unroll, kw, tw, s);
  if (dtype == 1 && bits == 4) return pick_rest<__nv_bfloat16, 4>(p, grid_y, nt, zero, unroll, kw, tw, s);
  if (dtype == 1 && bits == 8) return pick_rest<__nv_bfloat16, 8>(p, grid_y, nt, zero, unroll, kw, tw, s);
  if (dtype == 0 && bits == 18) return pick_rest<__half, 18>(p, grid_y, nt, false, unroll, kw, tw, s);
  if (dtype == 1 && bits == 40) return pick_rest<__nv_bfloat16, 40>(p, grid_y, nt, false, unroll, kw, tw, s);
  if (dtype == 1 && bits == 41) return pick_rest<__nv_bfloat16, 41>(p, grid_y, nt, false, unroll, kw, tw, s);
  return cudaErrorInvalidValue;
}

const char* ht_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

}  // extern "C"
