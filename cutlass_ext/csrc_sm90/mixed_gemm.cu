// Hopper (sm_90a) mixed-input GEMMs through CUTLASS's warp-specialized TMA + WGMMA collectives (issue 13):
//   y[T, N] = x[T, K] @ dequant(W[N, K])^T + bias[N]
// computed as the swapped product D[N, T] = W[N, K] @ x[T, K]^T with D column-major, which *is* y row-major: the
// quantized weight is the register-sourced WGMMA A operand (the mixed-input mainloop converts it in registers),
// the tokens are the MMA's N dimension (16..256 per tile: small-M tiles are natural), and the weight rows fill the
// M tiles: 128 rows split by two consumer warpgroups, or 64 rows each in turn (pingpong).
//
// Two scale placements, by format:
//   * group scales (g64 / g128 ...): the mainloop multiplies each converted weight by its group's scale (the group
//     must be a multiple of the K tile) -- int4, and uint4 with an integer zero point folded to a float one
//     (w = q * s + z', z' = -z * s);
//   * channel scales: the weight converts exactly (int8, int4, e4m3 -> bf16 / fp16), the fp32 per-row scale
//     multiplies the fp32 accumulator in the epilogue (exact post-scaling).
// Both epilogues add a per-row (output channel) bias when its pointer is non-null.
//
// Formats: the activation type (bf16 / fp16) x the weight family, one translation unit each (the build compiles
// this file once per format with -DHT_SM90_FMT=<id>: the formats compile in parallel, and each exports
// ht_sm90_mixed_gemm_<id> / ht_sm90_mixed_workspace_<id>).  Group scales and folded zeros are fp32 for bf16
// activations (the fp32 q * s + z' is exact, then one rounding to bf16, as the reference's dequantized weight
// rounds) and fp16 for fp16 activations with fp16 scales (q * s in fp16: one rounding).  Format 10 takes int4 with
// bf16 activations and *bf16* scales: the mainloop multiplies in bf16 (the scale rounded to bf16 first, then the
// product: two roundings, as Marlin-style kernels do) instead of converting through fp32 -- fewer instructions
// per weight in the conversion that bounds int4 at mid M; a family of its own (``cutlass_mixed_bf16s``).  Format 11 is
// format 10 with the weight stored in the order the mainloop consumes it (``ShuffleBlock``; ``cutlass_mixed_shuffled``).
// Variants: tile shape and
// kernel policy (cooperative persistent / stream-K on 128-row weight tiles, pingpong on 64-row ones), numbered in
// HT_SM90_VARIANTS; the tuner times them.
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <cstdint>

namespace {

using namespace cute;

enum class Scaling { Group, GroupZero, Channel };

// The weight's order in memory: RowMajor ([N, K], K contiguous, sub-byte values low bits first), or Shuffled: W
// in 16 x 16 blocks (16 rows of one warp's slice of the WGMMA A fragment by one k-block of 16), the blocks tiled
// rows first (cute::tile_to_shape's order: block (r, c) starts at 256 * (r + c * N / 16)).  Within a block the 8
// values lane l feeds to one m64nXk16 WGMMA -- rows l / 4 and l / 4 + 8, columns 2 (l % 4) + {0, 1, 8, 9} -- sit
// in 32 contiguous bits, in the value order [0 2 4 6 1 3 5 7] (value v = k % 2 + 2 (row / 8) + 4 (k / 8) of the
// fragment at position 4 (v % 2) + v / 2).  Why: one 32-bit shared-memory load per lane per k-block instead of
// sub-byte ones, and CUTLASS's LayoutAwareConvert turns that order into 8 bf16 with 4 x (shift, LOP3, HSUB2) --
// the conversion is what bounds int4 at mid M.  Offset of (row, k) in a block, rows r = r0 + 8 r1, columns
// k = k0 + 2 k1 + 8 k2: 32 r0 + r1 + 4 k0 + 8 k1 + 2 k2.  cutlass_ext.mixed_gemm.shuffle writes this order.
enum class Order { RowMajor, Shuffled };
using ShuffleBlock = Layout<Shape<Shape<_8, _2>, Shape<_2, _4, _2>>, Stride<Stride<_32, _1>, Stride<_4, _8, _2>>>;
using ShuffledW = decltype(tile_to_shape(ShuffleBlock{}, make_shape(int{}, int{}, int{})));

template <class ElementW, class ElementX, class ElementScale, Scaling S, Order O, class TileShape, class Policy>
struct MixedGemm {
  using ElementD = ElementX;
  // A: [N, K], K contiguous, or the shuffled blocks (a cute layout in place of a stride: the builder takes either)
  using LayoutW = cute::conditional_t<O == Order::Shuffled, ShuffledW, cutlass::layout::RowMajor>;
  using LayoutX = cutlass::layout::ColumnMajor;  // B: the K x T operand of x [T, K], K contiguous
  using LayoutD = cutlass::layout::ColumnMajor;  // D [N, T] column-major == y [T, N] row-major
  static constexpr int AlignW = 128 / cutlass::sizeof_bits<ElementW>::value;
  static constexpr int AlignX = 128 / cutlass::sizeof_bits<ElementX>::value;
  static constexpr int AlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using ClusterShape = Shape<_1, _1, _1>;
  using ElementAOperand = cute::conditional_t<
      S == Scaling::Group, cute::tuple<ElementW, ElementScale>,
      cute::conditional_t<S == Scaling::GroupZero, cute::tuple<ElementW, ElementScale, ElementScale>, ElementW>>;

