// Importer into the canonical INT3 layout from the upstream packing (ONNX Runtime's QMoE INT3
// weights): each row a contiguous LSB-first stream of 3-bit codes (the qmoe_import_int3_packed
// call): bit-exact, every check included.
#ifndef QMOE_LIB_FORMATS_INT3_IMPORT_H_
#define QMOE_LIB_FORMATS_INT3_IMPORT_H_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe {

/// qmoe_import_int3_packed; failure messages name `function`.
qmoe_status import_int3_packed(const char* function, const uint8_t* src, uint32_t n, uint32_t k,
                               void* dst, size_t dst_bytes);

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_INT3_IMPORT_H_
