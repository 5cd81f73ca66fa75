// The TMA tensor-map encoder (tensor_map.h).
#include <cudaTypedefs.h>

#include <mutex>

#include "lib/cuda/tensor_map.h"

namespace qmoe::cuda {
namespace {

// cuTensorMapEncodeTiled as of CUDA 12.0 (its signature since), or nullptr.
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    } else {
      cudaGetLastError();  // the failed query leaves nothing behind for the caller's next check
    }
  });
  return fn;
}

}  // namespace

bool tensor_map_encoder_available() {
  return encoder() != nullptr;
}

cudaError_t encode_tile_map_u16_sw128(const void* base, uint64_t inner, uint64_t outer,
                                      uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer,
                                      CUtensorMap* map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {row_bytes};  // bytes between rows; the innermost is implied
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace qmoe::cuda
