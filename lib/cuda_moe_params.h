// The checks of a qmoe_cuda_moe_params that qmoe_cuda_moe_forward (lib/cuda_api.cc) and
// qmoe_cuda_offload_forward (lib/cuda_offload_api.cc) share: what the struct says about itself,
// not what it says about a set or a session; and the backend call both make of it.
#ifndef QMOE_LIB_CUDA_MOE_PARAMS_H_
#define QMOE_LIB_CUDA_MOE_PARAMS_H_

#include "lib/cuda_backend.h"
#include "qmoe/qmoe_cuda.h"

namespace qmoe {

/// Copies `params` into `out` (fields past an older caller's struct_size get their defaults),
/// then checks struct_size, accuracy and dtype: OK, or INVALID_ARGUMENT naming `function`.
qmoe_status read_moe_params(const qmoe_cuda_moe_params* params, const char* function,
                            qmoe_cuda_moe_params* out);

/// expected_tokens_per_expert: 0, or finite in [1, m_capacity] (m_capacity already checked).
qmoe_status check_tokens_per_expert_hint(const qmoe_cuda_moe_params& p, const char* function);

/// Exactly one routing: ids and weights (both), or logits.
qmoe_status check_one_routing(const qmoe_cuda_moe_params& p, const char* function);

/// The backend's call for checked params on `stream`.
CudaMoeCall moe_call_of(const qmoe_cuda_moe_params& p, qmoe_cuda_stream stream);

}  // namespace qmoe

#endif  // QMOE_LIB_CUDA_MOE_PARAMS_H_
