// Hopper (sm_90a) grouped mixed-input GEMM for MoE experts (issue 11), through CUTLASS's pointer-array
// ("grouped") TMA + WGMMA collectives:
//   y[r, N] = x[r, K] @ dequant(W[e])^T   for offsets[e] <= r < offsets[e + 1]   (rows sorted by expert)
// Each expert is one problem of the group, computed swapped as in csrc_sm90/mixed_gemm.cu: D_e[N, T_e] =
// W_e[N, K] @ x_e[T_e, K]^T with D column-major (= y_e row-major), the quantized weight the register-sourced WGMMA
// operand (converted and multiplied by its group scale in the mainloop), the expert's tokens the MMA's N side.
//
// Why a grouped kernel: the dense CUTLASS path runs w4a16 at 0.9-1.05x Humming from M = 256, while the MoE rows
// at 256-4096 tokens ran 0.43-0.62x on the Triton grouped tiles -- the same in-register conversion feeding wgmma
// per expert is the missing piece.
//
// No host sync: the per-expert problem sizes and pointers are written on the device by ht_fill_groups from the
// device offsets (one tiny launch on the same stream), and the grouped scheduler launches one persistent CTA per
// SM without host problem sizes.  An expert with no rows is a problem with no tiles.
//
// Formats (one kernel per translation unit: -DHT_SM90G_FMT, -DHT_SM90G_VARIANT): 0 = int4 with fp32 group scales
// (exact: q * s in fp32, one rounding to bf16), 10 = int4 with bf16 group scales (two roundings, fewer
// instructions) -- the twins of csrc_sm90's formats 0 / 10 --, 11 = format 10 with each expert's weight in the
// shuffled order of csrc_sm90/mixed_gemm.cu (ShuffleBlock: a lane's 8 values of a k-block in 32 contiguous bits,
// in the value order of CUTLASS's vectorized int4 -> bf16 converter), and 6 = e4m3 with one bf16 scale per row (MXFP4
// experts as exact e4m3 rows times a power of two: exact in bf16).  bf16 activations and output; no bias (an expert
// bias runs elsewhere).  Variants: HT_SM90G_VARIANTS (tile shape x schedule), timed by the tuner.
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <cstdint>

// a named namespace: a __global__ template in an anonymous one collides with CuTe's own in nvcc's host stub
namespace ht_grouped {

using namespace cute;

struct Cooperative {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
struct Pingpong {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

// The shuffled weight order of csrc_sm90/mixed_gemm.cu, word for word (tests/test_cutlass_grouped.py checks the two
// agree): 16 x 16 blocks of W tiled rows first, each lane's 8 fragment values of a k-block in 32 contiguous bits.
using ShuffleBlock = Layout<Shape<Shape<_8, _2>, Shape<_2, _4, _2>>, Stride<Stride<_32, _1>, Stride<_4, _8, _2>>>;
using ShuffledW = decltype(tile_to_shape(ShuffleBlock{}, make_shape(int{}, int{}, int{})));

template <class ElementW_, class ElementScale_, bool Shuffled, class TileShape, class Policy>
struct GroupedGemm {
  using ElementScale = ElementScale_;
  using ElementW = ElementW_;
  using ElementX = cutlass::bfloat16_t;
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // per expert (N, T_e, K)
  // A: [N, K], K contiguous, or the shuffled blocks (a cute layout in place of a stride)
  using LayoutW = cute::conditional_t<Shuffled, ShuffledW, cutlass::layout::RowMajor>;
  static constexpr bool kShuffled = Shuffled;
  using LayoutX = cutlass::layout::ColumnMajor;  // B: the K x T_e operand of x_e [T_e, K]
  using LayoutD = cutlass::layout::ColumnMajor;  // D [N, T_e] column-major == y_e [T_e, N] row-major
  static constexpr int AlignW = 128 / cutlass::sizeof_bits<ElementW>::value;
  static constexpr int AlignX = 128 / cutlass::sizeof_bits<ElementX>::value;
  static constexpr int AlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using ClusterShape = Shape<_1, _1, _1>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, AlignD, ElementD, LayoutD*,
      AlignD, typename Policy::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<ElementW, ElementScale>, LayoutW*, AlignW,
      ElementX, LayoutX*, AlignX, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Policy::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideW = typename Kernel::InternalStrideA;
  using StrideX = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using StrideS = typename Mainloop::NonVoidStrideScale;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;

  // The per-expert arrays the kernel reads, carved from the front of the workspace (each 128-byte aligned).
  struct Arrays {
    Shape3* problems;
    const ElementW** w;
    const ElementX** x;
    const ElementScale** s;
    ElementD** d;
    StrideW* dw;
    StrideX* dx;
    StrideS* ds;
    StrideD* dd;
  };

  static size_t round_up(size_t b) { return (b + 127) / 128 * 128; }

