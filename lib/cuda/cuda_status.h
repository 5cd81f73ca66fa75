// Mapping of CUDA runtime errors onto qmoe_status, for every lib/cuda entry point.
#ifndef QMOE_LIB_CUDA_CUDA_STATUS_H_
#define QMOE_LIB_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "qmoe/qmoe.h"

namespace qmoe::cuda {

/// QMOE_STATUS_OK for cudaSuccess; otherwise the status that tells the caller what to do
/// (no device/driver: CUDA_UNAVAILABLE; out of memory: OUT_OF_MEMORY; bad value: INVALID_ARGUMENT;
/// anything else: CUDA_ERROR), with the CUDA error name and `what` recorded as the message.
qmoe_status status_from_cuda(cudaError_t error, const char* function, const char* what);

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_CUDA_STATUS_H_
