// The checksum `qmoe run` reports of the hidden state: FNV-1a over its bytes, so two runs (or
// thread counts, or the CPU and the GPU decode) can be compared at a glance.
#ifndef QMOE_TOOLS_QMOE_RUN_CHECKSUM_H_
#define QMOE_TOOLS_QMOE_RUN_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

inline uint64_t fnv1a(const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

#endif  // QMOE_TOOLS_QMOE_RUN_CHECKSUM_H_
