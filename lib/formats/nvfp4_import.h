// Importer into the canonical NVFP4 layout from the packed layout of NVIDIA ModelOpt and
// TensorRT-LLM checkpoints (qmoe_import_nvfp4_modelopt): bit-exact, every check included.
#ifndef QMOE_LIB_FORMATS_NVFP4_IMPORT_H_
#define QMOE_LIB_FORMATS_NVFP4_IMPORT_H_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe {

/// qmoe_import_nvfp4_modelopt; failure messages name `function`.
qmoe_status import_nvfp4_modelopt(const char* function, const uint8_t* src, uint32_t n, uint32_t k,
                                  void* dst, size_t dst_bytes);

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_NVFP4_IMPORT_H_
