// Blackwell (sm_100a) block-scaled GEMMs through CUTLASS's tcgen05 collectives:
//   D[M, N] (bf16) = alpha * (A x SFA) @ (B x SFB)^T + bias[N]
// A: the quantized activations [M, K], B: the quantized weights [N, K], both K-major; SFA / SFB: their block
// scales in the layout the instruction reads (cutlass::detail::Sm1xxBlockScaledConfig; ht_sm100_sf_elements gives
// each one's size).  Formats: kind 0 NVFP4 x NVFP4 (e2m1, e4m3 scales per 16), kind 1 MXFP4 x MXFP4 (e2m1, e8m0
// per 32), kind 2 MXFP8 activations x MXFP4 weights (the W4A8 mxf8f6f4 MMA), kind 3 MXFP8 x MXFP8 (e4m3, e8m0
// per 32, mxf8f6f4).
//
// alpha: a device fp32 scalar (alpha_ptr, read by the epilogue on the GPU: NVFP4's product of the activation's
// and the weight's global scales, computed on the device, so no host sync) or, where alpha_ptr is null, the host
// float.  bias: a device fp32 [N] vector added per output column in the epilogue (CUTLASS LinCombPerColBias), or
// null for none.  ht_sm100_blockscaled_abi() names this signature; cutlass_ext/blockscaled.py refuses another.
//
// Compiled only for sm_100a (cutlass_ext/build.py --arch 100a, with the nvidia-cutlass headers); it has never run
// (no Blackwell GPU here): the CI compile check proves the instantiations, nothing more.
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/detail/sm100_blockscaled_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include <cstdint>
#include <type_traits>

#include "sf_layout.hpp"

namespace {

using namespace cute;

template <class ElementPairA, class ElementPairB, int AlignA, int AlignB, class TileShape, int SfVec>
struct BlockScaledGemm {
  using ElementD = cutlass::bfloat16_t;
  using ElementBias = float;
  using LayoutA = cutlass::layout::RowMajor;     // [M, K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // the K x N operand of an [N, K] K-contiguous weight
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int AlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using ClusterShape = Shape<_1, _1, _1>;
  // D = alpha * acc + bias[col] (no C operand); alpha from alpha_ptr when set
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBias<ElementD, float, ElementBias, void, float,
                                                              128 / cutlass::sizeof_bits<ElementBias>::value>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, AlignD, ElementD, LayoutD,
      AlignD, cutlass::epilogue::collective::EpilogueScheduleAuto, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementPairA, LayoutA, AlignA, ElementPairB,
      LayoutB, AlignB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::StrideA;
  using StrideB = typename Kernel::StrideB;
  using StrideD = typename Kernel::StrideD;
  using Config = typename Mainloop::Sm1xxBlkScaledConfig;
  using ElementA = typename Mainloop::ElementA;
  using ElementB = typename Mainloop::ElementB;
  using ElementSF = typename Mainloop::ElementSF;
  // the layout the CPU test proves (sf_layout.hpp) is the one this kernel reads
  static_assert(std::is_same_v<Config, typename ht_sm100::SfLayout<SfVec>::Config>,
                "the collective's scale-factor config is not sf_layout.hpp's");

  static typename Gemm::Arguments arguments(const void* a, const void* sfa, const void* b, const void* sfb, void* d,
                                            const float* bias, const float* alpha_ptr, int m, int n, int k,
                                            float alpha) {
    auto problem = make_shape(m, n, k, 1);
    StrideA sa = make_stride(int64_t(k), Int<1>{}, int64_t(m) * k);
    StrideB sb = make_stride(int64_t(k), Int<1>{}, int64_t(n) * k);
    StrideD sd = make_stride(int64_t(n), Int<1>{}, int64_t(m) * n);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        problem,
        {static_cast<const ElementA*>(a), sa, static_cast<const ElementB*>(b), sb,
         static_cast<const ElementSF*>(sfa), Config::tile_atom_to_shape_SFA(problem),
         static_cast<const ElementSF*>(sfb), Config::tile_atom_to_shape_SFB(problem)},
        {{}, nullptr, sd, static_cast<ElementD*>(d), sd}};
    auto& fusion = args.epilogue.thread;
    fusion.alpha = alpha;
    fusion.beta = 0.0f;
    fusion.alpha_ptr = alpha_ptr;  // null: the host alpha
    fusion.bias_ptr = bias;        // null: no bias (the row broadcast's null default, 0)
    return args;
  }

