// Hopper (sm_90a) grouped fp8 GEMM for MoE experts with per-token e4m3 activations (issue 11):
//   y[r, n] = bf16( (sum_k xq[r, k] * wq[e][n, k]) * sw[e][n] * sx[r] )   for offsets[e] <= r < offsets[e + 1]
// xq: the activations' e4m3 codes [T, K] (rows sorted by expert), sx their fp32 per-token scales [T]; wq: every
// expert's e4m3 codes [E, N, K], sw their fp32 per-row scales [E, N] -- W8A8-FP8 experts as they are stored,
// W4A8-MXFP4 experts as their exact e4m3 rows (a power-of-two scale per row).
//
// Why: W4A8-MXFP4 experts ran at 0.33-0.6x Humming from 256 tokens (session 27: Qwen3 gate_up, 4096 tokens,
// 1000 us against 327) on bf16 MMAs of the exact codes (the format-6 grouped kernel) or on torch's fp8 grouped GEMM
// (~200 TFLOP/s); fp8 wgmma runs at twice the bf16 rate.
//
// Each expert is one problem of CUTLASS's pointer-array kernel, computed swapped as csrc_sm90_grouped/grouped_gemm.cu
// does: D_e[N, T_e] = W_e[N, K] @ x_e[T_e, K]^T with D column-major (= y_e row-major), the expert's tokens the
// MMA's N side (few tokens per expert at mid batch sizes).  Both operands K-major from shared memory (SS wgmma).
// Accumulation: CUTLASS's fp8 mainloop promotes the wgmma accumulator into fp32 every 4 k-blocks (128 of K) --
// the FP8 accuracy standard (cuBLASLt with fast accumulation off).  Epilogue: the accumulator times the weight
// row's scale (a column vector of D), times the token's scale (a row vector of D), rounded once to bf16; both
// vectors per expert through arrays of pointers.  No host sync: ht_fill_fp8_groups writes every expert's problem
// size and pointers from the device offsets, on the same stream.
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <cstdint>

namespace ht_grouped_fp8 {

using namespace cute;

struct Cooperative {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
struct Pingpong {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

template <class TileShape, class Policy>
struct GroupedFp8 {
  using ElementQ = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // per expert (N, T_e, K)
  using LayoutW = cutlass::layout::RowMajor;     // A: [N, K], K contiguous
  using LayoutX = cutlass::layout::ColumnMajor;  // B: the K x T_e operand of x_e [T_e, K]
  using LayoutD = cutlass::layout::ColumnMajor;  // D [N, T_e] column-major == y_e [T_e, N] row-major
  static constexpr int AlignQ = 16;              // 16 e4m3 codes: one 16-byte TMA row unit
  static constexpr int AlignD = 8;
  using ClusterShape = Shape<_1, _1, _1>;

  // D = bf16((acc * sw[n]) * sx[t]): sw a column vector of D (weight rows), sx a row vector (tokens), each a
  // pointer per expert; alignment 1 (an expert's first token is any row of x)
  static constexpr auto RoundD = cutlass::FloatRoundStyle::round_to_nearest;
  using WeightScale = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float*, float, Stride<_1, _0, _0>, 1>;
  using TokenScale = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float*, float, Stride<_0, _1, _0>, 1>;
  using ScaledByWeight = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, RoundD>,
      cutlass::epilogue::fusion::Sm90AccFetch, WeightScale>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float, RoundD>, ScaledByWeight,
      TokenScale>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, AlignD, ElementD, LayoutD*,
      AlignD, typename Policy::EpilogueSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementQ, LayoutW*, AlignQ, ElementQ, LayoutX*, AlignQ,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Policy::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideW = typename Kernel::InternalStrideA;
  using StrideX = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;

  // The per-expert arrays the kernel reads, carved from the front of the workspace (each 128-byte aligned).
  struct Arrays {
    Shape3* problems;
    const ElementQ** w;
    const ElementQ** x;
    ElementD** d;
    const float** sw;
    const float** sx;
    StrideW* dw;
    StrideX* dx;
    StrideD* dd;
  };

  static size_t round_up(size_t b) { return (b + 127) / 128 * 128; }

