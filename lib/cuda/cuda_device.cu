// Device discovery.
#include "lib/cuda/cuda_status.h"
#include "lib/error.h"

extern "C" {

QMOE_API qmoe_status qmoe_cuda_get_device_count(int* device_count) {
  if (device_count == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "device_count out-pointer is NULL");
  }
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return qmoe::cuda::status_from_cuda(error, __func__, "cudaGetDeviceCount");
  }
  *device_count = count;
  return QMOE_STATUS_OK;
}

}  // extern "C"