  static int run(const void* a, const void* sfa, const void* b, const void* sfb, void* d, const float* bias,
                 const float* alpha_ptr, int m, int n, int k, float alpha, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream) {
    Gemm gemm;
    auto args = arguments(a, sfa, b, sfb, d, bias, alpha_ptr, m, n, k, alpha);
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return -1;
    if (Gemm::get_workspace_size(args) > workspace_bytes) return -2;
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return -3;
    return gemm.run(stream) == cutlass::Status::kSuccess ? 0 : -4;
  }

  static size_t workspace(int m, int n, int k) {
    return Gemm::get_workspace_size(arguments(0, 0, 0, 0, 0, 0, 0, m, n, k, 1));
  }

  static void sf_elements(int m, int n, int k, long long* sfa, long long* sfb) {
    using L = ht_sm100::SfLayout<SfVec>;
    *sfa = L::elements(L::sfa(m, n, k));
    *sfb = L::elements(L::sfb(m, n, k));
  }
};

using NvFp4 = BlockScaledGemm<cutlass::nv_float4_t<cutlass::float_e2m1_t>, cutlass::nv_float4_t<cutlass::float_e2m1_t>,
                              32, 32, Shape<_128, _128, _256>, 16>;
using MxFp4 = BlockScaledGemm<cutlass::mx_float4_t<cutlass::float_e2m1_t>, cutlass::mx_float4_t<cutlass::float_e2m1_t>,
                              32, 32, Shape<_128, _128, _256>, 32>;
using MxFp8xFp4 = BlockScaledGemm<cutlass::mx_float8_t<cutlass::float_e4m3_t>,
                                  cutlass::mx_float4_t<cutlass::float_e2m1_t>, 16, 128, Shape<_128, _128, _128>, 32>;
using MxFp8 = BlockScaledGemm<cutlass::mx_float8_t<cutlass::float_e4m3_t>, cutlass::mx_float8_t<cutlass::float_e4m3_t>,
                              16, 16, Shape<_128, _128, _128>, 32>;

}  // namespace

extern "C" {

// The version of the signatures below (1: the first, unversioned ones, with a host alpha only and no bias).
int ht_sm100_blockscaled_abi() { return 2; }

// kind: 0 NVFP4 x NVFP4, 1 MXFP4 x MXFP4, 2 MXFP8 x MXFP4, 3 MXFP8 x MXFP8.  0: launched; < 0: CUTLASS refused (-1 shape,
// -2 workspace too small, -3 initialize, -4 run); -9: unknown kind.  bias (fp32 [N]) and alpha_ptr (fp32 scalar)
// are device pointers or null.
int ht_sm100_blockscaled_gemm(int kind, const void* a, const void* sfa, const void* b, const void* sfb, void* d,
                              const float* bias, const float* alpha_ptr, int m, int n, int k, float alpha,
                              void* workspace, size_t workspace_bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (kind) {
    case 0: return NvFp4::run(a, sfa, b, sfb, d, bias, alpha_ptr, m, n, k, alpha, workspace, workspace_bytes, s);
    case 1: return MxFp4::run(a, sfa, b, sfb, d, bias, alpha_ptr, m, n, k, alpha, workspace, workspace_bytes, s);
    case 2: return MxFp8xFp4::run(a, sfa, b, sfb, d, bias, alpha_ptr, m, n, k, alpha, workspace, workspace_bytes, s);
    case 3: return MxFp8::run(a, sfa, b, sfb, d, bias, alpha_ptr, m, n, k, alpha, workspace, workspace_bytes, s);
    default: return -9;
  }
}

size_t ht_sm100_blockscaled_workspace(int kind, int m, int n, int k) {
  switch (kind) {
    case 0: return NvFp4::workspace(m, n, k);
    case 1: return MxFp4::workspace(m, n, k);
    case 2: return MxFp8xFp4::workspace(m, n, k);
    case 3: return MxFp8::workspace(m, n, k);
    default: return 0;
  }
}

// Elements of SFA / SFB (one byte each) in the instruction's scale layout for an M x N x K problem.
int ht_sm100_sf_elements(int kind, int m, int n, int k, long long* sfa, long long* sfb) {
  switch (kind) {
    case 0: NvFp4::sf_elements(m, n, k, sfa, sfb); return 0;
    case 1: MxFp4::sf_elements(m, n, k, sfa, sfb); return 0;
    case 2: MxFp8xFp4::sf_elements(m, n, k, sfa, sfb); return 0;
    case 3: MxFp8::sf_elements(m, n, k, sfa, sfb); return 0;
    default: return -9;
  }
}

}  // extern "C"