  static size_t arrays_bytes(int experts) {
    size_t e = size_t(experts);
    return round_up(e * sizeof(Shape3)) + 5 * round_up(e * sizeof(void*)) + round_up(e * sizeof(StrideW)) +
           round_up(e * sizeof(StrideX)) + round_up(e * sizeof(StrideD));
  }

  static Arrays carve(void* workspace, int experts) {
    char* p = static_cast<char*>(workspace);
    size_t e = size_t(experts);
    Arrays a;
    auto take = [&](size_t bytes) { char* q = p; p += round_up(bytes); return q; };
    a.problems = reinterpret_cast<Shape3*>(take(e * sizeof(Shape3)));
    a.w = reinterpret_cast<const ElementQ**>(take(e * sizeof(void*)));
    a.x = reinterpret_cast<const ElementQ**>(take(e * sizeof(void*)));
    a.d = reinterpret_cast<ElementD**>(take(e * sizeof(void*)));
    a.sw = reinterpret_cast<const float**>(take(e * sizeof(void*)));
    a.sx = reinterpret_cast<const float**>(take(e * sizeof(void*)));
    a.dw = reinterpret_cast<StrideW*>(take(e * sizeof(StrideW)));
    a.dx = reinterpret_cast<StrideX*>(take(e * sizeof(StrideX)));
    a.dd = reinterpret_cast<StrideD*>(take(e * sizeof(StrideD)));
    return a;
  }