  static size_t arrays_bytes(int experts) {
    size_t e = size_t(experts);
    return round_up(e * sizeof(Shape3)) + 4 * round_up(e * sizeof(void*)) + round_up(e * sizeof(StrideW)) +
           round_up(e * sizeof(StrideX)) + round_up(e * sizeof(StrideS)) + round_up(e * sizeof(StrideD));
  }

  static Arrays carve(void* workspace, int experts) {
    char* p = static_cast<char*>(workspace);
    size_t e = size_t(experts);
    Arrays a;
    auto take = [&](size_t bytes) { char* q = p; p += round_up(bytes); return q; };
    a.problems = reinterpret_cast<Shape3*>(take(e * sizeof(Shape3)));
    a.w = reinterpret_cast<const ElementW**>(take(e * sizeof(void*)));
    a.x = reinterpret_cast<const ElementX**>(take(e * sizeof(void*)));
    a.s = reinterpret_cast<const ElementScale**>(take(e * sizeof(void*)));
    a.d = reinterpret_cast<ElementD**>(take(e * sizeof(void*)));
    a.dw = reinterpret_cast<StrideW*>(take(e * sizeof(StrideW)));
    a.dx = reinterpret_cast<StrideX*>(take(e * sizeof(StrideX)));
    a.ds = reinterpret_cast<StrideS*>(take(e * sizeof(StrideS)));
    a.dd = reinterpret_cast<StrideD*>(take(e * sizeof(StrideD)));
    return a;
  }

