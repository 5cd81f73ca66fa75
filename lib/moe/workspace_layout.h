// Where one MoE forward keeps its per-call data in its workspace (the caller's, or the context's
// scratch): route tables, prepared activations, FC1 and FC2 outputs, per-task GEMM scratch.
// Sized from the layer's shapes, the accuracy, M, k and the thread count alone, so
// qmoe_moe_workspace_size answers for any dtype and routing.
#ifndef QMOE_LIB_MOE_WORKSPACE_LAYOUT_H_
#define QMOE_LIB_MOE_WORKSPACE_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "lib/moe/expert_set.h"
#include "qmoe/qmoe.h"

namespace qmoe {

// Byte offsets of one forward's workspace pieces from its 64-byte aligned base.
struct MoeLayout {
  size_t counts, offsets, active, route_token, slot_route, ids, weights, logits;
  size_t tokens, gathered, h1, a2, y2, group_done, row_scratch;
  size_t total;
  bool direct_tokens;  // exact level, H % 32 == 0: FP32 X rows are read in place
};

/// The layout of one forward; false when the sizes do not fit in size_t.
bool make_moe_layout(const ExpertSet& s, qmoe_accuracy accuracy, uint32_t m, uint32_t k,
                     uint32_t threads, MoeLayout* out);

}  // namespace qmoe

#endif  // QMOE_LIB_MOE_WORKSPACE_LAYOUT_H_