  static typename Gemm::Arguments arguments(const Arrays& a, int experts, int sm_count) {
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {experts, a.problems, nullptr};  // sizes on the device only
    args.mainloop = {a.w, a.dw, a.x, a.dx};
    // the fusion's arguments, children first: ((acc, sw, multiply), sx, multiply)
    args.epilogue.thread = {{{}, {a.sw, 0.0f, {}}, {}}, {a.sx, 0.0f, {}}, {}};
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = a.dd;
    args.epilogue.ptr_D = a.d;
    args.epilogue.dD = a.dd;
    args.hw_info.sm_count = sm_count;
    return args;
  }
};

// One thread per expert: its problem (N, rows, K), operand and scale pointers, strides (the same for every expert;
// the pointer-array collectives read one per group).
template <class G, class Offset>
__global__ void ht_fill_fp8_groups(typename G::Arrays a, const Offset* offsets, int experts, int n, int k,
                                   const typename G::ElementQ* w, const typename G::ElementQ* x, const float* sw,
                                   const float* sx, typename G::ElementD* d, typename G::StrideW dw,
                                   typename G::StrideX dx, typename G::StrideD dd) {
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= experts) return;
  int64_t lo = int64_t(offsets[e]), rows = int64_t(offsets[e + 1]) - lo;
  a.problems[e] = typename G::Shape3(n, int(rows), k);
  a.w[e] = w + int64_t(e) * n * k;
  a.x[e] = x + lo * k;
  a.d[e] = d + lo * n;
  a.sw[e] = sw + int64_t(e) * n;
  a.sx[e] = sx + lo;
  a.dw[e] = dw;
  a.dx[e] = dx;
  a.dd[e] = dd;
}

template <class G>
int run_grouped_fp8(const void* w, const void* w_scales, const void* x, const void* x_scales, const void* offsets,
                    int offsets_64, void* y, int experts, int n, int k, void* workspace, size_t workspace_bytes,
                    int sm_count, cudaStream_t stream) {
  using Gemm = typename G::Gemm;
  size_t head = G::arrays_bytes(experts);
  auto a = G::carve(workspace, experts);
  auto args = G::arguments(a, experts, sm_count);
  if (head + Gemm::get_workspace_size(args) > workspace_bytes) return -2;
  auto dw = cutlass::make_cute_packed_stride(typename G::StrideW{}, make_shape(n, k, 1));
  auto dx = cutlass::make_cute_packed_stride(typename G::StrideX{}, make_shape(1, k, 1));
  auto dd = cutlass::make_cute_packed_stride(typename G::StrideD{}, make_shape(n, 1, 1));
  int threads = 128, blocks = (experts + threads - 1) / threads;
  auto wq = static_cast<const typename G::ElementQ*>(w);
  auto xq = static_cast<const typename G::ElementQ*>(x);
  auto sw = static_cast<const float*>(w_scales);
  auto sx = static_cast<const float*>(x_scales);
  auto ys = static_cast<typename G::ElementD*>(y);
  if (offsets_64)
    ht_fill_fp8_groups<G, int64_t><<<blocks, threads, 0, stream>>>(a, static_cast<const int64_t*>(offsets), experts,
                                                                   n, k, wq, xq, sw, sx, ys, dw, dx, dd);
  else
    ht_fill_fp8_groups<G, int32_t><<<blocks, threads, 0, stream>>>(a, static_cast<const int32_t*>(offsets), experts,
                                                                   n, k, wq, xq, sw, sx, ys, dw, dx, dd);
  if (cudaGetLastError() != cudaSuccess) return -4;
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return -1;
  if (gemm.initialize(args, static_cast<char*>(workspace) + head, stream) != cutlass::Status::kSuccess) return -3;
  return gemm.run(stream) == cutlass::Status::kSuccess ? 0 : -4;
}

template <class G>
size_t workspace_grouped_fp8(int experts, int sm_count) {
  typename G::Arrays a{};
  return G::arrays_bytes(experts) + G::Gemm::get_workspace_size(G::arguments(a, experts, sm_count));
}

#define COMMA ,
// (id, tile shape [weight rows, tokens, K], schedule): 128-row tiles split by two consumer warpgroups, 64-row
// tiles taken by one warpgroup at a time; fp8 K tiles of 128 (128-byte rows)
#define HT_SM90F8_VARIANTS(X)                          \
  X(0, Shape<_128 COMMA _64 COMMA _128>, Cooperative)  \
  X(1, Shape<_128 COMMA _128 COMMA _128>, Cooperative) \
  X(2, Shape<_128 COMMA _256 COMMA _128>, Cooperative) \
  X(3, Shape<_64 COMMA _128 COMMA _128>, Pingpong)     \
  X(4, Shape<_128 COMMA _32 COMMA _128>, Cooperative)

}  // namespace ht_grouped_fp8

using namespace ht_grouped_fp8;

// One kernel per translation unit: -DHT_SM90F8_VARIANT=<variant> (cutlass_ext/build.py).
#if !defined(HT_SM90F8_VARIANT)
#error "compile once per kernel: -DHT_SM90F8_VARIANT=<id> (cutlass_ext/build.py does)"
#endif

#define HT_PICK(V, T, POLICY) \
  using HtTile##V = T;        \
  using HtPolicy##V = POLICY;
HT_SM90F8_VARIANTS(HT_PICK)
#define HT_CAT2(a, b) a##b
#define HT_CAT(a, b) HT_CAT2(a, b)
using HtGroupedFp8 = GroupedFp8<HT_CAT(HtTile, HT_SM90F8_VARIANT), HT_CAT(HtPolicy, HT_SM90F8_VARIANT)>;

extern "C" {

// 0: launched; -1 CUTLASS cannot implement the problem, -2 workspace too small, -3 initialize failed, -4 launch
// failed.  ``offsets``: experts + 1 row offsets on the device, int64 (offsets_64 != 0) or int32.
int HT_CAT(ht_sm90_grouped_fp8_gemm_v, HT_SM90F8_VARIANT)(const void* w, const void* w_scales, const void* x,
                                                         const void* x_scales, const void* offsets, int offsets_64,
                                                         void* y, int experts, int n, int k, int sm_count,
                                                         void* workspace, size_t workspace_bytes, void* stream) {
  return run_grouped_fp8<HtGroupedFp8>(w, w_scales, x, x_scales, offsets, offsets_64, y, experts, n, k, workspace,
                                       workspace_bytes, sm_count, static_cast<cudaStream_t>(stream));
}

// Bytes of workspace the kernel needs: the per-expert arrays + CUTLASS's per-SM tensor maps.
size_t HT_CAT(ht_sm90_grouped_fp8_workspace_v, HT_SM90F8_VARIANT)(int experts, int sm_count) {
  return workspace_grouped_fp8<HtGroupedFp8>(experts, sm_count);
}

}  // extern "C"
