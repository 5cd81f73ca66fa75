// The residency update's slot planning (lib/cuda_slot_plan.h), on every machine: stayers keep
// their slots, joiners take the lowest free slots in list order, leavers free theirs, and the
// map and its inverse agree, over hand-written steps and random sequences of updates.
#include "lib/cuda_slot_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"

namespace qmoe::testing {
namespace {

// The plan's invariants for the update from old_map to ids.
void expect_valid_plan(const SlotPlan& plan, const std::vector<int32_t>& old_map,
                       uint32_t num_slots, const std::vector<uint32_t>& ids,
                       const std::string& where) {
  ASSERT_EQ(plan.map.size(), old_map.size()) << where;
  ASSERT_EQ(plan.slot_expert.size(), num_slots) << where;
  ASSERT_EQ(plan.copy_expert.size(), plan.copy_slot.size()) << where;
  std::vector<bool> listed(old_map.size(), false);
  for (uint32_t e : ids) listed[e] = true;
  uint32_t joiners = 0;
  for (uint32_t e = 0; e < old_map.size(); ++e) {
    if (!listed[e]) {
      EXPECT_EQ(plan.map[e], -1) << "expert " << e << " is not listed, " << where;
      continue;
    }
    ASSERT_GE(plan.map[e], 0) << "expert " << e << " has no slot, " << where;
    ASSERT_LT(plan.map[e], static_cast<int32_t>(num_slots)) << where;
    EXPECT_EQ(plan.slot_expert[plan.map[e]], static_cast<int32_t>(e)) << where;
    if (old_map[e] >= 0) {
      EXPECT_EQ(plan.map[e], old_map[e]) << "expert " << e << " moved, " << where;
    } else {
      ++joiners;
    }
  }
  uint32_t held = 0;
  for (uint32_t s = 0; s < num_slots; ++s) {
    if (plan.slot_expert[s] < 0) continue;
    ++held;
    EXPECT_EQ(plan.map[plan.slot_expert[s]], static_cast<int32_t>(s)) << where;
  }
  EXPECT_EQ(held, ids.size()) << where;
  // Exactly the joiners are copied, each into the slot the map gives it, in list order.
  ASSERT_EQ(plan.copy_expert.size(), joiners) << where;
  size_t at = 0;
  for (uint32_t e : ids) {
    if (old_map[e] >= 0) continue;
    EXPECT_EQ(plan.copy_expert[at], e) << where;
    EXPECT_EQ(static_cast<int32_t>(plan.copy_slot[at]), plan.map[e]) << where;
    ++at;
  }
}

TEST(SlotPlan, CreationPlacesTheIthExpertInSlotI) {
  const std::vector<int32_t> empty(6, -1);
  const std::vector<uint32_t> ids = {4, 1, 3};
  const SlotPlan plan = plan_slots(empty, 4, ids.data(), 3);
  EXPECT_EQ(plan.map, (std::vector<int32_t>{-1, 1, -1, 2, 0, -1}));
  EXPECT_EQ(plan.slot_expert, (std::vector<int32_t>{4, 1, 3, -1}));
  EXPECT_EQ(plan.copy_expert, ids);
  EXPECT_EQ(plan.copy_slot, (std::vector<uint32_t>{0, 1, 2}));
}

TEST(SlotPlan, StayersKeepSlotsAndJoinersTakeTheLowestFreeOnes) {
  // Slots: 0 <- 4, 1 <- 1, 2 <- 3, 3 free. New list {5, 3, 0, 1}: 3 and 1 stay in 2 and 1; 4
  // leaves slot 0; 5 takes slot 0 and 0 takes slot 3, though 5 is listed before the stayers.
  const std::vector<int32_t> old_map = {-1, 1, -1, 2, 0, -1};
  const std::vector<uint32_t> ids = {5, 3, 0, 1};
  const SlotPlan plan = plan_slots(old_map, 4, ids.data(), 4);
  EXPECT_EQ(plan.map, (std::vector<int32_t>{3, 1, -1, 2, -1, 0}));
  EXPECT_EQ(plan.slot_expert, (std::vector<int32_t>{5, 1, 3, 0}));
  EXPECT_EQ(plan.copy_expert, (std::vector<uint32_t>{5, 0}));
  EXPECT_EQ(plan.copy_slot, (std::vector<uint32_t>{0, 3}));
  // An empty list frees everything and copies nothing.
  const SlotPlan none = plan_slots(plan.map, 4, nullptr, 0);
  EXPECT_EQ(none.map, std::vector<int32_t>(6, -1));
  EXPECT_EQ(none.slot_expert, std::vector<int32_t>(4, -1));
  EXPECT_TRUE(none.copy_expert.empty());
}

TEST(SlotPlan, RandomUpdateSequencesKeepEveryInvariant) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t experts = 1 + static_cast<uint32_t>(rng() % 64);
    const uint32_t slots = 1 + static_cast<uint32_t>(rng() % experts);
    std::vector<int32_t> map(experts, -1);
    std::vector<uint32_t> all(experts);
    std::iota(all.begin(), all.end(), 0u);
    for (int step = 0; step < 20; ++step) {
      std::shuffle(all.begin(), all.end(), rng);
      const uint32_t count = static_cast<uint32_t>(rng() % (slots + 1));
      const std::vector<uint32_t> ids(all.begin(), all.begin() + count);
      const SlotPlan plan = plan_slots(map, slots, ids.data(), count);
      expect_valid_plan(plan, map, slots, ids,
                        "seed " + std::to_string(seed) + " trial " + std::to_string(trial) +
                            " step " + std::to_string(step));
      if (::testing::Test::HasFailure()) return;
      map = plan.map;
    }
  }
}

}  // namespace
}  // namespace qmoe::testing