  static typename Gemm::Arguments arguments(const Arrays& a, int experts, int group, int sm_count) {
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {experts, a.problems, nullptr};  // sizes on the device only
    args.mainloop = {a.w, a.dw, a.x, a.dx, a.s, a.ds, group};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = a.dd;
    args.epilogue.ptr_D = a.d;
    args.epilogue.dD = a.dd;
    args.hw_info.sm_count = sm_count;
    return args;
  }
};

// One thread per expert: its problem (N, rows, K), operand pointers and strides.  The strides are the same for
// every expert; they go into the arrays because the pointer-array collectives read one per group.
template <class G, class Offset>
__global__ void ht_fill_groups(typename G::Arrays a, const Offset* offsets, int experts, int n, int k, int group,
                               const unsigned char* w, const typename G::ElementX* x,
                               const typename G::ElementScale* s, typename G::ElementD* d,
                               typename G::StrideW dw, typename G::StrideX dx, typename G::StrideS ds,
                               typename G::StrideD dd) {
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= experts) return;
  int64_t lo = int64_t(offsets[e]), rows = int64_t(offsets[e + 1]) - lo;
  a.problems[e] = typename G::Shape3(n, int(rows), k);
  a.w[e] = reinterpret_cast<const typename G::ElementW*>(w + int64_t(e) * n * (k * cutlass::sizeof_bits<typename G::ElementW>::value / 8));
  a.x[e] = x + lo * k;
  a.s[e] = s + int64_t(e) * (k / group) * n;
  a.d[e] = d + lo * n;
  a.dw[e] = dw;
  a.dx[e] = dx;
  a.ds[e] = ds;
  a.dd[e] = dd;
}

template <class G>
int run_grouped(const void* w, const void* scales, const void* x, const void* offsets, int offsets_64, void* y,
                int experts, int n, int k, int group, int rows_hint, void* workspace, size_t workspace_bytes,
                int sm_count, cudaStream_t stream) {
  using Gemm = typename G::Gemm;
  size_t head = G::arrays_bytes(experts);
  auto a = G::carve(workspace, experts);
  auto args = G::arguments(a, experts, group, sm_count);
  if (head + Gemm::get_workspace_size(args) > workspace_bytes) return -2;
  typename G::StrideW dw;
  if constexpr (G::kShuffled) {
    dw = tile_to_shape(ShuffleBlock{}, make_shape(n, k, 1));
  } else {
    dw = cutlass::make_cute_packed_stride(typename G::StrideW{}, make_shape(n, k, 1));
  }
  auto dx = cutlass::make_cute_packed_stride(typename G::StrideX{}, make_shape(rows_hint, k, 1));
  auto ds = cutlass::make_cute_packed_stride(typename G::StrideS{}, make_shape(n, k / group, 1));
  auto dd = cutlass::make_cute_packed_stride(typename G::StrideD{}, make_shape(n, rows_hint, 1));
  int threads = 128, blocks = (experts + threads - 1) / threads;
  auto wb = static_cast<const unsigned char*>(w);
  auto xs = static_cast<const typename G::ElementX*>(x);
  auto ss = static_cast<const typename G::ElementScale*>(scales);
  auto ys = static_cast<typename G::ElementD*>(y);
  if (offsets_64)
    ht_fill_groups<G, int64_t><<<blocks, threads, 0, stream>>>(a, static_cast<const int64_t*>(offsets), experts, n, k,
                                                               group, wb, xs, ss, ys, dw, dx, ds, dd);
  else
    ht_fill_groups<G, int32_t><<<blocks, threads, 0, stream>>>(a, static_cast<const int32_t*>(offsets), experts, n, k,
                                                               group, wb, xs, ss, ys, dw, dx, ds, dd);
  if (cudaGetLastError() != cudaSuccess) return -4;
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return -1;
  if (gemm.initialize(args, static_cast<char*>(workspace) + head, stream) != cutlass::Status::kSuccess) return -3;
  return gemm.run(stream) == cutlass::Status::kSuccess ? 0 : -4;
}

template <class G>
size_t workspace_grouped(int experts, int group, int sm_count) {
  typename G::Arrays a{};
  return G::arrays_bytes(experts) + G::Gemm::get_workspace_size(G::arguments(a, experts, group, sm_count));
}

#define COMMA ,
// (id, tile shape [weight rows, tokens, K], schedule): 128-row tiles split by two consumer warpgroups, 64-row
// tiles taken by one warpgroup at a time
#define HT_SM90G_VARIANTS(X)                          \
  X(0, Shape<_128 COMMA _32 COMMA _128>, Cooperative) \
  X(1, Shape<_128 COMMA _64 COMMA _128>, Cooperative) \
  X(2, Shape<_128 COMMA _128 COMMA _64>, Cooperative) \
  X(3, Shape<_128 COMMA _256 COMMA _64>, Cooperative) \
  X(4, Shape<_64 COMMA _64 COMMA _128>, Pingpong)     \
  X(5, Shape<_64 COMMA _128 COMMA _64>, Pingpong)

}  // namespace ht_grouped

using namespace ht_grouped;

// One kernel per translation unit: -DHT_SM90G_FMT=<format> -DHT_SM90G_VARIANT=<variant> (cutlass_ext/build.py).
// Formats: 0 = int4 with fp32 group scales, 10 = int4 with bf16 group scales, 11 = 10 on the shuffled order,
// 6 = e4m3 with one bf16 scale per row
// (group = K): MXFP4 experts as exact e4m3 rows whose row scale is a power of two, so the bf16 product is exact.
#if !defined(HT_SM90G_FMT) || !defined(HT_SM90G_VARIANT)
#error "compile once per kernel: -DHT_SM90G_FMT=<id> -DHT_SM90G_VARIANT=<id> (cutlass_ext/build.py does)"
#endif
#if HT_SM90G_FMT == 0
using HtWeight = cutlass::int4b_t;
using HtScale = float;
constexpr bool HtShuffled = false;
#elif HT_SM90G_FMT == 10 || HT_SM90G_FMT == 11
using HtWeight = cutlass::int4b_t;
using HtScale = cutlass::bfloat16_t;
constexpr bool HtShuffled = HT_SM90G_FMT != 10;
#elif HT_SM90G_FMT == 6
using HtWeight = cutlass::float_e4m3_t;
using HtScale = cutlass::bfloat16_t;
constexpr bool HtShuffled = false;
#else
#error "unknown grouped format (0, 10, 11: int4 with fp32 / bf16 / bf16-shuffled group scales; 6: e4m3 with bf16 row scales)"
#endif

#define HT_PICK(V, T, POLICY) \
  using HtTile##V = T;        \
  using HtPolicy##V = POLICY;
HT_SM90G_VARIANTS(HT_PICK)
#define HT_CAT2(a, b) a##b
#define HT_CAT(a, b) HT_CAT2(a, b)
using HtGrouped = GroupedGemm<HtWeight, HtScale, HtShuffled, HT_CAT(HtTile, HT_SM90G_VARIANT),
                              HT_CAT(HtPolicy, HT_SM90G_VARIANT)>;
#define HT_SUFFIX HT_CAT(HT_CAT(HT_SM90G_FMT, _v), HT_SM90G_VARIANT)

extern "C" {

// 0: launched; -1 CUTLASS cannot implement the problem, -2 workspace too small, -3 initialize failed, -4 launch
// failed.  ``offsets``: experts + 1 row offsets on the device, int64 (offsets_64 != 0) or int32.
int HT_CAT(ht_sm90_grouped_gemm_, HT_SUFFIX)(const void* w, const void* scales, const void* x, const void* offsets,
                                             int offsets_64, void* y, int experts, int n, int k, int group,
                                             int sm_count, void* workspace, size_t workspace_bytes, void* stream) {
  return run_grouped<HtGrouped>(w, scales, x, offsets, offsets_64, y, experts, n, k, group, 1, workspace,
                                workspace_bytes, sm_count, static_cast<cudaStream_t>(stream));
}

// Bytes of workspace the kernel needs: the per-expert arrays + CUTLASS's per-SM tensor maps.
size_t HT_CAT(ht_sm90_grouped_workspace_, HT_SUFFIX)(int experts, int group, int sm_count) {
  return workspace_grouped<HtGrouped>(experts, group, sm_count);
}

}  // extern "C"
