// A quantized weight matrix in device memory, as the CUDA expert kernels read it.
//
// The bytes are those of the CPU path, copied as they are (docs/formats.md): canonical INT4
// codes tiled by 8 rows and 32 k,
//   byte((n, k)) = ((n / 8) * chunks + k / 32) * 128 + (n % 8) * 16 + (k % 16),
//   code k in the low nibble when k % 32 < 16, in the high nibble otherwise,
// rows and codes past N and K zero; a scale plane and an optional zero-point plane with the
// strides of qmoe_quant_matrix (element (n, b) at row_offset(n) + b * block_stride, where
// row_offset(n) = n * row_stride, or (n / 8) * group_stride + (n % 8) * row_stride when the
// group stride is nonzero); an optional bias of N elements. No pointer here is a host pointer.
#ifndef QMOE_LIB_CUDA_DEVICE_QUANT_MATRIX_CUH_
#define QMOE_LIB_CUDA_DEVICE_QUANT_MATRIX_CUH_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe::cuda {

constexpr uint32_t kGroupRows = 8;                             // rows of one code tile
constexpr uint32_t kChunkCodes = 32;                           // k of one code tile
constexpr uint32_t kChunkRowBytes = 16;                        // one row's codes of one tile
constexpr uint32_t kChunkBytes = kGroupRows * kChunkRowBytes;  // 128
constexpr uint32_t kInt4DefaultZeroPoint = 8;

struct DeviceQuantMatrix {
  uint32_t n;              // rows (output features)
  uint32_t k;              // columns, a multiple of block_size
  uint32_t block_size;     // 16, 32, 64 or 128
  uint32_t chunks;         // ceil(k / 32): tiles along k of one 8-row group
  const uint8_t* codes;    // ceil(n / 8) * chunks * 128 bytes
  qmoe_dtype scale_dtype;  // F32, F16 or BF16
  const void* scales;
  size_t scale_row_stride;  // elements
  size_t scale_block_stride;
  size_t scale_group_stride;   // 0: row offset n * row_stride
  const uint8_t* zero_points;  // nullptr: every zero point is 8
  size_t zero_point_row_stride;
  size_t zero_point_block_stride;
  size_t zero_point_group_stride;
  qmoe_dtype bias_dtype;  // F32, F16 or BF16, when bias is set
  const void* bias;       // nullptr: none
};

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_DEVICE_QUANT_MATRIX_CUH_
