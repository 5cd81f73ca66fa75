// The weight-format ABI: codes sizes, the grouped plane order, and the importers. The work and
// its checks are in lib/formats/; these are its C entry points.
#include "lib/error.h"
#include "lib/formats/format_traits.h"
#include "lib/formats/grouped_plane.h"
#include "lib/formats/int3_import.h"
#include "lib/formats/int4_import.h"
#include "lib/formats/mxfp4_import.h"
#include "lib/formats/nvfp4_import.h"
#include "lib/formats/quant_matrix.h"

extern "C" {

QMOE_API qmoe_status qmoe_quant_matrix_codes_size(qmoe_weight_format format, uint32_t n, uint32_t k,
                                                  size_t* bytes) {
  if (bytes == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "bytes out-pointer is NULL");
  const qmoe::FormatTraits* traits = qmoe::find_format(static_cast<int32_t>(format));
  if (traits == nullptr) {
    QMOE_FAIL(QMOE_STATUS_UNSUPPORTED_FORMAT, "weight format %d is not supported",
              static_cast<int>(format));
  }
  if (qmoe_status s = qmoe::check_matrix_dims(__func__, n, k); s != QMOE_STATUS_OK) return s;
  *bytes = qmoe::codes_size(*traits, n, k);
  return QMOE_STATUS_OK;
}

QMOE_API size_t qmoe_grouped_plane_elements(uint32_t n, uint32_t blocks) {
  return qmoe::grouped_plane_elements(n, blocks);
}

QMOE_API qmoe_status qmoe_group_plane(const void* src, uint32_t n, uint32_t blocks,
                                      size_t element_bytes, size_t src_row_stride,
                                      size_t src_block_stride, void* dst, size_t dst_bytes) {
  return qmoe::group_plane(__func__, src, n, blocks, element_bytes, src_row_stride,
                           src_block_stride, 0, dst, dst_bytes);
}

QMOE_API qmoe_status qmoe_import_int4_onnx(const uint8_t* src, uint32_t n, uint32_t k, void* dst,
                                           size_t dst_bytes) {
  return qmoe::import_int4_onnx(__func__, src, n, k, dst, dst_bytes);
}

QMOE_API qmoe_status qmoe_import_int4_onnx_zero_points(const uint8_t* src, uint32_t n, uint32_t k,
                                                       uint32_t block_size, uint8_t* dst,
                                                       size_t dst_row_stride,
                                                       size_t dst_block_stride) {
  return qmoe::import_int4_onnx_zero_points(__func__, src, n, k, block_size, dst, dst_row_stride,
                                            dst_block_stride);
}

QMOE_API qmoe_status qmoe_import_int4_q4_0(const void* src, uint32_t n, uint32_t k, void* dst_codes,
                                           size_t dst_bytes, uint16_t* scales,
                                           size_t scale_row_stride, size_t scale_block_stride) {
  return qmoe::import_int4_q4_0(__func__, src, n, k, dst_codes, dst_bytes, scales, scale_row_stride,
                                scale_block_stride);
}

QMOE_API qmoe_status qmoe_import_int3_packed(const uint8_t* src, uint32_t n, uint32_t k, void* dst,
                                             size_t dst_bytes) {
  return qmoe::import_int3_packed(__func__, src, n, k, dst, dst_bytes);
}

QMOE_API qmoe_status qmoe_import_mxfp4_gpt_oss(const uint8_t* blocks, uint32_t n, uint32_t k,
                                               void* dst, size_t dst_bytes) {
  return qmoe::import_mxfp4_gpt_oss(__func__, blocks, n, k, dst, dst_bytes);
}

QMOE_API qmoe_status qmoe_import_mxfp4_ggml(const void* src, uint32_t n, uint32_t k,
                                            void* dst_codes, size_t dst_bytes, uint8_t* scales,
                                            size_t scale_row_stride, size_t scale_block_stride) {
  return qmoe::import_mxfp4_ggml(__func__, src, n, k, dst_codes, dst_bytes, scales,
                                 scale_row_stride, scale_block_stride);
}

QMOE_API qmoe_status qmoe_import_nvfp4_modelopt(const uint8_t* src, uint32_t n, uint32_t k,
                                                void* dst, size_t dst_bytes) {
  return qmoe::import_nvfp4_modelopt(__func__, src, n, k, dst, dst_bytes);
}

}  // extern "C"
