// The scale-factor layout the sm_100a block-scaled GEMMs (blockscaled_gemm.cu) read, in one place: the kernels
// take their SFA / SFB layouts from here (blockscaled_gemm.cu static_asserts that each collective's
// Sm1xxBlkScaledConfig is this Config), and tests/test_blockscaled_layout.py compiles a host-only probe against this
// header that prints the offset of every (row, scale column) -- CuTe layouts are host-callable -- and compares them
// element for element with cutlass_ext.blockscaled.sf_offsets (the Python writer of this layout).
//
// Header-only and host-callable: it needs the CUTLASS / CuTe headers and the CUDA toolkit's headers, no GPU.
#pragma once

#include <cutlass/detail/sm100_blockscaled_layout.hpp>

namespace ht_sm100 {

// Vec: elements of K per scale (16 for NVFP4, 32 for MX formats).
template <int Vec>
struct SfLayout {
  using Config = cutlass::detail::Sm1xxBlockScaledConfig<Vec>;

  // coordinates (row in [0, M) or [0, N), element of K, batch 0) -> byte offset of that row's scale of the
  // K group holding the element (the Vec elements of a group map to one offset: stride 0)
  static auto sfa(int m, int n, int k) { return Config::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1)); }
  static auto sfb(int m, int n, int k) { return Config::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1)); }

  // bytes the layout spans: rows padded to 128, scale columns to 4 (the zero strides of the Vec mode dropped)
  template <class Layout>
  static long long elements(Layout const& layout) {
    return static_cast<long long>(cute::size(cute::filter_zeros(layout)));
  }
};

}  // namespace ht_sm100
