#include "cache_trace.h"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <memory>
#include <numeric>

#include "qmoe/qmoe_cache.h"
#include "run_clock.h"

namespace {

// Prints the library's message for the failed call and returns the exit code, 1.
int report_failed_cache_call(qmoe_status status) {
  std::fprintf(stderr, "qmoe cache: %s (%s)\n", qmoe_last_error_message(),
               qmoe_status_string(status));
  return 1;
}

// Returns report_failed_cache_call's exit code from the enclosing function when `call` fails.
#define QMOE_CACHE_CALL(call)                                                                      \
  do {                                                                                             \
    const qmoe_status cache_call_status_ = (call);                                                 \
    if (cache_call_status_ != QMOE_STATUS_OK) return report_failed_cache_call(cache_call_status_); \
  } while (0)

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
// Prints which conservation check `row`'s cache broke, and returns the exit code, 1.
int report_broken(CacheRow row, const char* format, ...) {
  std::fprintf(stderr, "qmoe cache: %s: conservation broken: ", cache_row_name(row));
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  return 1;
}

struct CacheDeleter {
  // The replay destroys its cache itself, checked; this is for the early returns of a failure
  // already being reported.
  void operator()(qmoe_expert_cache* cache) const { qmoe_expert_cache_destroy(cache); }
};

qmoe_cache_policy policy_of(CacheRow row) {
  switch (row) {
    case CacheRow::kLru:
      return QMOE_CACHE_POLICY_LRU;
    case CacheRow::kLfu:
      return QMOE_CACHE_POLICY_LFU;
    case CacheRow::kLfru:
      return QMOE_CACHE_POLICY_LFRU;
    case CacheRow::kStaticHindsight:
    case CacheRow::kStaticWarmup:
      break;
  }
  return QMOE_CACHE_POLICY_STATIC;
}

bool is_static(CacheRow row) {
  return policy_of(row) == QMOE_CACHE_POLICY_STATIC;
}

// Layer `layer`'s `slots` most selected experts over steps [first, last) of the trace (ties:
// the lower id), in ascending id order. Experts never selected fill the slots the selected
// ones leave: a runtime with the memory keeps something there.
std::vector<uint32_t> most_selected(const RoutingTrace& trace, uint32_t layer, uint32_t experts,
                                    uint32_t first, uint32_t last, uint32_t slots) {
  std::vector<uint64_t> selections(experts, 0);
  for (uint32_t s = first; s < last; ++s) {
    const int32_t* ids = trace.ids.data() + s * trace.per_step + layer * trace.per_layer;
    for (size_t j = 0; j < trace.per_layer; ++j) {
      if (ids[j] >= 0) ++selections[static_cast<uint32_t>(ids[j])];
    }
  }
  std::vector<uint32_t> order(experts);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return selections[a] > selections[b]; });
  order.resize(slots);
  std::sort(order.begin(), order.end());
  return order;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  const double upper = values[middle];
  if (values.size() % 2 != 0) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + middle);
  return (lower + upper) / 2.0;
}

CacheCounts counts_of(const qmoe_expert_cache_stats& stats) {
  CacheCounts counts;
  counts.selections = stats.selections;
  counts.hits = stats.hits;
  counts.promotions = stats.promotions;
  counts.evictions = stats.evictions;
  return counts;
}

CacheCounts difference(const CacheCounts& later, const CacheCounts& earlier) {
  CacheCounts d;
  d.selections = later.selections - earlier.selections;
  d.hits = later.hits - earlier.hits;
  d.promotions = later.promotions - earlier.promotions;
  d.evictions = later.evictions - earlier.evictions;
  return d;
}

bool operator==(const CacheCounts& a, const CacheCounts& b) {
  return a.selections == b.selections && a.hits == b.hits && a.promotions == b.promotions &&
         a.evictions == b.evictions;
}

