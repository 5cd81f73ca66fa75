// Scalar INT4 dequant-GEMM kernels: the reference every SIMD tier is compared with, and the
// only path on non-x86 hosts. One call computes rows [row_begin, row_end) of one 8-row group.
#include <cstring>

#include "lib/cpu/kernels.h"
#include "lib/formats/int4_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::scalar {
namespace {

// The 32 codes of row r of chunk c, in k order.
void unpack_chunk_row(const uint8_t* chunk, uint32_t r, uint8_t codes[kChunkCodes]) {
  const uint8_t* bytes = chunk + r * kChunkRowBytes;
  for (uint32_t j = 0; j < kChunkRowBytes; ++j) {
    codes[j] = bytes[j] & 0x0F;
    codes[j + 16] = bytes[j] >> 4;
  }
}

float zero_point(const GemmGroupArgs& a, uint32_t block, uint32_t r) {
  return a.zero_points != nullptr
             ? static_cast<float>(a.zero_points[block * a.zero_point_block_stride + r])
             : static_cast<float>(kInt4DefaultZeroPoint);
}

float scale(const GemmGroupArgs& a, uint32_t block, uint32_t r) {
  const size_t i = block * a.scale_block_stride + r;
  float value;
  switch (a.scale_dtype) {
    case QMOE_DTYPE_F16:
      convert_f16_to_f32(static_cast<const uint16_t*>(a.scales) + i, &value, 1);
      return value;
    case QMOE_DTYPE_BF16:
      convert_bf16_to_f32(static_cast<const uint16_t*>(a.scales) + i, &value, 1);
      return value;
    case QMOE_DTYPE_F32:
    case QMOE_DTYPE_E8M0:  // no INT4 scale type: its traits row refuses them
    case QMOE_DTYPE_F8_E4M3:
      break;
  }
  return static_cast<const float*>(a.scales)[i];
}

}  // namespace

// Exact: per block, s = sum_k x_k * (code_k - zero) in FP32, then acc += s * scale.
void gemm_int4_exact_8x32(const GemmGroupArgs& a) {
  const uint32_t sub_blocks = a.block_size < kChunkCodes ? kChunkCodes / a.block_size : 1;
  const uint32_t sub_len = kChunkCodes / sub_blocks;
  for (uint32_t r = a.row_begin; r < a.row_end; ++r) {
    for (uint32_t i = 0; i < a.m; ++i) {
      const float* x = a.x + i * a.ldx;
      float acc = 0.0f;
      float block_sum = 0.0f;
      for (uint32_t c = 0; c < a.chunks; ++c) {
        uint8_t codes[kChunkCodes];
        unpack_chunk_row(a.codes + size_t{c} * kChunkBytes, r, codes);
        for (uint32_t s = 0; s < sub_blocks; ++s) {
          const uint32_t k0 = c * kChunkCodes + s * sub_len;
          const uint32_t block = k0 / a.block_size;
          const float z = zero_point(a, block, r);
          for (uint32_t j = 0; j < sub_len; ++j) {
            block_sum += x[k0 + j] * (static_cast<float>(codes[s * sub_len + j]) - z);
          }
          // Close the block at its last code.
          if ((k0 + sub_len) % a.block_size == 0 || c + 1 == a.chunks) {
            acc += block_sum * scale(a, block, r);
            block_sum = 0.0f;
          }
        }
      }
      if (a.bias != nullptr) acc += a.bias[r];
      a.y[i * a.ldy + r] = acc;
    }
  }
}

// Fast: per chunk, the integer dot d = sum q_k * code_k, corrected by the zero point with the
// chunk's sum of q, then scaled: acc += (d - zero * sum_q) * (scale * x_scale).
void gemm_int4_fast_8x32(const GemmGroupArgs& a) {
  const uint32_t sub_blocks = a.block_size < kChunkCodes ? kChunkCodes / a.block_size : 1;
  const uint32_t sub_len = kChunkCodes / sub_blocks;
  for (uint32_t r = a.row_begin; r < a.row_end; ++r) {
    for (uint32_t i = 0; i < a.m; ++i) {
      const int8_t* q = a.xq.q + i * a.xq.q_stride;
      const float* x_scale = a.xq.scale + i * a.xq.chunk_stride;
      float acc = 0.0f;
      for (uint32_t c = 0; c < a.chunks; ++c) {
        uint8_t codes[kChunkCodes];
        unpack_chunk_row(a.codes + size_t{c} * kChunkBytes, r, codes);
        for (uint32_t s = 0; s < sub_blocks; ++s) {
          const uint32_t k0 = c * kChunkCodes + s * sub_len;
          const uint32_t block = k0 / a.block_size;
          int32_t dot = 0;
          int32_t sum_q = 0;
          for (uint32_t j = 0; j < sub_len; ++j) {
            dot += static_cast<int32_t>(codes[s * sub_len + j]) * q[k0 + j];
            sum_q += q[k0 + j];
          }
          const float corrected =
              static_cast<float>(dot) - zero_point(a, block, r) * static_cast<float>(sum_q);
          acc += corrected * (scale(a, block, r) * x_scale[c]);
        }
      }
      if (a.bias != nullptr) acc += a.bias[r];
      a.y[i * a.ldy + r] = acc;
    }
  }
}

}  // namespace qmoe::scalar
