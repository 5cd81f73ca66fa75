#include "lib/stream_tuning.h"

#include <cstring>

#include "lib/cpu_features.h"

namespace qmoe {

uint32_t int4_l2_prefetch_bytes() {
  static const uint32_t bytes =
      std::strcmp(host_cpu_features().vendor, "GenuineIntel") == 0 ? 8192u : 0u;
  return bytes;
}

}  // namespace qmoe
