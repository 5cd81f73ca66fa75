#include "lib/cuda_moe_params.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "lib/abi_enum.h"
#include "lib/error.h"
#include "lib/gemm/activation_dtype.h"
#include "lib/struct_size.h"

namespace qmoe {

qmoe_status read_moe_params(const qmoe_cuda_moe_params* params, const char* function,
                            qmoe_cuda_moe_params* out) {
  if (params == nullptr) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params is NULL");
  // Versions: up to workspace_bytes, then expected_tokens_per_expert, then expert_counts.
  const FieldSpan fields[] = {QMOE_FIELD(qmoe_cuda_moe_params, expected_tokens_per_expert),
                              QMOE_FIELD(qmoe_cuda_moe_params, expert_counts)};
  if (!struct_size_ok(params->struct_size,
                      offsetof(qmoe_cuda_moe_params, expected_tokens_per_expert), fields)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->struct_size is %zu, not the size of any version of the struct; set it "
                "to sizeof(qmoe_cuda_moe_params) (%zu)",
                params->struct_size, sizeof(qmoe_cuda_moe_params));
  }
  *out = qmoe_cuda_moe_params{};  // every default of qmoe_cuda_moe_params_init past the copy is 0
  std::memcpy(out, params, std::min(params->struct_size, sizeof *out));
  const int32_t accuracy = enum_bits(out->accuracy);
  if (accuracy != QMOE_ACCURACY_EXACT && accuracy != QMOE_ACCURACY_FAST) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->accuracy %d is not a qmoe_accuracy", accuracy);
  }
  if (!is_activation_dtype(static_cast<qmoe_dtype>(enum_bits(out->dtype)))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params->dtype %d is not F32, F16 or BF16",
                enum_bits(out->dtype));
  }
  if (reinterpret_cast<uintptr_t>(out->expert_counts) % alignof(uint32_t) != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->expert_counts is not aligned to its 4-byte words");
  }
  return QMOE_STATUS_OK;
}

qmoe_status check_tokens_per_expert_hint(const qmoe_cuda_moe_params& p, const char* function) {
  const float hint = p.expected_tokens_per_expert;
  // A routed expert holds at least one of the call's tokens and at most all of them.
  if (hint != 0.0f && !(hint >= 1.0f && hint <= static_cast<float>(p.m_capacity))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->expected_tokens_per_expert = %g must be 0 (no hint) or in [1, "
                "m_capacity = %u]",
                static_cast<double>(hint), p.m_capacity);
  }
  return QMOE_STATUS_OK;
}

qmoe_status check_one_routing(const qmoe_cuda_moe_params& p, const char* function) {
  const bool given = p.ids != nullptr || p.weights != nullptr;
  if (given == (p.logits != nullptr) || (given && (p.ids == nullptr || p.weights == nullptr))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "pass either params->ids and params->weights, or params->logits");
  }
  return QMOE_STATUS_OK;
}

CudaMoeCall moe_call_of(const qmoe_cuda_moe_params& p, qmoe_cuda_stream stream) {
  CudaMoeCall c{};
  c.accuracy = p.accuracy;
  c.dtype = p.dtype;
  c.m_capacity = p.m_capacity;
  c.m = p.m;
  c.x = p.x;
  c.ldx = p.ldx;
  c.y = p.y;
  c.ldy = p.ldy;
  c.k = p.k;
  c.ids = p.ids;
  c.weights = p.weights;
  c.logits = p.logits;
  c.renormalize = p.renormalize != 0;
  c.accumulate = p.accumulate != 0;
  c.workspace = p.workspace;
  c.workspace_bytes = p.workspace_bytes;
  c.stream = stream;
  c.expected_tokens_per_expert = p.expected_tokens_per_expert;
  c.expert_counts = p.expert_counts;
  return c;
}

}  // namespace qmoe
