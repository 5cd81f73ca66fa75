// The MoE layer call in the shapes the tests use: given routing or router logits, FP32 or
// typed activations, optional run mask, accumulate and workspace. Each fills a qmoe_moe_params
// and calls qmoe_moe_forward, the one entry point, so every test goes through it.
#ifndef QMOE_TESTS_MOE_MOE_CALL_H_
#define QMOE_TESTS_MOE_MOE_CALL_H_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe::testing {

/// The less common fields of qmoe_moe_params.
struct MoeCallOptions {
  const uint8_t* run_mask = nullptr;
  int accumulate = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

inline qmoe_moe_params moe_params(qmoe_accuracy accuracy, uint32_t m, qmoe_dtype dtype,
                                  const void* x, size_t ldx, uint32_t k, void* y, size_t ldy,
                                  const MoeCallOptions* options) {
  qmoe_moe_params p;
  qmoe_moe_params_init(&p);
  p.accuracy = accuracy;
  p.m = m;
  p.dtype = dtype;
  p.x = x;
  p.ldx = ldx;
  p.k = k;
  p.y = y;
  p.ldy = ldy;
  if (options != nullptr) {
    p.run_mask = options->run_mask;
    p.accumulate = options->accumulate;
    p.workspace = options->workspace;
    p.workspace_bytes = options->workspace_bytes;
  }
  return p;
}

/// Given ids and weights [m, k], X and Y in `dtype`.
inline qmoe_status moe_forward_typed(qmoe_context* ctx, const qmoe_expert_set* set,
                                     qmoe_accuracy accuracy, uint32_t m, qmoe_dtype dtype,
                                     const void* x, size_t ldx, const int32_t* ids,
                                     const float* weights, uint32_t k, void* y, size_t ldy,
                                     const MoeCallOptions* options) {
  qmoe_moe_params p = moe_params(accuracy, m, dtype, x, ldx, k, y, ldy, options);
  p.ids = ids;
  p.weights = weights;
  return qmoe_moe_forward(ctx, set, &p);
}

inline qmoe_status moe_forward(qmoe_context* ctx, const qmoe_expert_set* set,
                               qmoe_accuracy accuracy, uint32_t m, const float* x, size_t ldx,
                               const int32_t* ids, const float* weights, uint32_t k, float* y,
                               size_t ldy, const MoeCallOptions* options) {
  return moe_forward_typed(ctx, set, accuracy, m, QMOE_DTYPE_F32, x, ldx, ids, weights, k, y, ldy,
                           options);
}

/// Router logits [m, E] in `dtype`, routed by the library.
inline qmoe_status moe_forward_logits_typed(qmoe_context* ctx, const qmoe_expert_set* set,
                                            qmoe_accuracy accuracy, uint32_t m, qmoe_dtype dtype,
                                            const void* x, size_t ldx, const void* logits,
                                            uint32_t k, int renormalize, void* y, size_t ldy,
                                            const MoeCallOptions* options) {
  qmoe_moe_params p = moe_params(accuracy, m, dtype, x, ldx, k, y, ldy, options);
  p.logits = logits;
  p.renormalize = renormalize;
  return qmoe_moe_forward(ctx, set, &p);
}

inline qmoe_status moe_forward_logits(qmoe_context* ctx, const qmoe_expert_set* set,
                                      qmoe_accuracy accuracy, uint32_t m, const float* x,
                                      size_t ldx, const float* logits, uint32_t k, int renormalize,
                                      float* y, size_t ldy, const MoeCallOptions* options) {
  return moe_forward_logits_typed(ctx, set, accuracy, m, QMOE_DTYPE_F32, x, ldx, logits, k,
                                  renormalize, y, ldy, options);
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_MOE_MOE_CALL_H_
