// The backend of a build without CUDA (QMOE_CUDA=OFF, or no toolkit found): none, so every CUDA
// ABI call reports QMOE_STATUS_CUDA_UNAVAILABLE after its argument checks (lib/cuda_api.cc).
#include "lib/cuda_backend.h"

namespace qmoe {

const CudaBackend* cuda_backend() {
  return nullptr;
}

}  // namespace qmoe
