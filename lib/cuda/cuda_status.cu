#include "lib/cuda/cuda_status.h"
#include "lib/error.h"

namespace qmoe::cuda {

qmoe_status status_from_cuda(cudaError_t error, const char* function, const char* what) {
  qmoe_status status;
  switch (error) {
    case cudaSuccess:
      return QMOE_STATUS_OK;
    // No usable driver or device: none at all, too old, the toolkit's stub library found
    // instead of a driver, a driver that does not match the kernel module, or devices all
    // taken (exclusive mode).
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNotSupported:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
      status = QMOE_STATUS_CUDA_UNAVAILABLE;
      break;
    case cudaErrorMemoryAllocation:
      status = QMOE_STATUS_OUT_OF_MEMORY;
      break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
      status = QMOE_STATUS_INVALID_ARGUMENT;
      break;
    default:
      status = QMOE_STATUS_CUDA_ERROR;
      break;
  }
  return fail(status, function, "%s failed: %s (%s)", what, cudaGetErrorName(error),
              cudaGetErrorString(error));
}

}  // namespace qmoe::cuda