  using Fusion = cute::conditional_t<
      S == Scaling::Channel,
      cutlass::epilogue::fusion::PerRowLinCombPerRowBiasEltAct<cutlass::epilogue::thread::Identity, ElementD, float,
                                                              ElementD, ElementD, float>,
      cutlass::epilogue::fusion::LinCombPerRowBias<ElementD, float, ElementD, ElementD, float>>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, AlignD, ElementD, LayoutD, AlignD,
      typename Policy::EpilogueSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAOperand, LayoutW, AlignW, ElementX, LayoutX, AlignX,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Policy::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      typename Policy::Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::StrideA;
  using StrideB = typename Kernel::StrideB;
  using StrideD = typename Kernel::StrideD;
  using StrideS = typename Mainloop::StrideScale;

  // n: weight rows (output features), t: tokens
  static typename Gemm::Arguments arguments(const void* w, const void* scales, const void* zeros, const void* x,
                                            const void* bias, void* y, int n, int t, int k, int group) {
    auto problem = make_shape(n, t, k, 1);
    StrideA sa;
    if constexpr (O == Order::Shuffled) {
      sa = tile_to_shape(ShuffleBlock{}, make_shape(n, k, 1));
    } else {
      sa = cutlass::make_cute_packed_stride(StrideA{}, make_shape(n, k, 1));
    }
    StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, make_shape(t, k, 1));
    StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, make_shape(n, t, 1));
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = problem;
    if constexpr (S == Scaling::Channel) {
      args.mainloop = {static_cast<const ElementW*>(w), sa, static_cast<const ElementX*>(x), sb};
    } else {
      StrideS ss = cutlass::make_cute_packed_stride(StrideS{}, make_shape(n, k / group, 1));
      args.mainloop = {static_cast<const ElementW*>(w), sa, static_cast<const ElementX*>(x), sb,
                       static_cast<const ElementScale*>(scales), ss, group};
      if constexpr (S == Scaling::GroupZero) args.mainloop.ptr_Z = static_cast<const ElementScale*>(zeros);
    }
    args.epilogue.dC = sd;
    args.epilogue.ptr_D = static_cast<ElementD*>(y);
    args.epilogue.dD = sd;
    auto& fusion = args.epilogue.thread;
    fusion.alpha = 1.0f;
    fusion.beta = 0.0f;
    if constexpr (S == Scaling::Channel) fusion.alpha_ptr = static_cast<const float*>(scales);  // fp32 [N]
    fusion.bias_ptr = static_cast<const ElementD*>(bias);  // null: no bias (the broadcast reads zeros)
    return args;
  }

  static int run(const void* w, const void* scales, const void* zeros, const void* x, const void* bias, void* y,
                 int n, int t, int k, int group, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    Gemm gemm;
    auto args = arguments(w, scales, zeros, x, bias, y, n, t, k, group);
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return -1;
    if (Gemm::get_workspace_size(args) > workspace_bytes) return -2;
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return -3;
    return gemm.run(stream) == cutlass::Status::kSuccess ? 0 : -4;
  }

  static size_t workspace(int n, int t, int k, int group) {
    return Gemm::get_workspace_size(arguments(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, n, t, k, group));
  }
};

