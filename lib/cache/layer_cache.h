// One MoE layer's expert cache policy (include/qmoe/qmoe_cache.h has the contract): the
// per-expert scores, the resident set, and the admission and eviction of end_step. Plain host
// code with no locking; lib/cache_api.cc serialises calls on a cache.
//
// Invariants after every call: resident_count() <= num_slots; is_resident_[e] is 1 exactly
// for the resident experts; step_selections_ is zero outside a step's observe calls.
#ifndef QMOE_LIB_CACHE_LAYER_CACHE_H_
#define QMOE_LIB_CACHE_LAYER_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "qmoe/qmoe_cache.h"

namespace qmoe {

struct LayerCacheCounters {
  uint64_t selections = 0, hits = 0, promotions = 0, evictions = 0;
};

class LayerCache {
 public:
  /// num_slots in [1, num_experts]; half_life_steps > 0 and finite (used by LFRU only);
  /// max_promotions 0 for none; admission_margin finite and >= 0. Throws std::bad_alloc.
  LayerCache(uint32_t num_experts, uint32_t num_slots, qmoe_cache_policy policy,
             float half_life_steps, uint32_t max_promotions, float admission_margin);

  /// Counts ids[0, count) (each in [-1, E): the caller checked) as this step's selections.
  void observe(const int32_t* ids, size_t count);

  /// Counts counts[e] selections of each expert e (E entries); false, nothing counted, when an
  /// expert's selections this step would pass UINT32_MAX.
  bool observe_counts(const uint32_t* counts);

  /// Folds the step's selections into the scores and (not STATIC) admits and evicts; `step` is
  /// the index of the step that ends (0 for the first).
  void end_step(uint64_t step);

  /// Makes ids[0, count) the residents (distinct, below E, count <= num_slots: the caller
  /// checked); scores are kept.
  void set_residency(const uint32_t* ids, uint32_t count);

  uint32_t resident_count() const { return resident_count_; }
  /// The residents in ascending id order into ids[0, resident_count()).
  void residents(uint32_t* ids) const;
  const LayerCacheCounters& counters() const { return counters_; }

 private:
  // The policy's score of expert e (LRU: its last step; LFU, LFRU: its count); only experts
  // with has_score(e) compete for admission. end_step caches it in scores_.
  double score(uint32_t e) const;
  bool has_score(uint32_t e) const;
  void admit_and_evict();

  uint32_t num_experts_, num_slots_;
  qmoe_cache_policy policy_;
  double decay_;  // LFRU: a count's factor per step, 2^(-1 / half_life)
  uint32_t max_promotions_;
  double margin_;  // a newcomer takes a resident's slot only with a score above its + margin_
  uint32_t resident_count_ = 0;
  std::vector<uint8_t> is_resident_;            // [E]
  std::vector<uint32_t> step_selections_;       // [E] selections of the step in progress
  std::vector<int64_t> last_step_;              // [E] LRU: last step with a selection, -1 never
  std::vector<double> frequency_;               // [E] LFU: selections; LFRU: decayed selections
  std::vector<double> scores_;                  // [E] score(e) at the end_step in progress
  std::vector<uint32_t> candidates_, victims_;  // end_step's scratch, reused
  LayerCacheCounters counters_;
};

}  // namespace qmoe

#endif  // QMOE_LIB_CACHE_LAYER_CACHE_H_
