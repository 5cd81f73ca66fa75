// Writing an expert store file from expert sets (qmoe_expert_store_write).
#ifndef QMOE_LIB_STORE_STORE_WRITER_H_
#define QMOE_LIB_STORE_STORE_WRITER_H_

#include <cstdint>

#include "lib/moe/expert_set.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// Writes `num_layers` (>= 1) sets of one shape to `path` through "<path>.partial", flushed and
/// renamed; failure messages name `function`. See qmoe_expert_store_write.
qmoe_status write_expert_store(const char* path, const ExpertSet* const* layers,
                               uint32_t num_layers, const char* function);

}  // namespace qmoe

#endif  // QMOE_LIB_STORE_STORE_WRITER_H_
