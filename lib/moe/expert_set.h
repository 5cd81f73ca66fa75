// An expert set: the validated description of all experts of one MoE layer (qmoe_expert_set).
//
// Immutable after creation, so any number of forwards on any threads and contexts may read it
// at once. It holds the caller's weight pointers, never the weights.
//
// Handles: as with contexts (lib/context.h), the qmoe_expert_set the caller holds is a small
// shell {magic, ExpertSet*} that is never returned to the allocator; a destroyed shell is
// reused only after HandlePool::kQuarantine (lib/handle_pool.h) other sets have been destroyed, so
// a destroyed handle is rejected instead of being a use-after-free within that window.
#ifndef QMOE_LIB_MOE_EXPERT_SET_H_
#define QMOE_LIB_MOE_EXPERT_SET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "lib/gemm/gemm_plan.h"
#include "qmoe/qmoe.h"

namespace qmoe {

struct ExpertSet {
  uint32_t num_experts;
  uint32_t hidden;        // H
  uint32_t intermediate;  // I
  bool interleaved;       // QMOE_SWIGLU_INTERLEAVED, else concatenated
  float alpha, beta;
  bool clamp;  // a finite limit was given
  float limit;
  std::vector<GemmPlan> fc1;  // [2I, H] per expert
  std::vector<GemmPlan> fc2;  // [H, I] per expert
  size_t row_scratch_bytes;   // max gemm_row_scratch_bytes over every plan
  // Every byte range the plans read (codes, planes, biases of all experts), as [begin, end)
  // address pairs sorted and merged: a forward checks its outputs against them in O(log).
  std::vector<std::pair<uintptr_t, uintptr_t>> weight_ranges;
  // What the weights live in, when the library made that memory (an expert store file mapped
  // by qmoe_expert_store_map_layer): held until the set is destroyed, so the memory outlives
  // every use of the set whatever the caller closes first. Null for the caller's memory.
  std::shared_ptr<const void> owner;

  /// Whether [p, p + bytes) shares a byte with any weight of the set.
  bool overlaps_weights(const void* p, size_t bytes) const;
};

/// Plan every expert of a checked description (shapes against hidden and intermediate,
/// formats, planes) into a new set; on failure nothing is allocated and the message names
/// `function`, the expert and the field.
qmoe_status make_expert_set(const qmoe_expert_set_desc& desc, const char* function,
                            ExpertSet** set);

/// A handle for a set made by make_expert_set (which it then owns), or OUT_OF_MEMORY (the set
/// deleted). lib/expert_set_api.cc, with the handle shells.
qmoe_status publish_expert_set(ExpertSet* impl, const char* function, qmoe_expert_set** set);

/// The live ExpertSet behind a handle, or INVALID_ARGUMENT (message names `function`).
qmoe_status resolve_expert_set(const qmoe_expert_set* handle, const char* function,
                               const ExpertSet** set);

}  // namespace qmoe

#endif  // QMOE_LIB_MOE_EXPERT_SET_H_
