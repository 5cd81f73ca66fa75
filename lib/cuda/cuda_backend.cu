// The CUDA backend (lib/cuda_backend.h): the table of lib/cuda's entry points.
#include <cuda_runtime_api.h>

#include "lib/cuda/cuda_status.h"
#include "lib/cuda_backend.h"

namespace qmoe {
namespace {

qmoe_status get_device_count(const char* function, int* device_count) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls start clean
    return cuda::status_from_cuda(error, function, "cudaGetDeviceCount");
  }
  *device_count = count;
  return QMOE_STATUS_OK;
}

constexpr CudaBackend kCudaBackend = {
    /*get_device_count=*/&get_device_count,
};

}  // namespace

const CudaBackend* cuda_backend() {
  return &kCudaBackend;
}

}  // namespace qmoe
