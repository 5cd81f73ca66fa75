// Memory that CPU kernels stream from: the allocator behind qmoe_alloc_weight_memory, also used
// for the bandwidth roof so that the roof and the kernels read the same kind of pages.
#ifndef QMOE_LIB_WEIGHT_MEMORY_H_
#define QMOE_LIB_WEIGHT_MEMORY_H_

#include <cstddef>

namespace qmoe {

/// Transparent huge page size on x86-64 Linux.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

/// `bytes` (>= 1) of uninitialised memory: 4096-byte aligned below kHugePageBytes; from there up
/// kHugePageBytes aligned, rounded up to whole huge pages and advised for transparent huge pages.
/// nullptr when the allocation fails. Free with free_streaming_memory (or std::free).
void* allocate_streaming_memory(size_t bytes);
void free_streaming_memory(void* memory);

}  // namespace qmoe

#endif  // QMOE_LIB_WEIGHT_MEMORY_H_
