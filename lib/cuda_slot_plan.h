// Which slot each resident expert of a device expert set occupies after a residency update
// (lib/cuda/device_expert_set.cu): plain host code, so its rules are tested on every machine.
//
// Rules: an expert resident before and after keeps its slot (its buffers are not copied again);
// every other expert of the new list takes a slot no expert of the new list holds, in
// ascending slot order, in the order of the list; slots of experts that leave become free. The
// result is a map expert -> slot (or -1) and its inverse slot -> expert (or -1), which agree.
#ifndef QMOE_LIB_CUDA_SLOT_PLAN_H_
#define QMOE_LIB_CUDA_SLOT_PLAN_H_

#include <cstdint>
#include <vector>

namespace qmoe {

struct SlotPlan {
  std::vector<int32_t> map;          // [E] expert -> slot, -1 when not resident
  std::vector<int32_t> slot_expert;  // [num_slots] slot -> expert, -1 when free
  // The experts to copy and where: (expert, slot), in the order of the list.
  std::vector<uint32_t> copy_expert, copy_slot;
};

/// Plans the update from `old_map` (E entries, each -1 or a slot below num_slots, no slot
/// twice) to the resident list ids[0, count) (distinct, each below E, count <= num_slots; the
/// caller checks all of it). Throws std::bad_alloc.
SlotPlan plan_slots(const std::vector<int32_t>& old_map, uint32_t num_slots, const uint32_t* ids,
                    uint32_t count);

}  // namespace qmoe

#endif  // QMOE_LIB_CUDA_SLOT_PLAN_H_