// One replay. Beside the cache, the tool keeps its own account of every layer: the residency
// the cache last reported (read back after every change) and the selections, hits, promotions
// and evictions that residency implies. The cache's counters must match it: a hit counted
// against a residency other than the one of that moment, or a copy the stats miss, shows.
class Replay {
 public:
  Replay(CacheRow row, const CacheReplaySetup& setup, const RoutingTrace& trace)
      : row_(row), setup_(setup), trace_(trace), layers_(setup.layers) {
    for (LayerAccount& layer : layers_) layer.resident.assign(setup.experts, 0);
    ids_.resize(setup.experts);
    next_resident_.resize(setup.experts);
  }

  int run(CacheReplayResult* result) {
    qmoe_expert_cache_desc desc;
    qmoe_expert_cache_desc_init(&desc);
    desc.num_layers = setup_.layers;
    desc.num_experts = setup_.experts;
    desc.num_slots = setup_.slots;
    desc.policy = policy_of(row_);
    desc.half_life_steps = setup_.half_life_steps;
    // The budget bounds what end_step admits; STATIC admits nothing there, so it is the online
    // policies' alone (set_residency is never limited).
    desc.max_promotions_per_step = is_static(row_) ? 0 : setup_.max_promotions_per_step;
    desc.admission_margin = setup_.admission_margin;
    qmoe_expert_cache* raw = nullptr;
    QMOE_CACHE_CALL(qmoe_expert_cache_create(&desc, &raw));
    cache_.reset(raw);

    for (uint32_t l = 0; l < setup_.layers; ++l) {
      uint32_t count = 0;
      QMOE_CACHE_CALL(qmoe_expert_cache_get_residency(cache_.get(), l, nullptr, 0, &count));
      if (count != 0) {
        return report_broken(row_, "layer %u of a new cache holds %u experts, not none", l, count);
      }
    }
    if (row_ == CacheRow::kStaticHindsight) {
      if (const int code = place(0, setup_.steps, 0); code != 0) return code;
    }

    std::vector<double> end_step_us(setup_.steps);
    CacheCounts at_steady_start;
    for (uint32_t s = 0; s < setup_.steps; ++s) {
      for (uint32_t l = 0; l < setup_.layers; ++l) {
        if (const int code = observe(s, l); code != 0) return code;
      }
      const auto start = Clock::now();
      const qmoe_status ended = qmoe_expert_cache_end_step(cache_.get());
      end_step_us[s] = seconds_since(start) * 1e6;
      QMOE_CACHE_CALL(ended);
      for (uint32_t l = 0; l < setup_.layers; ++l) {
        if (const int code = after_end_step(s, l, result); code != 0) return code;
      }
      if (s + 1 == setup_.warmup_steps) {
        if (row_ == CacheRow::kStaticWarmup) {
          if (const int code = place(0, setup_.warmup_steps, s + 1); code != 0) return code;
        }
        qmoe_expert_cache_stats all = new_stats();
        QMOE_CACHE_CALL(
            qmoe_expert_cache_get_stats(cache_.get(), QMOE_EXPERT_CACHE_ALL_LAYERS, &all));
        at_steady_start = counts_of(all);
      }
    }
    if (const int code = check_stats(&result->whole); code != 0) return code;
    result->steady = difference(result->whole, at_steady_start);
    result->end_step_median_us = median(std::move(end_step_us));
    QMOE_CACHE_CALL(qmoe_expert_cache_destroy(cache_.release()));
    return 0;
  }

 private:
  struct LayerAccount {
    std::vector<uint8_t> resident;  // per expert, as the cache last reported it
    CacheCounts counts;
  };

  static qmoe_expert_cache_stats new_stats() {
    qmoe_expert_cache_stats stats{};
    stats.struct_size = sizeof stats;
    return stats;
  }

