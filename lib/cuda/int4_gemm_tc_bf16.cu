// The tensor-core INT4 GEMM variants for X in BF16: straight into BF16 MMAs. One X type per
// translation unit, so that the variants compile in parallel.
#include "lib/cuda/int4_gemm_tc_kernel.cuh"

namespace qmoe::cuda::tc {

cudaError_t launch_variant_bf16(Int4GemmTcTile tile, uint32_t fold, const Params& p, dim3 grid,
                                cudaStream_t stream) {
  return launch_variant<XMode::kBf16>(tile, fold, p, grid, stream);
}

cudaError_t configure_variants_bf16(size_t max_shared_bytes) {
  return configure_variants<XMode::kBf16>(max_shared_bytes);
}

}  // namespace qmoe::cuda::tc
