// Scalar INT3 dequant-GEMM, exact level: the reference every SIMD tier is compared with, and the
// only path on non-x86 hosts. One call computes rows [row_begin, row_end) of one 8-row group;
// the numerics are the INT4 scalar kernel's (docs/formats.md, "Accuracy levels").
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::scalar {
namespace {
#include "lib/cpu/scalar/gemm_int3_8x32_scalar.inc"
}  // namespace

// Per block, s = sum_k x_k * (code_k - zero) in FP32, then acc += s * scale.
void gemm_int3_exact_8x32(const GemmGroupArgs& a) {
  const uint32_t sub_blocks = a.block_size < kChunkCodes ? kChunkCodes / a.block_size : 1;
  const uint32_t sub_len = kChunkCodes / sub_blocks;
  for (uint32_t r = a.row_begin; r < a.row_end; ++r) {
    for (uint32_t i = 0; i < a.m; ++i) {
      const float* x = a.x + i * a.ldx;
      float acc = 0.0f;
      float block_sum = 0.0f;
      for (uint32_t c = 0; c < a.chunks; ++c) {
        uint8_t codes[kChunkCodes];
        unpack_int3_row(a.codes + size_t{c} * kInt3TileBytes, r, codes);
        for (uint32_t s = 0; s < sub_blocks; ++s) {
          const uint32_t k0 = c * kChunkCodes + s * sub_len;
          const uint32_t block = k0 / a.block_size;
          const float z = int3_zero_point(a, block, r);
          for (uint32_t j = 0; j < sub_len; ++j) {
            block_sum += x[k0 + j] * (static_cast<float>(codes[s * sub_len + j]) - z);
          }
          // Close the block at its last code.
          if ((k0 + sub_len) % a.block_size == 0 || c + 1 == a.chunks) {
            acc += block_sum * int3_scale(a, block, r);
            block_sum = 0.0f;
          }
        }
      }
      if (a.bias != nullptr) acc += a.bias[r];
      a.y[i * a.ldy + r] = acc;
    }
  }
}

}  // namespace qmoe::scalar
