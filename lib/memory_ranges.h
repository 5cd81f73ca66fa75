// Whether two caller buffers share a byte: the aliasing check every ABI entry point makes
// between its inputs, outputs and workspace before it writes anything.
#ifndef QMOE_LIB_MEMORY_RANGES_H_
#define QMOE_LIB_MEMORY_RANGES_H_

#include <cstddef>
#include <cstdint>

namespace qmoe {

/// True when [a, a + a_bytes) and [b, b + b_bytes) share at least one byte; an empty range
/// overlaps nothing. Callers bound the sizes first, so the ends do not wrap.
inline bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

}  // namespace qmoe

#endif  // QMOE_LIB_MEMORY_RANGES_H_
