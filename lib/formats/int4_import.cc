// Importers into the canonical INT4 layout from ONNX Runtime's MatMulNBits/QMoE layout and
// from ggml's Q4_0 blocks. Both are bit-exact: every code keeps its value, the canonical
// padding is zero. Import runs once per weight load, so clarity wins over speed here.
#include "lib/formats/int4_import.h"

#include <cstdint>
#include <cstring>

#include "lib/error.h"
#include "lib/formats/format_traits.h"
#include "lib/formats/int4_layout.h"
#include "lib/formats/nibble_codes.h"
#include "lib/formats/quant_matrix.h"
#include "lib/memory_ranges.h"

namespace qmoe {

qmoe_status import_int4_onnx(const char* function, const uint8_t* src, uint32_t n, uint32_t k,
                             void* dst, size_t dst_bytes) {
  // ONNX Runtime: byte k / 2 holds even k in its low nibble, odd k in its high one.
  return import_nibble_pairs(function, kInt4Format, src, n, k, 2, dst, dst_bytes);
}

qmoe_status import_int4_onnx_zero_points(const char* function, const uint8_t* src, uint32_t n,
                                         uint32_t k, uint32_t block_size, uint8_t* dst,
                                         size_t dst_row_stride, size_t dst_block_stride) {
  if (src == nullptr || dst == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s is NULL",
                src == nullptr ? "src" : "dst");
  }
  if (qmoe_status s = check_matrix_dims(function, n, k); s != QMOE_STATUS_OK) return s;
  if (block_size == 0 || k % block_size != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "k = %u is not a multiple of block_size = %u", k, block_size);
  }
  const uint32_t blocks = k / block_size;
  if (!plane_strides_fit(n, blocks, dst_row_stride, dst_block_stride)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "dst strides (row %zu, block %zu) alias",
                dst_row_stride, dst_block_stride);
  }
  const size_t src_row_bytes = (size_t{blocks} + 1) / 2;
  size_t dst_extent = 0;
  if (!plane_bytes(dst, n, blocks, dst_row_stride, dst_block_stride, 0, 1, &dst_extent)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "dst strides (row %zu, block %zu) run past the end of the address space",
                dst_row_stride, dst_block_stride);
  }
  if (ranges_overlap(src, n * src_row_bytes, dst, dst_extent)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "src and dst overlap");
  }
  for (uint32_t row = 0; row < n; ++row) {
    for (uint32_t b = 0; b < blocks; ++b) {
      const uint8_t byte = src[row * src_row_bytes + b / 2];
      dst[row * dst_row_stride + b * dst_block_stride] = (byte >> (4 * (b % 2))) & 0x0F;
    }
  }
  return QMOE_STATUS_OK;
}

qmoe_status import_int4_q4_0(const char* function, const void* src, uint32_t n, uint32_t k,
                             void* dst_codes, size_t dst_bytes, uint16_t* scales,
                             size_t scale_row_stride, size_t scale_block_stride) {
  // block_q4_0: { uint16_t d (FP16); uint8_t qs[16]; } = 18 bytes, no padding; d is the
  // block's FP16 scale as it is.
  return import_ggml_nibble_blocks(function, kInt4Format, src, n, k, dst_codes, dst_bytes, scales,
                                   sizeof(uint16_t), scale_row_stride, scale_block_stride, nullptr);
}

}  // namespace qmoe