// Kernel policies (the variant table's third column): two consumer warpgroups splitting a 128-row weight tile
// (cooperative; persistent or stream-K tiles), or taking 64-row tiles in turn (pingpong: twice the tiles of a
// 128-row grid, for the small M where 8192 rows make only 64 cooperative tiles).  Variants 10 / 11: all 256 tokens
// of M = 256 in one tile, so each weight element is converted once, not once per 128-token tile (the conversion
// bounds int4 at mid M), with the SMs filled by stream-K or by 64-row tiles.  Variants 12 / 13: 64- / 32-token tiles
// with stream-K, for M = 32-64 on layers of few weight tiles and long K (4096x14336: 32 tiles of 128 rows for 132
// SMs, where the persistent 64-token variant 2 ran 58.8 us and stream-K with a half-empty 128-token tile 47.0).
struct Persistent {
  using Scheduler = cutlass::gemm::PersistentScheduler;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct StreamK : Persistent {
  using Scheduler = cutlass::gemm::StreamKScheduler;
};
struct Pingpong {
  using Scheduler = cutlass::gemm::PersistentScheduler;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
};

// The formats (id, weight, activation, scale type, scaling, weight order); a build defines HT_SM90_FMT to pick one.
#define HT_RM Order::RowMajor  // the plain order, for short rows
#define HT_SM90_FORMATS(X)                                                                          \
  X(0, cutlass::int4b_t, cutlass::bfloat16_t, float, Scaling::Group, HT_RM)       /* int4, group scales */ \
  X(1, cutlass::int4b_t, cutlass::half_t, cutlass::half_t, Scaling::Group, HT_RM)                           \
  X(2, cutlass::uint4b_t, cutlass::bfloat16_t, float, Scaling::GroupZero, HT_RM)  /* uint4 + zero point */ \
  X(3, cutlass::uint4b_t, cutlass::half_t, float, Scaling::GroupZero, HT_RM)                                \
  X(4, int8_t, cutlass::bfloat16_t, float, Scaling::Channel, HT_RM)               /* int8, channel */      \
  X(5, int8_t, cutlass::half_t, float, Scaling::Channel, HT_RM)                                             \
  X(6, cutlass::float_e4m3_t, cutlass::bfloat16_t, float, Scaling::Channel, HT_RM) /* e4m3, channel */     \
  X(7, cutlass::float_e4m3_t, cutlass::half_t, float, Scaling::Channel, HT_RM)                              \
  X(8, cutlass::int4b_t, cutlass::bfloat16_t, float, Scaling::Channel, HT_RM)     /* int4, channel */      \
  X(9, cutlass::int4b_t, cutlass::half_t, float, Scaling::Channel, HT_RM)                                   \
  X(10, cutlass::int4b_t, cutlass::bfloat16_t, cutlass::bfloat16_t, Scaling::Group, HT_RM) /* bf16 scales */ \
  X(11, cutlass::int4b_t, cutlass::bfloat16_t, cutlass::bfloat16_t, Scaling::Group, Order::Shuffled)

#define COMMA ,
#ifndef HT_SM90_VARIANTS  // a compile check may define a shorter list before including this file
#define HT_SM90_VARIANTS(X, ...)                                   \
  X(0, Shape<_128 COMMA _16 COMMA _128>, Persistent, __VA_ARGS__)  \
  X(1, Shape<_128 COMMA _32 COMMA _128>, Persistent, __VA_ARGS__)  \
  X(2, Shape<_128 COMMA _64 COMMA _128>, Persistent, __VA_ARGS__)  \
  X(3, Shape<_128 COMMA _128 COMMA _64>, Persistent, __VA_ARGS__)  \
  X(4, Shape<_128 COMMA _256 COMMA _64>, Persistent, __VA_ARGS__)  \
  X(5, Shape<_128 COMMA _16 COMMA _128>, StreamK, __VA_ARGS__)     \
  X(6, Shape<_128 COMMA _128 COMMA _64>, StreamK, __VA_ARGS__)     \
  X(7, Shape<_64 COMMA _16 COMMA _128>, Pingpong, __VA_ARGS__)     \
  X(8, Shape<_64 COMMA _32 COMMA _128>, Pingpong, __VA_ARGS__)     \
  X(9, Shape<_64 COMMA _64 COMMA _128>, Pingpong, __VA_ARGS__)     \
  X(10, Shape<_128 COMMA _256 COMMA _64>, StreamK, __VA_ARGS__)    \
  X(11, Shape<_64 COMMA _256 COMMA _64>, Pingpong, __VA_ARGS__)   \
  X(12, Shape<_128 COMMA _64 COMMA _128>, StreamK, __VA_ARGS__)    \
  X(13, Shape<_128 COMMA _32 COMMA _128>, StreamK, __VA_ARGS__)
#endif

}  // namespace

