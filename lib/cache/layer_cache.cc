#include "lib/cache/layer_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace qmoe {

namespace {

// Decayed counts below the smallest normal double (an expert unselected for about 1022
// half-lives) drop to zero: subnormal arithmetic would otherwise slow every step's decay loop.
constexpr double kForgottenFrequency = std::numeric_limits<double>::min();

}  // namespace

LayerCache::LayerCache(uint32_t num_experts, uint32_t num_slots, qmoe_cache_policy policy,
                       float half_life_steps, uint32_t max_promotions, float admission_margin)
    : num_experts_(num_experts),
      num_slots_(num_slots),
      policy_(policy),
      decay_(std::exp2(-1.0 / static_cast<double>(half_life_steps))),
      max_promotions_(max_promotions),
      margin_(admission_margin),
      is_resident_(num_experts, 0),
      step_selections_(num_experts, 0),
      last_step_(num_experts, -1),
      frequency_(num_experts, 0.0),
      scores_(num_experts, 0.0) {
  candidates_.reserve(num_experts);
  victims_.reserve(num_slots);
}

void LayerCache::observe(const int32_t* ids, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (ids[i] < 0) continue;  // padding
    const auto e = static_cast<uint32_t>(ids[i]);
    ++counters_.selections;
    counters_.hits += is_resident_[e];
    // A uint32 per expert and step: a step would need 2^32 selections of one expert to wrap.
    ++step_selections_[e];
  }
}

bool LayerCache::observe_counts(const uint32_t* counts) {
  for (uint32_t e = 0; e < num_experts_; ++e) {
    if (counts[e] > UINT32_MAX - step_selections_[e]) return false;
  }
  for (uint32_t e = 0; e < num_experts_; ++e) {
    counters_.selections += counts[e];
    counters_.hits += is_resident_[e] ? counts[e] : 0;
    step_selections_[e] += counts[e];
  }
  return true;
}

double LayerCache::score(uint32_t e) const {
  return policy_ == QMOE_CACHE_POLICY_LRU ? static_cast<double>(last_step_[e]) : frequency_[e];
}

bool LayerCache::has_score(uint32_t e) const {
  return policy_ == QMOE_CACHE_POLICY_LRU ? last_step_[e] >= 0 : frequency_[e] > 0.0;
}

void LayerCache::end_step(uint64_t step) {
  if (policy_ == QMOE_CACHE_POLICY_STATIC) {  // no scores: placements only
    std::fill(step_selections_.begin(), step_selections_.end(), 0u);
    return;
  }
  for (uint32_t e = 0; e < num_experts_; ++e) {
    const uint32_t selected = step_selections_[e];
    if (policy_ == QMOE_CACHE_POLICY_LFRU) {
      const double f = frequency_[e] * decay_ + selected;
      frequency_[e] = f < kForgottenFrequency ? 0.0 : f;
    } else {
      frequency_[e] += selected;
    }
    if (selected != 0) last_step_[e] = static_cast<int64_t>(step);
    scores_[e] = score(e);
  }
  admit_and_evict();
  std::fill(step_selections_.begin(), step_selections_.end(), 0u);
}

void LayerCache::admit_and_evict() {
  // The weakest resident's score: with no free slot, only candidates above it plus the margin
  // can be admitted (each admission needs a victim it beats by more than the margin, and
  // victims only get stronger), so the others are never sorted. In a steady state that leaves
  // few or none.
  const bool free_slot = resident_count_ < num_slots_;
  // One scan lists the residents (the possible victims) and finds the weakest score.
  double weakest = 0.0;
  victims_.clear();
  for (uint32_t e = 0; e < num_experts_; ++e) {
    if (!is_resident_[e]) continue;
    if (victims_.empty() || scores_[e] < weakest) weakest = scores_[e];
    victims_.push_back(e);
  }
  candidates_.clear();
  for (uint32_t e = 0; e < num_experts_; ++e) {
    if (!is_resident_[e] && has_score(e) && (free_slot || scores_[e] > weakest + margin_)) {
      candidates_.push_back(e);
    }
  }
  if (candidates_.empty()) return;
  // Best candidate first: highest score, then more selections this step, then the lower id.
  // Weakest resident first: lowest score, then fewer selections this step, then the higher id.
  // Scores, counts and ids are all compared exactly, so the orders are total and the result
  // is the same on every host. Only the heads that can take part are ordered: at most `limit`
  // candidates are admitted, and at most one victim goes per candidate past the free slots.
  const size_t free_slots = num_slots_ - resident_count_;
  const size_t limit = std::min<size_t>(max_promotions_ == 0 ? candidates_.size() : max_promotions_,
                                        std::min(candidates_.size(), free_slots + victims_.size()));
  std::partial_sort(candidates_.begin(), candidates_.begin() + limit, candidates_.end(),
                    [this](uint32_t a, uint32_t b) {
                      if (scores_[a] != scores_[b]) return scores_[a] > scores_[b];
                      if (step_selections_[a] != step_selections_[b]) {
                        return step_selections_[a] > step_selections_[b];
                      }
                      return a < b;
                    });
  const size_t victims_needed = std::min(victims_.size(), limit);
  std::partial_sort(victims_.begin(), victims_.begin() + victims_needed, victims_.end(),
                    [this](uint32_t a, uint32_t b) {
                      if (scores_[a] != scores_[b]) return scores_[a] < scores_[b];
                      if (step_selections_[a] != step_selections_[b]) {
                        return step_selections_[a] < step_selections_[b];
                      }
                      return a > b;
                    });
  size_t admitted = 0, evicted = 0;
  for (size_t i = 0; i < limit; ++i) {
    const uint32_t e = candidates_[i];
    if (resident_count_ < num_slots_) {
      ++resident_count_;
    } else {
      // Candidates come in falling score and victims in rising score, so once the best
      // remaining candidate cannot beat the weakest remaining resident by the margin, none
      // can. A newcomer is never a victim in its own step: a later candidate scores no higher
      // than it.
      if (evicted == victims_needed) break;
      const uint32_t victim = victims_[evicted];
      if (!(scores_[e] > scores_[victim] + margin_)) break;
      is_resident_[victim] = 0;
      ++evicted;
    }
    is_resident_[e] = 1;
    ++admitted;
  }
  counters_.promotions += admitted;
  counters_.evictions += evicted;
}

void LayerCache::set_residency(const uint32_t* ids, uint32_t count) {
  uint32_t kept = 0;
  for (uint32_t i = 0; i < count; ++i) kept += is_resident_[ids[i]];
  counters_.promotions += count - kept;
  counters_.evictions += resident_count_ - kept;
  std::fill(is_resident_.begin(), is_resident_.end(), uint8_t{0});
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t e = ids[i];
    is_resident_[e] = 1;
    // A placed expert with no history counts as selected once in this step (not in the
    // counters), so that the first newcomer with one selection does not displace it.
    if (!has_score(e) && step_selections_[e] == 0) step_selections_[e] = 1;
  }
  resident_count_ = count;
}

void LayerCache::residents(uint32_t* ids) const {
  uint32_t n = 0;
  for (uint32_t e = 0; e < num_experts_; ++e) {
    if (is_resident_[e]) ids[n++] = e;
  }
}

}  // namespace qmoe
