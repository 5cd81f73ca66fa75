// Scalar INT3 dequant-GEMM, fast level: the reference every SIMD tier is compared with, and the
// only path on non-x86 hosts. One call computes rows [row_begin, row_end) of one 8-row group;
// the numerics are the INT4 scalar kernel's (docs/formats.md, "Accuracy levels").
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::scalar {
namespace {
#include "lib/cpu/scalar/gemm_int3_8x32_scalar.inc"
}  // namespace

// Per chunk (or half chunk for block 16), the integer dot d = sum q_k * code_k, corrected by
// the zero point with the part's sum of q, then scaled:
// acc += (d - zero * sum_q) * (scale * x_scale).
void gemm_int3_fast_8x32(const GemmGroupArgs& a) {
  const uint32_t sub_blocks = a.block_size < kChunkCodes ? kChunkCodes / a.block_size : 1;
  const uint32_t sub_len = kChunkCodes / sub_blocks;
  for (uint32_t r = a.row_begin; r < a.row_end; ++r) {
    for (uint32_t i = 0; i < a.m; ++i) {
      const int8_t* q = a.xq.q + i * a.xq.q_stride;
      const float* x_scale = a.xq.scale + i * a.xq.chunk_stride;
      float acc = 0.0f;
      for (uint32_t c = 0; c < a.chunks; ++c) {
        uint8_t codes[kChunkCodes];
        unpack_int3_row(a.codes + size_t{c} * kInt3TileBytes, r, codes);
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
              static_cast<float>(dot) - int3_zero_point(a, block, r) * static_cast<float>(sum_q);
          acc += corrected * (int3_scale(a, block, r) * x_scale[c]);
        }
      }
      if (a.bias != nullptr) acc += a.bias[r];
      a.y[i * a.ldy + r] = acc;
    }
  }
}

}  // namespace qmoe::scalar
