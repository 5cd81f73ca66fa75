// Top-k routing from router logits, shared by qmoe_moe_route_topk and qmoe_moe_forward on logits.
#ifndef QMOE_LIB_MOE_ROUTING_H_
#define QMOE_LIB_MOE_ROUTING_H_

#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe {

/// Check every logit (NaN, +infinity, a row without a finite value are INVALID_ARGUMENT, the
/// message naming `function`), then write ids and weights [m, k] as qmoe_moe_route_topk
/// documents. Pointers are non-null and 1 <= k <= num_experts; nothing is written on failure.
qmoe_status route_topk(const float* logits, uint32_t m, uint32_t num_experts, uint32_t k,
                       bool renormalize, int32_t* ids, float* weights, const char* function);

}  // namespace qmoe

#endif  // QMOE_LIB_MOE_ROUTING_H_
