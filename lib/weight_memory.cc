// qmoe_alloc_weight_memory / qmoe_free_weight_memory and the allocator behind them.
//
// Why huge pages: a cold expert is a sequential stream of a few MiB; on 4 KiB pages every page
// costs a TLB miss whose page walk itself misses the cache once the weights span GiBs, and the
// hardware prefetchers restart at every 4 KiB boundary. The measurements are in
// docs/results/2026-11-30-moe-layer-and-decode.md. madvise is advice: where THP is off, or no
// huge page is free, the memory is ordinary pages and still correct.
#include "lib/weight_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

#include "lib/error.h"
#include "qmoe/qmoe.h"

namespace qmoe {

void* allocate_streaming_memory(size_t bytes) {
  constexpr size_t kPage = 4096;
  if (bytes == 0 || bytes > SIZE_MAX - kHugePageBytes) return nullptr;
  const size_t alignment = bytes >= kHugePageBytes ? kHugePageBytes : kPage;
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* memory = std::aligned_alloc(alignment, rounded);
#if defined(MADV_HUGEPAGE)
  if (memory != nullptr && alignment == kHugePageBytes) madvise(memory, rounded, MADV_HUGEPAGE);
#endif
  return memory;
}

void free_streaming_memory(void* memory) {
  std::free(memory);
}

}  // namespace qmoe
