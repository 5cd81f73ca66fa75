// The weight-memory ABI: memory the CPU kernels stream well (lib/weight_memory.h).
#include "lib/error.h"
#include "lib/weight_memory.h"

extern "C" {

QMOE_API qmoe_status qmoe_alloc_weight_memory(size_t bytes, void** memory) {
  using namespace qmoe;
  if (memory == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "memory out-pointer is NULL");
  if (bytes == 0) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "bytes is 0");
  void* allocated = allocate_streaming_memory(bytes);
  if (allocated == nullptr) {
    QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "allocating %zu bytes of weight memory failed", bytes);
  }
  *memory = allocated;
  return QMOE_STATUS_OK;
}

QMOE_API void qmoe_free_weight_memory(void* memory) {
  qmoe::free_streaming_memory(memory);
}

}  // extern "C"
