// A quantized weight matrix in device memory, as the CUDA expert kernels read it.
//
// The bytes are those of the CPU path, copied as they are (docs/formats.md): canonical 4-bit
// codes (INT4, or MXFP4's and NVFP4's E2M1 codes, which use the same nibbles byte for byte)
// tiled by 8 rows and 32 k,
//   byte((n, k)) = ((n / 8) * chunks + k / 32) * 128 + (n % 8) * 16 + (k % 16),
//   code k in the low nibble when k % 32 < 16, in the high nibble otherwise,
// or INT3's 96-byte tiles of the same 8 rows and 32 k (lib/cuda/int3_tile.cuh), a group's tiles
// contiguous as well; rows and codes past N and K zero; a scale plane and an optional zero-point
// plane with the strides of qmoe_quant_matrix (element (n, b) at row_offset(n) + b * block_stride,
// where row_offset(n) = n * row_stride, or (n / 8) * group_stride + (n % 8) * row_stride when the
// group stride is nonzero); an optional bias of N elements. No pointer here is a host pointer.
//
// The format decides the planes: INT4 and INT3 have FP32/FP16/BF16 scales per 16, 32, 64 or 128
// k and optional zero points; MXFP4 one E8M0 byte per 32 k, NVFP4 one E4M3 byte per 16 k (a plane
// of one-byte elements), neither with zero points; NVFP4 also multiplies every output by
// global_scale. The decode kernels pick their compiled variant from `format` once per launch
// (lib/cuda/decode_formats.cuh).
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
// INT3's tile (lib/formats/int3_layout.h, whose constants these mirror: the kernel sources include
// no lib/formats header, so that the emulation tests can compile them under another namespace;
// lib/cuda/device_expert_set.cu asserts that the two agree): 96 bytes, rows 0-5 whole in
// kChunkRowBytes each, zero point 4 without a plane.
constexpr uint32_t kInt3ChunkBytes = 96;
constexpr uint32_t kInt3WholeRows = 6;
constexpr uint32_t kInt3DefaultZeroPoint = 4;

struct DeviceQuantMatrix {
  uint32_t n;              // rows (output features)
  uint32_t k;              // columns, a multiple of block_size
  uint32_t block_size;     // 16, 32, 64 or 128
  uint32_t chunks;         // ceil(k / 32): tiles along k of one 8-row group
  const uint8_t* codes;    // ceil(n / 8) * chunks * code_chunk_bytes(format) bytes
  qmoe_dtype scale_dtype;  // INT4, INT3: F32, F16 or BF16; MXFP4: E8M0; NVFP4: F8_E4M3
  // format and global_scale sit in what was the padding after scale_dtype and bias_dtype, so
  // the struct's size (the MoE kernels copy it to shared memory and registers) and every other
  // field's offset are those the INT4 kernels had before the E2M1 formats came.
  qmoe_weight_format format;  // INT4, INT3, MXFP4 or NVFP4
  const void* scales;
  size_t scale_row_stride;  // elements
  size_t scale_block_stride;
  size_t scale_group_stride;   // 0: row offset n * row_stride
  const uint8_t* zero_points;  // nullptr: every zero point is 8 (INT3: 4)
  size_t zero_point_row_stride;
  size_t zero_point_block_stride;
  size_t zero_point_group_stride;
  qmoe_dtype bias_dtype;  // F32, F16 or BF16, when bias is set
  float global_scale;     // NVFP4: finite and > 0 (1 for none); unused by the others
  const void* bias;       // nullptr: none
};

// Bytes of one 8-row x 32-code tile of a format's codes: 96 for INT3, 128 for the 4-bit ones.
__host__ __device__ inline uint32_t code_chunk_bytes(qmoe_weight_format f) {
  return f == QMOE_WEIGHT_FORMAT_INT3 ? kInt3ChunkBytes : kChunkBytes;
}

// Bytes of one scale-plane element: FP32 4, FP16 and BF16 2, the E2M1 formats' E8M0 and E4M3 1.
__host__ __device__ inline uint32_t scale_element_bytes(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? 4 : d == QMOE_DTYPE_F16 || d == QMOE_DTYPE_BF16 ? 2 : 1;
}

static_assert(sizeof(DeviceQuantMatrix) == 112, "the INT4 kernels' layout (see format above)");

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_DEVICE_QUANT_MATRIX_CUH_
