// Importers into the canonical INT4 layout from ONNX Runtime's MatMulNBits/QMoE layout and from
// ggml's Q4_0 blocks (the qmoe_import_int4_* calls): bit-exact, every check included.
#ifndef QMOE_LIB_FORMATS_INT4_IMPORT_H_
#define QMOE_LIB_FORMATS_INT4_IMPORT_H_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe {

/// qmoe_import_int4_onnx; failure messages name `function`.
qmoe_status import_int4_onnx(const char* function, const uint8_t* src, uint32_t n, uint32_t k,
                             void* dst, size_t dst_bytes);
/// qmoe_import_int4_onnx_zero_points; failure messages name `function`.
qmoe_status import_int4_onnx_zero_points(const char* function, const uint8_t* src, uint32_t n,
                                         uint32_t k, uint32_t block_size, uint8_t* dst,
                                         size_t dst_row_stride, size_t dst_block_stride);
/// qmoe_import_int4_q4_0; failure messages name `function`.
qmoe_status import_int4_q4_0(const char* function, const void* src, uint32_t n, uint32_t k,
                             void* dst_codes, size_t dst_bytes, uint16_t* scales,
                             size_t scale_row_stride, size_t scale_block_stride);

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_INT4_IMPORT_H_
