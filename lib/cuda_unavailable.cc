// The CUDA entry points of a build without lib/cuda: each reports CUDA_UNAVAILABLE.
#include "lib/error.h"

extern "C" {

QMOE_API qmoe_status qmoe_cuda_get_device_count(int* device_count) {
  QMOE_FAIL(QMOE_STATUS_CUDA_UNAVAILABLE, "libqmoe was built without CUDA (QMOE_CUDA=OFF)");
}

}  // extern "C"
