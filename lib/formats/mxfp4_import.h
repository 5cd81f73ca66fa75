// Importers into the canonical MXFP4 layout from gpt-oss checkpoints' blocks tensors and from
// ggml's MXFP4 blocks (the qmoe_import_mxfp4_* calls): bit-exact in value, every check included.
#ifndef QMOE_LIB_FORMATS_MXFP4_IMPORT_H_
#define QMOE_LIB_FORMATS_MXFP4_IMPORT_H_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe {

/// qmoe_import_mxfp4_gpt_oss; failure messages name `function`.
qmoe_status import_mxfp4_gpt_oss(const char* function, const uint8_t* blocks, uint32_t n,
                                 uint32_t k, void* dst, size_t dst_bytes);
/// qmoe_import_mxfp4_ggml; failure messages name `function`.
qmoe_status import_mxfp4_ggml(const char* function, const void* src, uint32_t n, uint32_t k,
                              void* dst_codes, size_t dst_bytes, uint8_t* scales,
                              size_t scale_row_stride, size_t scale_block_stride);

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_MXFP4_IMPORT_H_
