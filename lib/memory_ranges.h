// Address arithmetic on caller buffers: whether two share a byte (the aliasing check every ABI
// entry point makes between its inputs, outputs and workspace before it writes anything),
// whether one wraps the address space, and 64-byte alignment of scratch pieces.
#ifndef QMOE_LIB_MEMORY_RANGES_H_
#define QMOE_LIB_MEMORY_RANGES_H_

#include <cstddef>
#include <cstdint>

namespace qmoe {

/// True when [a, a + a_bytes) and [b, b + b_bytes) share at least one byte; an empty range
/// overlaps nothing. Computed from the distance between the starts, so no end is formed: a
/// size that would run past the top of the address space (a caller's bogus workspace_bytes,
/// say) still counts every byte from its start up, instead of wrapping to a small end.
inline bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  if (a_bytes == 0 || b_bytes == 0) return false;
  return a0 <= b0 ? b0 - a0 < a_bytes : a0 - b0 < b_bytes;
}

/// (value + 63) & ~63, for carving 64-byte aligned pieces of scratch.
constexpr size_t align64(size_t value) {
  return (value + 63) & ~size_t{63};
}

/// True when [p, p + bytes) runs past the top of the address space.
inline bool range_wraps(const void* p, size_t bytes) {
  return bytes > UINTPTR_MAX - reinterpret_cast<uintptr_t>(p);
}

}  // namespace qmoe

#endif  // QMOE_LIB_MEMORY_RANGES_H_
