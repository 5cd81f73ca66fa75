#include "lib/cuda_slot_plan.h"

namespace qmoe {

SlotPlan plan_slots(const std::vector<int32_t>& old_map, uint32_t num_slots, const uint32_t* ids,
                    uint32_t count) {
  SlotPlan plan;
  plan.map.assign(old_map.size(), -1);
  plan.slot_expert.assign(num_slots, -1);
  // Stayers first, so a joiner never takes a slot a later stayer still holds.
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t e = ids[i];
    if (old_map[e] >= 0) {
      plan.map[e] = old_map[e];
      plan.slot_expert[static_cast<uint32_t>(old_map[e])] = static_cast<int32_t>(e);
    }
  }
  uint32_t next_free = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t e = ids[i];
    if (plan.map[e] >= 0) continue;
    // count <= num_slots and each expert holds one slot: a free one remains.
    while (plan.slot_expert[next_free] >= 0) ++next_free;
    plan.map[e] = static_cast<int32_t>(next_free);
    plan.slot_expert[next_free] = static_cast<int32_t>(e);
    plan.copy_expert.push_back(e);
    plan.copy_slot.push_back(next_free);
  }
  return plan;
}

}  // namespace qmoe