#ifndef HT_SM90_FMT
#error "compile once per format: -DHT_SM90_FMT=<id> (cutlass_ext/build.py does)"
#endif

// Only this unit's format (and, with -DHT_SM90_VARIANT=<v>, only that variant) is instantiated: a dispatch branch
// of another format or variant goes to the Keep = false stub, so no kernel of it is compiled here.
#ifdef HT_SM90_VARIANT
#define HT_KEEP(F, V) (F == HT_SM90_FMT && V == HT_SM90_VARIANT)
#else
#define HT_KEEP(F, V) (F == HT_SM90_FMT)
#endif

namespace {

template <bool Keep, class W, class A, class SC, Scaling S, Order O, class T, class Policy>
struct Variant {  // Keep = false: a branch compiled elsewhere (or nowhere)
  static int run(const void*, const void*, const void*, const void*, const void*, void*, int, int, int, int, void*,
                 size_t, cudaStream_t) { return -9; }
  static size_t workspace(int, int, int, int) { return size_t(-1); }
};

template <class W, class A, class SC, Scaling S, Order O, class T, class Policy>
struct Variant<true, W, A, SC, S, O, T, Policy> : MixedGemm<W, A, SC, S, O, T, Policy> {};

}  // namespace

#define HT_CAT2(a, b) a##b
#define HT_CAT(a, b) HT_CAT2(a, b)
#ifdef HT_SM90_VARIANT  // one kernel per unit: the exported names carry the variant too
#define HT_SUFFIX HT_CAT(HT_CAT(HT_SM90_FMT, _v), HT_SM90_VARIANT)
#else
#define HT_SUFFIX HT_SM90_FMT
#endif
#define HT_GEMM_FN HT_CAT(ht_sm90_mixed_gemm_, HT_SUFFIX)
#define HT_WS_FN HT_CAT(ht_sm90_mixed_workspace_, HT_SUFFIX)

extern "C" {

// 0: launched; -1 CUTLASS cannot implement the problem (alignment, group vs K tile), -2 workspace too small,
// -3 initialize failed, -4 launch failed, -9 unknown (or not compiled here) variant.
int HT_GEMM_FN(int variant, const void* w, const void* scales, const void* zeros, const void* x, const void* bias,
               void* y, int n, int t, int k, int group, void* workspace, size_t workspace_bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
#define HT_RUN_VARIANT(V, T, SCHED, F, W, A, SC, S, O)                                                         \
  if (variant == V)                                                                                            \
    return Variant<HT_KEEP(F, V), W, A, SC, S, O, T, SCHED>::run(w, scales, zeros, x, bias, y, n, t, k, group, \
                                                                 workspace, workspace_bytes, s);
#define HT_RUN_FORMAT(F, W, A, SC, S, O) \
  if (F == HT_SM90_FMT) { HT_SM90_VARIANTS(HT_RUN_VARIANT, F, W, A, SC, S, O) }
  HT_SM90_FORMATS(HT_RUN_FORMAT)
  return -9;
}

// Bytes of workspace a variant needs (stream-K's partial tiles); -1 cast to size_t for an unknown variant.
size_t HT_WS_FN(int variant, int n, int t, int k, int group) {
#define HT_WS_VARIANT(V, T, SCHED, F, W, A, SC, S, O) \
  if (variant == V) return Variant<HT_KEEP(F, V), W, A, SC, S, O, T, SCHED>::workspace(n, t, k, group);
#define HT_WS_FORMAT(F, W, A, SC, S, O) \
  if (F == HT_SM90_FMT) { HT_SM90_VARIANTS(HT_WS_VARIANT, F, W, A, SC, S, O) }
  HT_SM90_FORMATS(HT_WS_FORMAT)
  return size_t(-1);
}

}  // extern "C"
