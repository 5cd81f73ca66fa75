#include "lib/gemm/stream_tuning.h"

#include <cstring>

#include "lib/cpu_features.h"

// Overridable at build time for tuning runs, as QMOE_INT4_PREFETCH_BYTES is.
#ifndef QMOE_INT4_L2_PREFETCH_BYTES
#define QMOE_INT4_L2_PREFETCH_BYTES 8192
#endif

namespace qmoe {

uint32_t int4_l2_prefetch_bytes() {
  static const uint32_t bytes = std::strcmp(host_cpu_features().vendor, "GenuineIntel") == 0
                                    ? uint32_t{QMOE_INT4_L2_PREFETCH_BYTES}
                                    : 0u;
  return bytes;
}

}  // namespace qmoe
