// `qmoe run --gpu --cache`'s residency schedule (tools/qmoe/residency_schedule.h): which experts
// each step runs resident when the expert cache moves them with begun updates, worked by hand,
// and its invariants on a longer random trace.
#include "tools/qmoe/residency_schedule.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace {

// A one-token, top-1 trace of one layer: ids[s] at step s, weight 1 (0 where `unrouted`).
RoutingTrace one_layer_trace(const std::vector<int32_t>& ids, const std::vector<bool>& unrouted) {
  RoutingTrace t;
  t.per_layer = 1;
  t.per_step = 1;
  t.ids = ids;
  for (size_t s = 0; s < ids.size(); ++s) t.weights.push_back(unrouted[s] ? 0.0f : 1.0f);
  return t;
}

std::vector<uint32_t> members(const std::vector<uint8_t>& in) {
  std::vector<uint32_t> out;
  for (uint32_t e = 0; e < in.size(); ++e) {
    if (in[e]) out.push_back(e);
  }
  return out;
}

using Ids = std::vector<uint32_t>;

TEST(ToolResidencySchedule, WithoutACacheEveryStepKeepsTheInitialResidency) {
  const RoutingTrace t = one_layer_trace({5, 6, 6, 7}, {false, false, false, false});
  ResidencySchedule r;
  ASSERT_EQ(build_residency_schedule(t, 4, 1, 8, 2, {{0, 1}}, CacheChoice{}, &r), QMOE_STATUS_OK);
  EXPECT_FALSE(r.cached);
  for (uint32_t s = 0; s < 4; ++s) EXPECT_EQ(members(r.resident(s, 0)), (Ids{0, 1}));
  EXPECT_EQ(r.promotions, 0u);
}

// LRU, two slots, {0, 1} placed first. Step 1 selects 6: the cache's list after it is {0, 6}
// (0 and 1 tie; the higher id goes), so step 2 starts that update and runs with the common
// expert {0} (6 is being copied), and step 3 with {0, 6}. Step 0's 5 ties the placements (they
// count as selected at step 0) and is not admitted; step 2's unrouted slot is not a selection.
TEST(ToolResidencySchedule, APromotedExpertRunsOnTheGpuFromTheSecondStepAfterItsSelection) {
  const RoutingTrace t = one_layer_trace({5, 6, 6, 7, 7}, {false, false, false, true, false});
  CacheChoice lru;
  lru.policy = QMOE_CACHE_POLICY_LRU;
  ResidencySchedule r;
  ASSERT_EQ(build_residency_schedule(t, 5, 1, 8, 2, {{0, 1}}, lru, &r), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  ASSERT_TRUE(r.cached);
  EXPECT_EQ(members(r.resident(0, 0)), (Ids{0, 1}));
  EXPECT_EQ(members(r.resident(1, 0)), (Ids{0, 1}));
  EXPECT_EQ(members(r.resident(2, 0)), (Ids{0}));
  EXPECT_EQ(members(r.resident(3, 0)), (Ids{0, 6}));
  EXPECT_EQ(members(r.resident(4, 0)), (Ids{0, 6}));  // step 3's 7 was not routed
  EXPECT_EQ(r.begins[2][0], 1);
  EXPECT_EQ(r.begin_lists[2][0], (Ids{0, 6}));
  for (uint32_t s : {0u, 1u, 3u, 4u}) EXPECT_EQ(r.begins[s][0], 0) << "step " << s;
  EXPECT_EQ(r.promotions, 1u);
}

// Every policy on a random two-layer trace: each step runs with the common experts of the two
// lists before it, within the slots, and the begun lists are the only changes.
TEST(ToolResidencySchedule, EachStepRunsTheCommonExpertsOfTheLastTwoLists) {
  constexpr uint32_t kLayers = 2, kExperts = 16, kSlots = 4, kSteps = 60, kPerLayer = 3;
  std::mt19937_64 rng(11);
  RoutingTrace t;
  t.per_layer = kPerLayer;
  t.per_step = kLayers * kPerLayer;
  for (uint32_t i = 0; i < kSteps * t.per_step; ++i) {
    t.ids.push_back(static_cast<int32_t>((rng() % kExperts) * (rng() % 2)));
    t.weights.push_back(rng() % 5 == 0 ? 0.0f : 0.5f);
  }
  for (qmoe_cache_policy policy :
       {QMOE_CACHE_POLICY_LRU, QMOE_CACHE_POLICY_LFU, QMOE_CACHE_POLICY_LFRU}) {
    CacheChoice choice;
    choice.policy = policy;
    choice.budget = 2;
    ResidencySchedule r;
    ASSERT_EQ(
        build_residency_schedule(t, kSteps, kLayers, kExperts, kSlots, {{1, 2}, {}}, choice, &r),
        QMOE_STATUS_OK);
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<uint8_t> older = r.resident(0, l), newer = older;  // R_{s-2}, R_{s-1}
      for (uint32_t s = 1; s < kSteps; ++s) {
        if (r.begins[s][l]) {
          older = newer;
          newer.assign(kExperts, 0);
          for (uint32_t e : r.begin_lists[s][l]) newer[e] = 1;
          ASSERT_LE(r.begin_lists[s][l].size(), kSlots);
        } else {
          older = newer;
        }
        for (uint32_t e = 0; e < kExperts; ++e) {
          ASSERT_EQ(r.resident(s, l)[e], older[e] & newer[e])
              << "policy " << policy << " layer " << l << " step " << s << " expert " << e;
        }
      }
    }
  }
}

}  // namespace
