// Router logits -> top-k expert ids and weights, with ONNX Runtime QMoE's numerics: experts
// ranked by logit, w_j = exp(l_j - l_max) * (1 / sum), in float, the sum over the k selected in
// rank order (renormalised) or over all experts in id order.
#include "lib/moe/routing.h"

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "lib/error.h"
#include "lib/memory_ranges.h"

namespace qmoe {

qmoe_status route_topk(const float* logits, uint32_t m, uint32_t num_experts, uint32_t k,
                       bool renormalize, int32_t* ids, float* weights, const char* function) {
  // Check everything first: a failure writes nothing.
  for (uint32_t t = 0; t < m; ++t) {
    const float* row = logits + size_t{t} * num_experts;
    bool any_finite = false;
    for (uint32_t e = 0; e < num_experts; ++e) {
      if (std::isnan(row[e]) || row[e] == INFINITY) {
        return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "logits[%u, %u] = %g is not allowed", t,
                    e, static_cast<double>(row[e]));
      }
      any_finite |= row[e] != -INFINITY;
    }
    if (!any_finite) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "logits row %u is -infinity only", t);
    }
  }

  for (uint32_t t = 0; t < m; ++t) {
    const float* row = logits + size_t{t} * num_experts;
    int32_t* top_id = ids + size_t{t} * k;
    float* top = weights + size_t{t} * k;  // holds the selected logits until the end
    // Insertion into a sorted top-k, experts visited in ascending id: a strict comparison
    // keeps the lower id first among equal logits. O(E * k), k is small.
    uint32_t count = 0;
    for (uint32_t e = 0; e < num_experts; ++e) {
      const float v = row[e];
      if (count == k && !(v > top[k - 1])) continue;
      uint32_t p = count < k ? count++ : k - 1;
      for (; p > 0 && v > top[p - 1]; --p) {
        top[p] = top[p - 1];
        top_id[p] = top_id[p - 1];
      }
      top[p] = v;
      top_id[p] = static_cast<int32_t>(e);
    }
    const float max = top[0];
    float sum = 0.0f;
    if (renormalize) {
      for (uint32_t j = 0; j < k; ++j) sum += std::exp(top[j] - max);
    } else {
      for (uint32_t e = 0; e < num_experts; ++e) sum += std::exp(row[e] - max);
    }
    const float scale = 1.0f / sum;  // sum >= 1: the top expert contributes exp(0)
    for (uint32_t j = 0; j < k; ++j) top[j] = std::exp(top[j] - max) * scale;
  }
  return QMOE_STATUS_OK;
}

}  // namespace qmoe
