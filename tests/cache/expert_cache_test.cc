// The expert cache policy (include/qmoe/qmoe_cache.h): each policy on steps worked by hand,
// every policy against a reference written another way (linear scans, one admission at a time)
// on random traces, the counters, concurrent calls, and bad input to every entry point.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "qmoe/qmoe_cache.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/destroy_race.h"

namespace qmoe::testing {
namespace {

struct CacheDeleter {
  void operator()(qmoe_expert_cache* cache) const { qmoe_expert_cache_destroy(cache); }
};
using CachePtr = std::unique_ptr<qmoe_expert_cache, CacheDeleter>;

qmoe_expert_cache_desc cache_desc(uint32_t layers, uint32_t experts, uint32_t slots,
                                  qmoe_cache_policy policy, float half_life = 32.0f,
                                  uint32_t budget = 0, float margin = 0.0f) {
  qmoe_expert_cache_desc d;
  qmoe_expert_cache_desc_init(&d);
  d.num_layers = layers;
  d.num_experts = experts;
  d.num_slots = slots;
  d.policy = policy;
  d.half_life_steps = half_life;
  d.max_promotions_per_step = budget;
  d.admission_margin = margin;
  return d;
}

CachePtr make_cache(const qmoe_expert_cache_desc& d) {
  qmoe_expert_cache* cache = nullptr;
  EXPECT_EQ(qmoe_expert_cache_create(&d, &cache), QMOE_STATUS_OK) << qmoe_last_error_message();
  return CachePtr(cache);
}

std::vector<uint32_t> residency(const qmoe_expert_cache* cache, uint32_t layer) {
  uint32_t count = 0;
  EXPECT_EQ(qmoe_expert_cache_get_residency(cache, layer, nullptr, 0, &count), QMOE_STATUS_OK);
  std::vector<uint32_t> ids(count);
  uint32_t again = 0;
  EXPECT_EQ(qmoe_expert_cache_get_residency(cache, layer, ids.data(), count, &again),
            QMOE_STATUS_OK);
  EXPECT_EQ(again, count);
  return ids;
}

// One step of a one-layer cache: observe `ids`, end the step, return the residency after it.
std::vector<uint32_t> step(qmoe_expert_cache* cache, const std::vector<int32_t>& ids) {
  EXPECT_EQ(qmoe_expert_cache_observe(cache, 0, ids.data(), ids.size()), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_expert_cache_end_step(cache), QMOE_STATUS_OK);
  return residency(cache, 0);
}

qmoe_expert_cache_stats stats_of(const qmoe_expert_cache* cache, uint32_t layer) {
  qmoe_expert_cache_stats s;
  std::memset(&s, 0xAB, sizeof s);
  s.struct_size = sizeof s;
  EXPECT_EQ(qmoe_expert_cache_get_stats(cache, layer, &s), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  return s;
}

using Ids = std::vector<uint32_t>;

// ---- each policy by hand -------------------------------------------------------------------

TEST(ExpertCache, LruKeepsTheLatestSteps) {
  CachePtr cache = make_cache(cache_desc(1, 4, 2, QMOE_CACHE_POLICY_LRU));
  EXPECT_EQ(step(cache.get(), {0, 1}), (Ids{0, 1}));  // free slots
  // 0 and 1 tie (last step 0, no selection now): the higher id goes.
  EXPECT_EQ(step(cache.get(), {2}), (Ids{0, 2}));
  // 1 (two selections) and 3 (one) both beat 0 (step 0) and 2 (step 1).
  EXPECT_EQ(step(cache.get(), {1, 1, 3}), (Ids{1, 3}));
  EXPECT_EQ(step(cache.get(), {1}), (Ids{1, 3}));  // a hit changes nothing
  const qmoe_expert_cache_stats s = stats_of(cache.get(), 0);
  EXPECT_EQ(s.steps, 4u);
  EXPECT_EQ(s.selections, 7u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.promotions, 5u);
  EXPECT_EQ(s.evictions, 3u);
}

TEST(ExpertCache, LfuAdmitsOnlyStrictlyMoreSelections) {
  CachePtr cache = make_cache(cache_desc(1, 3, 1, QMOE_CACHE_POLICY_LFU));
  EXPECT_EQ(step(cache.get(), {0, 0}), (Ids{0}));
  EXPECT_EQ(step(cache.get(), {1}), (Ids{0}));  // 1 against 2
  EXPECT_EQ(step(cache.get(), {1}), (Ids{0}));  // 2 against 2: a tie keeps the resident
  EXPECT_EQ(step(cache.get(), {1}), (Ids{1}));  // 3 against 2
  EXPECT_EQ(stats_of(cache.get(), 0).evictions, 1u);
}

// With a half-life of one step, counts halve at each end_step: expert 0's four selections of
// step 0 are worth 2 after step 1 and 1 after step 2, where expert 1 has 2 and then 3. LFU on
// the same trace keeps expert 0 (4 against 4).
TEST(ExpertCache, LfruForgetsWhereLfuRemembers) {
  CachePtr lfru = make_cache(cache_desc(1, 2, 1, QMOE_CACHE_POLICY_LFRU, 1.0f));
  CachePtr lfu = make_cache(cache_desc(1, 2, 1, QMOE_CACHE_POLICY_LFU));
  for (qmoe_expert_cache* cache : {lfru.get(), lfu.get()}) {
    EXPECT_EQ(step(cache, {0, 0, 0, 0}), (Ids{0}));
    EXPECT_EQ(step(cache, {1, 1}), (Ids{0}));  // 2 against 2 in both
  }
  EXPECT_EQ(step(lfru.get(), {1, 1}), (Ids{1}));  // 3 against 1
  EXPECT_EQ(step(lfu.get(), {1, 1}), (Ids{0}));   // 4 against 4
}

TEST(ExpertCache, StaticChangesOnlyWhereTheRuntimeSetsIt) {
  CachePtr cache = make_cache(cache_desc(1, 6, 3, QMOE_CACHE_POLICY_STATIC, NAN));
  EXPECT_EQ(step(cache.get(), {0, 1, 2, 2}), Ids{});
  const uint32_t placement[] = {4, 1};
  ASSERT_EQ(qmoe_expert_cache_set_residency(cache.get(), 0, placement, 2), QMOE_STATUS_OK);
  EXPECT_EQ(residency(cache.get(), 0), (Ids{1, 4}));
  EXPECT_EQ(step(cache.get(), {1, 3, 3, 3, 4, -1}), (Ids{1, 4}));
  const qmoe_expert_cache_stats s = stats_of(cache.get(), 0);
  EXPECT_EQ(s.selections, 9u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.promotions, 2u);
  EXPECT_EQ(s.evictions, 0u);
}

// Every policy takes a placement, and an online one moves on from it. A placed expert without
// history counts as selected once in the step it was placed, so the first newcomer (one
// selection too) does not take its slot.
TEST(ExpertCache, SetResidencyWarmStartsAnOnlinePolicy) {
  CachePtr cache = make_cache(cache_desc(1, 5, 2, QMOE_CACHE_POLICY_LRU));
  const uint32_t placement[] = {3, 4};
  ASSERT_EQ(qmoe_expert_cache_set_residency(cache.get(), 0, placement, 2), QMOE_STATUS_OK);
  EXPECT_EQ(step(cache.get(), {3, 0}), (Ids{3, 4}));  // 0 ties 4 (step 0): no admission
  EXPECT_EQ(step(cache.get(), {0}), (Ids{0, 3}));     // 3 and 4 tie: the higher id goes
  const uint32_t other[] = {0, 1};
  ASSERT_EQ(qmoe_expert_cache_set_residency(cache.get(), 0, other, 2), QMOE_STATUS_OK);
  const qmoe_expert_cache_stats s = stats_of(cache.get(), 0);
  EXPECT_EQ(s.selections, 3u);  // the placements are not selections
  EXPECT_EQ(s.promotions, 4u);  // 3, 4; 0; 1
  EXPECT_EQ(s.evictions, 2u);   // 4; 3
  ASSERT_EQ(qmoe_expert_cache_set_residency(cache.get(), 0, nullptr, 0), QMOE_STATUS_OK);
  EXPECT_EQ(residency(cache.get(), 0), Ids{});
}

TEST(ExpertCache, APlacementOutlastsANewcomerOfOneSelection) {
  for (const qmoe_cache_policy policy : {QMOE_CACHE_POLICY_LFU, QMOE_CACHE_POLICY_LFRU}) {
    CachePtr cache = make_cache(cache_desc(1, 6, 2, policy, 1000.0f));
    const uint32_t placement[] = {0, 1};
    ASSERT_EQ(qmoe_expert_cache_set_residency(cache.get(), 0, placement, 2), QMOE_STATUS_OK);
    EXPECT_EQ(step(cache.get(), {5}), (Ids{0, 1})) << policy;
    // 5 now has two selections to the placements' one (decayed a little under LFRU).
    EXPECT_EQ(step(cache.get(), {5}), (Ids{0, 5})) << policy;
  }
}

TEST(ExpertCache, BudgetLimitsAdmissionsPerStep) {
  CachePtr cache = make_cache(cache_desc(1, 8, 8, QMOE_CACHE_POLICY_LRU, 32.0f, 2));
  // Six candidates of equal score and selections: the lower ids first, two a step.
  EXPECT_EQ(step(cache.get(), {5, 4, 3, 2, 1, 0}), (Ids{0, 1}));
  EXPECT_EQ(step(cache.get(), {}), (Ids{0, 1, 2, 3}));
  EXPECT_EQ(step(cache.get(), {}), (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(step(cache.get(), {}), (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(stats_of(cache.get(), 0).promotions, 6u);
}

// A newcomer takes a resident's slot only when its score passes the resident's by more than the
// margin: selections under LFU (a fraction too), steps under LRU; a free slot needs no margin.
TEST(ExpertCache, AdmissionMarginHoldsResidentsUntilANewcomerPassesIt) {
  CachePtr lfu = make_cache(cache_desc(1, 3, 1, QMOE_CACHE_POLICY_LFU, 32.0f, 0, 2.0f));
  EXPECT_EQ(step(lfu.get(), {0}), (Ids{0}));  // a free slot
  EXPECT_EQ(step(lfu.get(), {1}), (Ids{0}));  // 1 against 1
  EXPECT_EQ(step(lfu.get(), {1}), (Ids{0}));  // 2 against 1 + 2
  EXPECT_EQ(step(lfu.get(), {1}), (Ids{0}));  // 3 against 1 + 2
  EXPECT_EQ(step(lfu.get(), {1}), (Ids{1}));  // 4 against 1 + 2
  CachePtr half = make_cache(cache_desc(1, 3, 1, QMOE_CACHE_POLICY_LFU, 32.0f, 0, 0.5f));
  EXPECT_EQ(step(half.get(), {0}), (Ids{0}));
  EXPECT_EQ(step(half.get(), {1}), (Ids{0}));  // 1 against 1.5
  EXPECT_EQ(step(half.get(), {1}), (Ids{1}));  // 2 against 1.5
  // LRU: expert 0 last selected at step 0 goes once a newcomer's step passes 0 + 2.
  CachePtr lru = make_cache(cache_desc(1, 3, 1, QMOE_CACHE_POLICY_LRU, 32.0f, 0, 2.0f));
  EXPECT_EQ(step(lru.get(), {0}), (Ids{0}));
  EXPECT_EQ(step(lru.get(), {1}), (Ids{0}));  // step 1
  EXPECT_EQ(step(lru.get(), {1}), (Ids{0}));  // step 2
  EXPECT_EQ(step(lru.get(), {2}), (Ids{2}));  // step 3: 2, selected now, beats 1 (step 2) too
  EXPECT_EQ(stats_of(lru.get(), 0).evictions, 1u);
}

TEST(ExpertCache, PaddingIsNotASelection) {
  CachePtr cache = make_cache(cache_desc(1, 4, 1, QMOE_CACHE_POLICY_LFU));
  EXPECT_EQ(step(cache.get(), {-1, 2, -1}), (Ids{2}));
  EXPECT_EQ(stats_of(cache.get(), 0).selections, 1u);
}

TEST(ExpertCache, LayersAreIndependentAndStatsSumOverThem) {
  CachePtr cache = make_cache(cache_desc(3, 4, 2, QMOE_CACHE_POLICY_LRU));
  const int32_t a[] = {0, 1, 2}, b[] = {3}, c[] = {3, 3};
  ASSERT_EQ(qmoe_expert_cache_observe(cache.get(), 0, a, 3), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_expert_cache_observe(cache.get(), 2, b, 1), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_expert_cache_observe(cache.get(), 2, c, 2), QMOE_STATUS_OK);  // twice a step
  ASSERT_EQ(qmoe_expert_cache_end_step(cache.get()), QMOE_STATUS_OK);
  EXPECT_EQ(residency(cache.get(), 0), (Ids{0, 1}));
  EXPECT_EQ(residency(cache.get(), 1), Ids{});
  EXPECT_EQ(residency(cache.get(), 2), (Ids{3}));
  ASSERT_EQ(qmoe_expert_cache_observe(cache.get(), 2, c, 2), QMOE_STATUS_OK);
  const qmoe_expert_cache_stats all = stats_of(cache.get(), QMOE_EXPERT_CACHE_ALL_LAYERS);
  EXPECT_EQ(all.steps, 1u);
  EXPECT_EQ(all.selections, 8u);
  EXPECT_EQ(all.hits, 2u);
  EXPECT_EQ(all.promotions, 3u);
  EXPECT_EQ(all.evictions, 0u);
  EXPECT_EQ(stats_of(cache.get(), 2).steps, 1u);
  EXPECT_EQ(stats_of(cache.get(), 2).selections, 5u);
}

// ---- against a reference ------------------------------------------------------------------

// The policy as the header states it, written another way: each admission scans for the best
// non-resident expert and the weakest resident that was not admitted in this step.
class ReferenceLayer {
 public:
  ReferenceLayer(uint32_t experts, uint32_t slots, qmoe_cache_policy policy, float half_life,
                 uint32_t budget, float margin)
      : slots_(slots),
        policy_(policy),
        decay_(std::exp2(-1.0 / static_cast<double>(half_life))),
        budget_(budget),
        margin_(margin),
        resident_(experts, false),
        now_(experts, 0),
        last_(experts, -1),
        frequency_(experts, 0.0) {}

  void observe(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      if (id < 0) continue;
      ++counters.selections;
      counters.hits += resident_[id] ? 1 : 0;
      ++now_[id];
    }
  }

  void set_residency(const std::vector<uint32_t>& ids) {
    std::vector<bool> next(resident_.size(), false);
    for (uint32_t e : ids) {
      next[e] = true;
      if (!has_score(e) && now_[e] == 0) now_[e] = 1;  // the placement's one selection
    }
    for (size_t e = 0; e < next.size(); ++e) {
      counters.promotions += next[e] && !resident_[e];
      counters.evictions += resident_[e] && !next[e];
    }
    resident_ = next;
  }

  void end_step(int64_t step) {
    const size_t experts = resident_.size();
    if (policy_ == QMOE_CACHE_POLICY_STATIC) {
      std::fill(now_.begin(), now_.end(), 0u);
      return;
    }
    for (size_t e = 0; e < experts; ++e) {
      if (policy_ == QMOE_CACHE_POLICY_LFRU) {
        frequency_[e] = frequency_[e] * decay_ + now_[e];
        if (frequency_[e] < std::numeric_limits<double>::min()) frequency_[e] = 0.0;
      } else {
        frequency_[e] += now_[e];
      }
      if (now_[e] != 0) last_[e] = step;
    }
    {
      std::vector<bool> admitted(experts, false);
      for (uint32_t n = 0; budget_ == 0 || n < budget_; ++n) {
        int best = -1, weakest = -1;
        size_t count = 0;
        for (size_t e = 0; e < experts; ++e) {
          count += resident_[e];
          if (!resident_[e] && has_score(e) && (best < 0 || better(e, best))) best = int(e);
          if (resident_[e] && !admitted[e] && (weakest < 0 || weaker(e, weakest))) {
            weakest = int(e);
          }
        }
        if (best < 0) break;
        if (count >= slots_) {
          if (weakest < 0 || !(score(best) > score(weakest) + margin_)) break;
          resident_[weakest] = false;
          ++counters.evictions;
        }
        resident_[best] = true;
        admitted[best] = true;
        ++counters.promotions;
      }
    }
    std::fill(now_.begin(), now_.end(), 0u);
  }

  Ids residents() const {
    Ids ids;
    for (size_t e = 0; e < resident_.size(); ++e) {
      if (resident_[e]) ids.push_back(uint32_t(e));
    }
    return ids;
  }

  qmoe_expert_cache_stats counters{};

 private:
  double score(size_t e) const {
    return policy_ == QMOE_CACHE_POLICY_LRU ? double(last_[e]) : frequency_[e];
  }
  bool has_score(size_t e) const {
    return policy_ == QMOE_CACHE_POLICY_LRU ? last_[e] >= 0 : frequency_[e] > 0.0;
  }
  bool better(size_t a, size_t b) const {  // a before b as a candidate
    if (score(a) != score(b)) return score(a) > score(b);
    if (now_[a] != now_[b]) return now_[a] > now_[b];
    return a < b;
  }
  bool weaker(size_t a, size_t b) const {  // a before b as a victim
    if (score(a) != score(b)) return score(a) < score(b);
    if (now_[a] != now_[b]) return now_[a] < now_[b];
    return a > b;
  }

  uint32_t slots_;
  qmoe_cache_policy policy_;
  double decay_;
  uint32_t budget_;
  double margin_;
  std::vector<bool> resident_;
  std::vector<uint32_t> now_;
  std::vector<int64_t> last_;
  std::vector<double> frequency_;
};

TEST(ExpertCache, EveryPolicyMatchesTheReferenceOnRandomTraces) {
  std::mt19937_64 rng(fresh_seed());
  const qmoe_cache_policy policies[] = {QMOE_CACHE_POLICY_STATIC, QMOE_CACHE_POLICY_LRU,
                                        QMOE_CACHE_POLICY_LFU, QMOE_CACHE_POLICY_LFRU};
  const uint32_t expert_counts[] = {1, 2, 5, 16, 128};
  const float half_lives[] = {1.0f, 2.5f, 32.0f};
  const float margins[] = {0.0f, 0.0f, 0.5f, 1.0f, 2.5f, 4.0f};
  constexpr uint32_t kLayers = 2, kSteps = 80;
  int cases = 0;
  for (const qmoe_cache_policy policy : policies) {
    for (const uint32_t experts : expert_counts) {
      for (int draw = 0; draw < 6; ++draw) {
        const uint32_t slots = 1 + uint32_t(rng() % experts);
        const uint32_t budget = uint32_t(rng() % 4);  // 0: none
        const float half_life = half_lives[rng() % 3];
        const float margin = margins[rng() % 6];
        // Skewed routing: squaring a uniform draw favours the low ids, whose popularity the
        // trace shifts by a rotation every 20 steps, so residents go stale and get replaced.
        CachePtr cache =
            make_cache(cache_desc(kLayers, experts, slots, policy, half_life, budget, margin));
        ASSERT_NE(cache, nullptr);
        std::vector<ReferenceLayer> reference(
            kLayers, ReferenceLayer(experts, slots, policy, half_life, budget, margin));
        for (uint32_t s = 0; s < kSteps; ++s) {
          for (uint32_t l = 0; l < kLayers; ++l) {
            if (rng() % 20 == 0) {  // a runtime's placement now and then
              Ids ids(experts);
              for (uint32_t e = 0; e < experts; ++e) ids[e] = e;
              std::shuffle(ids.begin(), ids.end(), rng);
              ids.resize(rng() % (slots + 1));
              ASSERT_EQ(
                  qmoe_expert_cache_set_residency(cache.get(), l, ids.data(), uint32_t(ids.size())),
                  QMOE_STATUS_OK);
              reference[l].set_residency(ids);
            }
            std::vector<int32_t> ids(rng() % 24);
            for (int32_t& id : ids) {
              const double u = double(rng() % 1000000) / 1e6;
              id =
                  rng() % 8 == 0 ? -1 : int32_t((uint32_t(u * u * experts) + s / 20 + l) % experts);
            }
            ASSERT_EQ(qmoe_expert_cache_observe(cache.get(), l, ids.data(), ids.size()),
                      QMOE_STATUS_OK);
            reference[l].observe(ids);
          }
          ASSERT_EQ(qmoe_expert_cache_end_step(cache.get()), QMOE_STATUS_OK);
          for (uint32_t l = 0; l < kLayers; ++l) {
            reference[l].end_step(s);
            const Ids got = residency(cache.get(), l);
            ASSERT_EQ(got, reference[l].residents())
                << "policy " << policy << ", E " << experts << ", slots " << slots << ", budget "
                << budget << ", half-life " << half_life << ", margin " << margin << ", layer " << l
                << ", step " << s;
            ASSERT_LE(got.size(), slots);
          }
        }
        for (uint32_t l = 0; l < kLayers; ++l) {
          const qmoe_expert_cache_stats s = stats_of(cache.get(), l);
          EXPECT_EQ(s.steps, kSteps);
          EXPECT_EQ(s.selections, reference[l].counters.selections);
          EXPECT_EQ(s.hits, reference[l].counters.hits);
          EXPECT_EQ(s.promotions, reference[l].counters.promotions);
          EXPECT_EQ(s.evictions, reference[l].counters.evictions);
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 4 * 5 * 6);
}

// Per-expert counts are the same observation as the ids they count: two caches fed each form
// of the same random trace keep the same residency at every step and the same counters.
TEST(ExpertCache, CountsObserveAsTheIdsTheyCount) {
  std::mt19937_64 rng(fresh_seed());
  constexpr uint32_t kExperts = 12, kSteps = 60;
  for (const qmoe_cache_policy policy : {QMOE_CACHE_POLICY_STATIC, QMOE_CACHE_POLICY_LRU,
                                         QMOE_CACHE_POLICY_LFU, QMOE_CACHE_POLICY_LFRU}) {
    const qmoe_expert_cache_desc d = cache_desc(1, kExperts, 4, policy, 4.0f, 2);
    CachePtr by_ids = make_cache(d), by_counts = make_cache(d);
    for (uint32_t s = 0; s < kSteps; ++s) {
      std::vector<int32_t> ids(rng() % 20);
      std::vector<uint32_t> counts(kExperts, 0);
      for (int32_t& id : ids) {
        id = static_cast<int32_t>((rng() % kExperts) * (rng() % 2));
        ++counts[static_cast<uint32_t>(id)];
      }
      ASSERT_EQ(qmoe_expert_cache_observe(by_ids.get(), 0, ids.data(), ids.size()), QMOE_STATUS_OK);
      ASSERT_EQ(qmoe_expert_cache_observe_counts(by_counts.get(), 0, counts.data(), kExperts),
                QMOE_STATUS_OK)
          << qmoe_last_error_message();
      ASSERT_EQ(qmoe_expert_cache_end_step(by_ids.get()), QMOE_STATUS_OK);
      ASSERT_EQ(qmoe_expert_cache_end_step(by_counts.get()), QMOE_STATUS_OK);
      ASSERT_EQ(residency(by_ids.get(), 0), residency(by_counts.get(), 0))
          << "policy " << policy << ", step " << s;
    }
    const qmoe_expert_cache_stats a = stats_of(by_ids.get(), 0), b = stats_of(by_counts.get(), 0);
    EXPECT_EQ(a.selections, b.selections);
    EXPECT_EQ(a.hits, b.hits);
    EXPECT_EQ(a.promotions, b.promotions);
    EXPECT_EQ(a.evictions, b.evictions);
  }
}

// ---- threads ------------------------------------------------------------------------------

// Observers on every layer, a thread ending steps and one reading counters and residency, all
// at once: every selection is counted once and no residency exceeds the slots (and under TSan,
// no data race).
TEST(ExpertCache, ConcurrentCallsCountEverySelection) {
  constexpr uint32_t kLayers = 4, kExperts = 32, kSlots = 6, kCallsPerThread = 3000;
  CachePtr cache = make_cache(cache_desc(kLayers, kExperts, kSlots, QMOE_CACHE_POLICY_LFRU));
  std::atomic<bool> done{false};
  std::vector<std::thread> observers;
  for (uint32_t l = 0; l < kLayers; ++l) {
    observers.emplace_back([&, l] {
      for (uint32_t i = 0; i < kCallsPerThread; ++i) {
        const int32_t ids[2] = {int32_t((i * 7 + l) % kExperts), int32_t((i * 3) % kExperts)};
        EXPECT_EQ(qmoe_expert_cache_observe(cache.get(), l, ids, 2), QMOE_STATUS_OK);
      }
    });
  }
  std::thread stepper([&] {
    while (!done.load(std::memory_order_acquire)) {
      EXPECT_EQ(qmoe_expert_cache_end_step(cache.get()), QMOE_STATUS_OK);
    }
  });
  std::thread reader([&] {
    while (!done.load(std::memory_order_acquire)) {
      for (uint32_t l = 0; l < kLayers; ++l) {
        uint32_t ids[kExperts], count = 0;
        EXPECT_EQ(qmoe_expert_cache_get_residency(cache.get(), l, ids, kExperts, &count),
                  QMOE_STATUS_OK);
        EXPECT_LE(count, kSlots);
      }
      const qmoe_expert_cache_stats s = stats_of(cache.get(), QMOE_EXPERT_CACHE_ALL_LAYERS);
      EXPECT_LE(s.hits, s.selections);
    }
  });
  for (std::thread& t : observers) t.join();
  done.store(true, std::memory_order_release);
  stepper.join();
  reader.join();
  EXPECT_EQ(stats_of(cache.get(), QMOE_EXPERT_CACHE_ALL_LAYERS).selections,
            uint64_t{kLayers} * kCallsPerThread * 2);
}

// ---- bad input ----------------------------------------------------------------------------

TEST(ExpertCacheApi, DescInitSetsTheDefaults) {
  qmoe_expert_cache_desc d;
  std::memset(&d, 0xFF, sizeof d);
  qmoe_expert_cache_desc_init(&d);
  EXPECT_EQ(d.struct_size, sizeof d);
  EXPECT_EQ(d.policy, QMOE_CACHE_POLICY_LFRU);
  EXPECT_EQ(d.half_life_steps, 32.0f);
  EXPECT_EQ(d.max_promotions_per_step, 0u);
  EXPECT_EQ(d.admission_margin, 0.0f);
  EXPECT_EQ(d.num_layers, 0u);
  qmoe_expert_cache_desc_init(nullptr);  // does nothing
}

TEST(ExpertCacheApi, CreateRefusesBadDescriptions) {
  const qmoe_expert_cache_desc good = cache_desc(2, 8, 4, QMOE_CACHE_POLICY_LFRU);
  struct Case {
    const char* what;
    void (*edit)(qmoe_expert_cache_desc*);
  };
  const Case cases[] = {
      {"no layers", [](qmoe_expert_cache_desc* d) { d->num_layers = 0; }},
      {"no experts", [](qmoe_expert_cache_desc* d) { d->num_experts = 0; }},
      {"no slots", [](qmoe_expert_cache_desc* d) { d->num_slots = 0; }},
      {"more slots than experts", [](qmoe_expert_cache_desc* d) { d->num_slots = 9; }},
      {"policy 0", [](qmoe_expert_cache_desc* d) { d->policy = qmoe_cache_policy(0); }},
      {"policy 5", [](qmoe_expert_cache_desc* d) { d->policy = qmoe_cache_policy(5); }},
      {"policy -1", [](qmoe_expert_cache_desc* d) { d->policy = qmoe_cache_policy(-1); }},
      {"half-life 0", [](qmoe_expert_cache_desc* d) { d->half_life_steps = 0.0f; }},
      {"half-life -1", [](qmoe_expert_cache_desc* d) { d->half_life_steps = -1.0f; }},
      {"half-life NaN", [](qmoe_expert_cache_desc* d) { d->half_life_steps = NAN; }},
      {"half-life inf", [](qmoe_expert_cache_desc* d) { d->half_life_steps = INFINITY; }},
      {"struct_size 0", [](qmoe_expert_cache_desc* d) { d->struct_size = 0; }},
      {"struct_size before the budget's end",
       [](qmoe_expert_cache_desc* d) {
         d->struct_size = offsetof(qmoe_expert_cache_desc, max_promotions_per_step) + 2;
       }},
      {"struct_size inside the margin",
       [](qmoe_expert_cache_desc* d) {
         d->struct_size = offsetof(qmoe_expert_cache_desc, admission_margin) + 2;
       }},
      {"margin -1", [](qmoe_expert_cache_desc* d) { d->admission_margin = -1.0f; }},
      {"margin NaN", [](qmoe_expert_cache_desc* d) { d->admission_margin = NAN; }},
      {"margin inf", [](qmoe_expert_cache_desc* d) { d->admission_margin = INFINITY; }},
      {"struct_size huge", [](qmoe_expert_cache_desc* d) { d->struct_size = size_t{1} << 20; }},
  };
  for (const Case& c : cases) {
    qmoe_expert_cache_desc d = good;
    c.edit(&d);
    qmoe_expert_cache* cache = reinterpret_cast<qmoe_expert_cache*>(0x1);
    EXPECT_EQ(qmoe_expert_cache_create(&d, &cache), QMOE_STATUS_INVALID_ARGUMENT) << c.what;
    EXPECT_EQ(cache, nullptr) << c.what;
    EXPECT_STRNE(qmoe_last_error_message(), "") << c.what;
  }
  qmoe_expert_cache* cache = nullptr;
  EXPECT_EQ(qmoe_expert_cache_create(nullptr, &cache), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_create(&good, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  // A struct of the version before admission_margin: the bytes past it are not read (a NaN
  // there would be refused), and the cache admits as with a margin of 0.
  qmoe_expert_cache_desc older = cache_desc(1, 3, 1, QMOE_CACHE_POLICY_LFU);
  older.struct_size = offsetof(qmoe_expert_cache_desc, admission_margin);
  older.admission_margin = NAN;
  CachePtr older_cache = make_cache(older);
  ASSERT_NE(older_cache, nullptr);
  EXPECT_EQ(step(older_cache.get(), {0}), (Ids{0}));
  EXPECT_EQ(step(older_cache.get(), {1, 1}), (Ids{1}));
  // Only LFRU reads the half-life.
  qmoe_expert_cache_desc lru = cache_desc(1, 4, 4, QMOE_CACHE_POLICY_LRU, NAN);
  EXPECT_NE(make_cache(lru), nullptr);
}

TEST(ExpertCacheApi, ObserveRecordsNothingFromABadCall) {
  CachePtr cache = make_cache(cache_desc(2, 8, 2, QMOE_CACHE_POLICY_LFU));
  const int32_t out_of_range[] = {1, 8}, below[] = {1, -2};
  EXPECT_EQ(qmoe_expert_cache_observe(cache.get(), 0, out_of_range, 2),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_observe(cache.get(), 0, below, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_observe(cache.get(), 2, below, 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_observe(cache.get(), 0, nullptr, 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_observe(cache.get(), 0, nullptr, 0), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_expert_cache_end_step(cache.get()), QMOE_STATUS_OK);
  EXPECT_EQ(residency(cache.get(), 0), Ids{});  // expert 1 was never counted
  EXPECT_EQ(stats_of(cache.get(), QMOE_EXPERT_CACHE_ALL_LAYERS).selections, 0u);
}

TEST(ExpertCacheApi, ObserveCountsRecordsNothingFromABadCall) {
  CachePtr cache = make_cache(cache_desc(2, 4, 2, QMOE_CACHE_POLICY_LFU));
  const uint32_t counts[4] = {1, 0, 2, 0};
  EXPECT_EQ(qmoe_expert_cache_observe_counts(cache.get(), 0, nullptr, 4),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_observe_counts(cache.get(), 0, counts, 3),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_observe_counts(cache.get(), 2, counts, 4),
            QMOE_STATUS_INVALID_ARGUMENT);
  // A step's selections of one expert may not wrap: the second call would pass 2^32 - 1 for
  // expert 0 and counts nothing, expert 2's 7 included.
  const uint32_t most[4] = {UINT32_MAX, 0, 0, 0}, more[4] = {1, 0, 7, 0};
  ASSERT_EQ(qmoe_expert_cache_observe_counts(cache.get(), 1, most, 4), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_expert_cache_observe_counts(cache.get(), 1, more, 4),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("2^32"), std::string::npos);
  EXPECT_EQ(stats_of(cache.get(), 0).selections, 0u);
  EXPECT_EQ(stats_of(cache.get(), 1).selections, uint64_t{UINT32_MAX});
  ASSERT_EQ(qmoe_expert_cache_end_step(cache.get()), QMOE_STATUS_OK);
  EXPECT_EQ(residency(cache.get(), 1), (Ids{0}));
  ASSERT_EQ(qmoe_expert_cache_observe_counts(cache.get(), 1, more, 4), QMOE_STATUS_OK);
}

TEST(ExpertCacheApi, GetResidencyWritesNothingPastItsCapacity) {
  CachePtr cache = make_cache(cache_desc(1, 8, 4, QMOE_CACHE_POLICY_LRU));
  EXPECT_EQ(step(cache.get(), {6, 2, 5}), (Ids{2, 5, 6}));
  uint32_t ids[4] = {77, 77, 77, 77}, count = 99;
  EXPECT_EQ(qmoe_expert_cache_get_residency(cache.get(), 0, ids, 2, &count),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(count, 99u);
  for (uint32_t id : ids) EXPECT_EQ(id, 77u);
  EXPECT_EQ(qmoe_expert_cache_get_residency(cache.get(), 0, ids, 4, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_get_residency(cache.get(), 1, ids, 4, &count),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_get_residency(cache.get(), 0, ids, 3, &count), QMOE_STATUS_OK);
  EXPECT_EQ(count, 3u);
  EXPECT_EQ(ids[3], 77u);
}

TEST(ExpertCacheApi, SetResidencyChangesNothingWhenRefused) {
  CachePtr cache = make_cache(cache_desc(2, 8, 3, QMOE_CACHE_POLICY_STATIC));
  const uint32_t good[] = {7, 0};
  ASSERT_EQ(qmoe_expert_cache_set_residency(cache.get(), 0, good, 2), QMOE_STATUS_OK);
  const uint32_t twice[] = {1, 2, 1}, too_many[] = {1, 2, 3, 4}, outside[] = {1, 8};
  EXPECT_EQ(qmoe_expert_cache_set_residency(cache.get(), 0, twice, 3),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "ids[2] = 1 is given twice"), nullptr)
      << qmoe_last_error_message();
  EXPECT_EQ(qmoe_expert_cache_set_residency(cache.get(), 0, too_many, 4),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_set_residency(cache.get(), 0, outside, 2),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "ids[1] = 8 is not below 8"), nullptr)
      << qmoe_last_error_message();
  EXPECT_EQ(qmoe_expert_cache_set_residency(cache.get(), 0, nullptr, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_set_residency(cache.get(), 2, good, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(residency(cache.get(), 0), (Ids{0, 7}));
  EXPECT_EQ(stats_of(cache.get(), 0).promotions, 2u);
}

TEST(ExpertCacheApi, GetStatsRefusesBadStructsAndLayers) {
  CachePtr cache = make_cache(cache_desc(2, 4, 2, QMOE_CACHE_POLICY_LRU));
  qmoe_expert_cache_stats s;
  s.struct_size = sizeof s - 8;
  EXPECT_EQ(qmoe_expert_cache_get_stats(cache.get(), 0, &s), QMOE_STATUS_INVALID_ARGUMENT);
  s.struct_size = sizeof s;
  EXPECT_EQ(qmoe_expert_cache_get_stats(cache.get(), 2, &s), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_get_stats(cache.get(), 0, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  // A newer caller's longer struct: its tail is left as it was.
  struct Longer {
    qmoe_expert_cache_stats stats;
    uint64_t tail;
  } longer;
  longer.stats.struct_size = sizeof longer;
  longer.tail = 0x5A5A;
  EXPECT_EQ(qmoe_expert_cache_get_stats(cache.get(), 0, &longer.stats), QMOE_STATUS_OK);
  EXPECT_EQ(longer.stats.struct_size, sizeof longer);
  EXPECT_EQ(longer.tail, 0x5A5Au);
}

TEST(ExpertCacheApi, DestroyedAndForeignHandlesAreRefused) {
  qmoe_expert_cache* cache = nullptr;
  const qmoe_expert_cache_desc d = cache_desc(1, 4, 2, QMOE_CACHE_POLICY_LRU);
  ASSERT_EQ(qmoe_expert_cache_create(&d, &cache), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_expert_cache_destroy(cache), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_expert_cache_destroy(cache), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("destroyed"), std::string::npos);
  const int32_t ids[] = {0};
  uint32_t count = 0;
  qmoe_expert_cache_stats s;
  s.struct_size = sizeof s;
  EXPECT_EQ(qmoe_expert_cache_observe(cache, 0, ids, 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_end_step(cache), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_get_residency(cache, 0, nullptr, 0, &count),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_set_residency(cache, 0, nullptr, 0), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_get_stats(cache, 0, &s), QMOE_STATUS_INVALID_ARGUMENT);
  uint64_t foreign[8] = {};
  auto* not_a_cache = reinterpret_cast<qmoe_expert_cache*>(foreign);
  EXPECT_EQ(qmoe_expert_cache_end_step(not_a_cache), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_end_step(nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_cache_destroy(nullptr), QMOE_STATUS_OK);
}

// Two threads destroying one cache at once: one frees it, the other is told it was destroyed.
TEST(ExpertCacheApi, RacingDestroysFreeTheCacheOnce) {
  constexpr int kRounds = 5000;
  const qmoe_expert_cache_desc d = cache_desc(2, 16, 4, QMOE_CACHE_POLICY_LFRU);
  const qmoe_test::DestroyRaceCounts counts = qmoe_test::race_destroys<qmoe_expert_cache>(
      kRounds,
      [&d] {
        qmoe_expert_cache* cache = nullptr;
        return qmoe_expert_cache_create(&d, &cache) == QMOE_STATUS_OK ? cache : nullptr;
      },
      [](qmoe_expert_cache* cache) { return qmoe_expert_cache_destroy(cache); },
      QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(counts.ok, kRounds);
  EXPECT_EQ(counts.rejected, kRounds);
  EXPECT_EQ(counts.other, 0);
}

}  // namespace
}  // namespace qmoe::testing