  // Step s's ids of layer l to the cache, and their hits against the residency of the moment to
  // the account.
  int observe(uint32_t s, uint32_t l) {
    const int32_t* ids = trace_.ids.data() + s * trace_.per_step + l * trace_.per_layer;
    QMOE_CACHE_CALL(qmoe_expert_cache_observe(cache_.get(), l, ids, trace_.per_layer));
    LayerAccount& layer = layers_[l];
    for (size_t j = 0; j < trace_.per_layer; ++j) {
      if (ids[j] < 0) continue;
      ++layer.counts.selections;
      layer.counts.hits += layer.resident[static_cast<uint32_t>(ids[j])];
    }
    return 0;
  }

  // Reads layer l's residency back: it must be ascending distinct ids below E, no more than the
  // slots. The experts that joined and left since the last read go to the account; *joined
  // tells how many joined. `when` names the moment for a message.
  int read_residency(uint32_t l, const char* when, uint32_t s, uint32_t* joined) {
    uint32_t count = 0;
    QMOE_CACHE_CALL(
        qmoe_expert_cache_get_residency(cache_.get(), l, ids_.data(), setup_.experts, &count));
    if (count > setup_.slots) {
      return report_broken(row_, "layer %u holds %u experts %s step %u, above its %u slots", l,
                           count, when, s, setup_.slots);
    }
    std::vector<uint8_t>& now = next_resident_;
    std::fill(now.begin(), now.end(), uint8_t{0});
    for (uint32_t i = 0; i < count; ++i) {
      if (ids_[i] >= setup_.experts || (i > 0 && ids_[i] <= ids_[i - 1])) {
        return report_broken(row_, "layer %u's residency %s step %u is not ascending ids below %u",
                             l, when, s, setup_.experts);
      }
      now[ids_[i]] = 1;
    }
    LayerAccount& layer = layers_[l];
    uint32_t in = 0, out = 0;
    for (uint32_t e = 0; e < setup_.experts; ++e) {
      in += now[e] && !layer.resident[e] ? 1 : 0;
      out += layer.resident[e] && !now[e] ? 1 : 0;
    }
    layer.resident.swap(now);
    layer.counts.promotions += in;
    layer.counts.evictions += out;
    *joined = in;
    return 0;
  }

  // After step s's end_step, layer l: STATIC must not have moved; an online policy must have
  // kept to its budget, the first step's included (the header limits every end_step).
  int after_end_step(uint32_t s, uint32_t l, CacheReplayResult* result) {
    const CacheCounts before = layers_[l].counts;
    uint32_t joined = 0;
    if (const int code = read_residency(l, "after", s, &joined); code != 0) return code;
    if (is_static(row_)) {
      if (layers_[l].counts.evictions != before.evictions || joined != 0) {
        return report_broken(row_, "end_step of step %u changed STATIC layer %u's residency", s, l);
      }
      return 0;
    }
    const uint32_t budget = setup_.max_promotions_per_step;
    if (budget != 0 && joined > budget) {
      return report_broken(row_, "layer %u admitted %u experts at step %u, above --budget %u", l,
                           joined, s, budget);
    }
    if (s > 0) result->max_layer_promotions = std::max(result->max_layer_promotions, joined);
    return 0;
  }

  // Makes every layer's residents its most selected experts of steps [first, last), as the
  // STATIC rows do, before step `before_step`.
  int place(uint32_t first, uint32_t last, uint32_t before_step) {
    for (uint32_t l = 0; l < setup_.layers; ++l) {
      const std::vector<uint32_t> ids =
          most_selected(trace_, l, setup_.experts, first, last, setup_.slots);
      QMOE_CACHE_CALL(qmoe_expert_cache_set_residency(cache_.get(), l, ids.data(),
                                                      static_cast<uint32_t>(ids.size())));
      uint32_t joined = 0;
      if (const int code = read_residency(l, "placed before", before_step, &joined); code != 0) {
        return code;
      }
      const std::vector<uint8_t>& resident = layers_[l].resident;
      const bool as_placed =
          std::all_of(ids.begin(), ids.end(), [&](uint32_t e) { return resident[e] != 0; }) &&
          std::accumulate(resident.begin(), resident.end(), size_t{0}) == ids.size();
      if (!as_placed) {
        return report_broken(row_, "layer %u's residency is not the %zu experts placed", l,
                             ids.size());
      }
    }
    return 0;
  }

