// What one CUDA ABI file needs of another's handles: the resident expert set behind a
// qmoe_cuda_expert_set (lib/cuda_api.cc), for the offload session's checks
// (lib/cuda_offload_api.cc), and the session object behind a qmoe_cuda_offload, for tests.
#ifndef QMOE_LIB_CUDA_HANDLES_H_
#define QMOE_LIB_CUDA_HANDLES_H_

#include <cstdint>

#include "qmoe/qmoe_cuda.h"

namespace qmoe {

struct CudaExpertSetView {
  void* impl;  // the backend's object
  uint32_t num_experts;
  uint32_t hidden;
};

/// The live set behind `handle`, or INVALID_ARGUMENT (message naming `function`).
qmoe_status resolve_cuda_expert_set(const qmoe_cuda_expert_set* handle, const char* function,
                                    CudaExpertSetView* view);

/// The backend's session object behind a live handle (nullptr otherwise): for tests, which
/// reach the ring and the service through lib/cuda/offload_session.cuh.
void* offload_session_object(const qmoe_cuda_offload* handle);

}  // namespace qmoe

#endif  // QMOE_LIB_CUDA_HANDLES_H_
