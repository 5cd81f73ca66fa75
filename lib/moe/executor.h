// The MoE layer executor: one forward whose arguments the ABI layer (lib/moe_api.cc) has
// checked, on the calling thread then in three parallel phases (lib/moe/executor.cc says how).
#ifndef QMOE_LIB_MOE_EXECUTOR_H_
#define QMOE_LIB_MOE_EXECUTOR_H_

#include <cstddef>
#include <cstdint>

#include "lib/context.h"
#include "lib/moe/expert_set.h"
#include "lib/moe/workspace_layout.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// One forward's inputs, checked: ids in [0, E), finite weights, [m, k] each.
struct MoeForward {
  qmoe_accuracy accuracy;
  uint32_t m, k;
  qmoe_dtype dtype;  // of x and y
  const void* x;
  size_t ldx;
  const int32_t* ids;
  const float* weights;
  const uint8_t* run_mask;  // nullptr: every expert
  bool accumulate;
  void* y;
  size_t ldy;
};

/// Run `f` with the workspace at `base` (64-byte aligned, laid out as `layout`).
void run_moe_forward(Context& ctx, const ExpertSet& s, const MoeForward& f, const MoeLayout& layout,
                     unsigned char* base);

}  // namespace qmoe

#endif  // QMOE_LIB_MOE_EXECUTOR_H_