  // The cache's counters against the account, layer by layer, and their sum against
  // QMOE_EXPERT_CACHE_ALL_LAYERS's; *whole gets the latter.
  int check_stats(CacheCounts* whole) {
    CacheCounts summed;
    for (uint32_t l = 0; l < setup_.layers; ++l) {
      qmoe_expert_cache_stats stats = new_stats();
      QMOE_CACHE_CALL(qmoe_expert_cache_get_stats(cache_.get(), l, &stats));
      const CacheCounts& mine = layers_[l].counts;
      if (stats.hits > stats.selections) {
        return report_broken(row_, "layer %u counts %" PRIu64 " hits of %" PRIu64 " selections", l,
                             stats.hits, stats.selections);
      }
      if (stats.steps != setup_.steps) {
        return report_broken(row_, "layer %u counts %" PRIu64 " steps, not the %u ended", l,
                             stats.steps, setup_.steps);
      }
      if (!(counts_of(stats) == mine)) {
        return report_broken(row_,
                             "layer %u's stats (selections %" PRIu64 ", hits %" PRIu64
                             ", promotions %" PRIu64 ", evictions %" PRIu64
                             ") are not the replay's (%" PRIu64 ", %" PRIu64 ", %" PRIu64
                             ", %" PRIu64 ")",
                             l, stats.selections, stats.hits, stats.promotions, stats.evictions,
                             mine.selections, mine.hits, mine.promotions, mine.evictions);
      }
      summed.selections += stats.selections;
      summed.hits += stats.hits;
      summed.promotions += stats.promotions;
      summed.evictions += stats.evictions;
    }
    qmoe_expert_cache_stats all = new_stats();
    QMOE_CACHE_CALL(qmoe_expert_cache_get_stats(cache_.get(), QMOE_EXPERT_CACHE_ALL_LAYERS, &all));
    if (!(counts_of(all) == summed) || all.steps != setup_.steps) {
      return report_broken(
          row_,
          "the all-layers stats (steps %" PRIu64 ", selections %" PRIu64 ", hits %" PRIu64
          ", promotions %" PRIu64 ", evictions %" PRIu64 ") are not the layers' sum (%u, %" PRIu64
          ", %" PRIu64 ", %" PRIu64 ", %" PRIu64 ")",
          all.steps, all.selections, all.hits, all.promotions, all.evictions, setup_.steps,
          summed.selections, summed.hits, summed.promotions, summed.evictions);
    }
    *whole = summed;
    return 0;
  }

  const CacheRow row_;
  const CacheReplaySetup& setup_;
  const RoutingTrace& trace_;
  std::unique_ptr<qmoe_expert_cache, CacheDeleter> cache_;
  std::vector<LayerAccount> layers_;
  // read_residency's buffers: E ids from get_residency, so that an overfull layer shows rather
  // than failing the call, and the residency read, swapped into the account.
  std::vector<uint32_t> ids_;
  std::vector<uint8_t> next_resident_;
};

}  // namespace

const char* cache_row_name(CacheRow row) {
  switch (row) {
    case CacheRow::kStaticHindsight:
      return "static-hindsight";
    case CacheRow::kStaticWarmup:
      return "static-warmup";
    case CacheRow::kLru:
      return "lru";
    case CacheRow::kLfu:
      return "lfu";
    case CacheRow::kLfru:
      return "lfru";
  }
  return "?";
}

int replay_cache(CacheRow row, const CacheReplaySetup& setup, const RoutingTrace& trace,
                 CacheReplayResult* result) {
  *result = CacheReplayResult{};
  Replay replay(row, setup, trace);
  return replay.run(result);
}
