#include "residency_schedule.h"

#include <memory>

namespace {

struct CacheDeleter {
  void operator()(qmoe_expert_cache* cache) const { qmoe_expert_cache_destroy(cache); }
};

std::vector<uint8_t> membership(const std::vector<uint32_t>& list, uint32_t experts) {
  std::vector<uint8_t> in(experts, 0);
  for (uint32_t e : list) in[e] = 1;
  return in;
}

}  // namespace

qmoe_status build_residency_schedule(const RoutingTrace& trace, uint32_t steps, uint32_t layers,
                                     uint32_t experts, uint32_t slots,
                                     const std::vector<std::vector<uint32_t>>& initial,
                                     const CacheChoice& cache, ResidencySchedule* out) {
  ResidencySchedule& r = *out;
  r = ResidencySchedule{};
  r.steps = steps;
  r.layers = layers;
  r.experts = experts;
  r.initial = initial;
  r.cached = cache.policy != 0;
  std::vector<std::vector<uint8_t>> first(layers);
  for (uint32_t l = 0; l < layers; ++l) first[l] = membership(initial[l], experts);
  if (!r.cached) {
    r.mapped.push_back(first);
    return QMOE_STATUS_OK;
  }
  qmoe_expert_cache_desc d;
  qmoe_expert_cache_desc_init(&d);
  d.num_layers = layers;
  d.num_experts = experts;
  d.num_slots = slots;
  d.policy = cache.policy;
  d.half_life_steps = cache.half_life_steps;
  d.max_promotions_per_step = cache.budget;
  d.admission_margin = cache.admission_margin;
  qmoe_expert_cache* raw = nullptr;
  if (const qmoe_status s = qmoe_expert_cache_create(&d, &raw); s != QMOE_STATUS_OK) return s;
  const std::unique_ptr<qmoe_expert_cache, CacheDeleter> owner(raw);
  for (uint32_t l = 0; l < layers; ++l) {
    const qmoe_status s = qmoe_expert_cache_set_residency(raw, l, initial[l].data(),
                                                          static_cast<uint32_t>(initial[l].size()));
    if (s != QMOE_STATUS_OK) return s;
  }
  r.mapped.assign(steps, std::vector<std::vector<uint8_t>>(layers));
  r.begin_lists.assign(steps, std::vector<std::vector<uint32_t>>(layers));
  r.begins.assign(steps, std::vector<uint8_t>(layers, 0));
  // full[l]: the layer's list once its pending update is finished; step 0 runs with I.
  std::vector<std::vector<uint32_t>> full = initial;
  r.mapped[0] = first;
  std::vector<int32_t> routed;
  std::vector<uint32_t> list(experts);
  for (uint32_t s = 0; s + 1 < steps; ++s) {
    // Step s's selections (the slots with a weight; a file's trace has no weights: every id).
    for (uint32_t l = 0; l < layers; ++l) {
      const size_t at = size_t{s} * trace.per_step + size_t{l} * trace.per_layer;
      routed.assign(trace.ids.begin() + at, trace.ids.begin() + at + trace.per_layer);
      if (!trace.weights.empty()) {
        for (size_t j = 0; j < routed.size(); ++j) {
          if (trace.weights[at + j] == 0.0f) routed[j] = -1;
        }
      }
      const qmoe_status st = qmoe_expert_cache_observe(raw, l, routed.data(), routed.size());
      if (st != QMOE_STATUS_OK) return st;
    }
    if (const qmoe_status st = qmoe_expert_cache_end_step(raw); st != QMOE_STATUS_OK) return st;
    // The start of step s + 1: the pending update finished (full), the new one begun.
    for (uint32_t l = 0; l < layers; ++l) {
      uint32_t count = 0;
      const qmoe_status st = qmoe_expert_cache_get_residency(raw, l, list.data(), experts, &count);
      if (st != QMOE_STATUS_OK) return st;
      const std::vector<uint32_t> next(list.begin(), list.begin() + count);
      const std::vector<uint8_t> now = membership(full[l], experts);
      std::vector<uint8_t> mapped = membership(next, experts);
      bool changed = next.size() != full[l].size();
      for (uint32_t e = 0; e < experts; ++e) {
        changed = changed || mapped[e] != now[e];
        mapped[e] = mapped[e] & now[e];  // the stayers until the copies are finished
      }
      r.mapped[s + 1][l] = std::move(mapped);
      if (changed) {
        for (uint32_t e : next) r.promotions += now[e] ? 0 : 1;
        r.begin_lists[s + 1][l] = next;
        r.begins[s + 1][l] = 1;
        full[l] = next;
      }
    }
  }
  return QMOE_STATUS_OK;
}
