// The tensor-core INT4 GEMM variants for X in FP32: split into BF16 hi + lo, two BF16 MMAs per
// slice. One X type per translation unit, so that the variants compile in parallel.
#include "lib/cuda/int4_gemm_tc_kernel.cuh"

namespace qmoe::cuda::tc {

cudaError_t launch_variant_f32(Int4GemmTcTile tile, uint32_t fold, const Params& p, dim3 grid,
                               cudaStream_t stream) {
  return launch_variant<XMode::kF32Split>(tile, fold, p, grid, stream);
}

cudaError_t configure_variants_f32(size_t max_shared_bytes) {
  return configure_variants<XMode::kF32Split>(max_shared_bytes);
}

}  // namespace qmoe::cuda::tc
