// The CUDA ABI (include/qmoe/qmoe_cuda.h): host-side argument checks, then the CUDA backend
// (lib/cuda_backend.h), or QMOE_STATUS_CUDA_UNAVAILABLE in a build without one.
#include "lib/cuda_backend.h"
#include "lib/error.h"
#include "qmoe/qmoe_cuda.h"

namespace qmoe {
namespace {

// The backend, or nullptr after recording why there is none.
const CudaBackend* backend_or_fail(const char* function) {
  const CudaBackend* backend = cuda_backend();
  if (backend == nullptr) {
    fail(QMOE_STATUS_CUDA_UNAVAILABLE, function, "libqmoe was built without CUDA (QMOE_CUDA=OFF)");
  }
  return backend;
}

}  // namespace
}  // namespace qmoe

extern "C" {

QMOE_API qmoe_status qmoe_cuda_get_device_count(int* device_count) {
  if (device_count == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "device_count out-pointer is NULL");
  }
  const qmoe::CudaBackend* backend = qmoe::backend_or_fail(__func__);
  if (backend == nullptr) return QMOE_STATUS_CUDA_UNAVAILABLE;
  return backend->get_device_count(__func__, device_count);
}

}  // extern "C"
