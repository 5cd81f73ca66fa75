// Tensor maps for the TMA (Hopper's tensor memory accelerator), encoded by the driver's
// cuTensorMapEncodeTiled. The library reaches that function through the runtime
// (cudaGetDriverEntryPointByVersion) rather than linking the driver library, so that it still
// loads on a machine without a GPU driver.
#ifndef QMOE_LIB_CUDA_TENSOR_MAP_H_
#define QMOE_LIB_CUDA_TENSOR_MAP_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qmoe::cuda {

// Whether this process's driver has cuTensorMapEncodeTiled (resolved once).
bool tensor_map_encoder_available();

// A 2-D map of 16-bit elements: rows of `inner` elements, `outer` rows `row_bytes` apart (a
// multiple of 16), `base` 16-byte aligned; boxes of box_inner x box_outer elements (box_inner
// * 2 <= 128), stored in shared memory with the 128-byte swizzle; elements outside the tensor
// read as zero. cudaErrorNotSupported without the encoder, cudaErrorInvalidValue when the
// driver rejects the description.
cudaError_t encode_tile_map_u16_sw128(const void* base, uint64_t inner, uint64_t outer,
                                      uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer,
                                      CUtensorMap* map);

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_TENSOR_MAP_H_
