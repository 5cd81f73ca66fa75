// `qmoe cache`'s replay: one routing trace (run_routing.h) through one expert cache
// (qmoe/qmoe_cache.h) as a runtime would drive it, step by step, with the counters a runtime
// engineer compares policies by, and the conservation checks that tell a cache bug from a bad
// policy.
#ifndef QMOE_TOOLS_QMOE_CACHE_TRACE_H_
#define QMOE_TOOLS_QMOE_CACHE_TRACE_H_

#include <cstdint>
#include <vector>

#include "run_routing.h"

// The placements `qmoe cache` compares: two ways of choosing a STATIC cache's residents and
// the three online policies, in the report's order.
enum class CacheRow {
  // Each layer's most selected experts over the whole trace, placed before step 0: the best
  // static placement, known only in hindsight (an upper bound no runtime reaches).
  kStaticHindsight,
  // Each layer's most selected experts of the warm-up steps, placed once after them: what a
  // runtime can do (profile, then freeze).
  kStaticWarmup,
  kLru,
  kLfu,
  kLfru,
};
constexpr int kCacheRowCount = 5;

// "static-hindsight", "static-warmup", "lru", "lfu", "lfru".
const char* cache_row_name(CacheRow row);

struct CacheReplaySetup {
  uint32_t layers = 1, experts = 1;
  uint32_t slots = 1;             // num_slots
  uint32_t steps = 10;            // of the trace
  uint32_t warmup_steps = 1;      // the first ones, in [1, steps): the steady state is the rest
  float half_life_steps = 32.0f;  // LFRU
  uint32_t max_promotions_per_step = 0;  // the online policies' budget; 0 for none
  float admission_margin = 0.0f;         // the online policies' margin
};

// Counters summed over the layers, as qmoe_expert_cache_get_stats gives them.
struct CacheCounts {
  uint64_t selections = 0, hits = 0, promotions = 0, evictions = 0;
};

struct CacheReplayResult {
  // The whole run, and the steps after the warm-up (for static-warmup: after its placement,
  // whose copies count in the whole run only).
  CacheCounts whole, steady;
  // The most experts one layer admitted at one end_step after the first (without a budget,
  // the first fills the empty cache and says nothing of the steady churn): what --budget caps.
  uint32_t max_layer_promotions = 0;
  // Of qmoe_expert_cache_end_step's wall time over the steps: the median, in microseconds.
  double end_step_median_us = 0.0;
};

// Replays `trace` (steps x layers of ids) through a new cache of `row`'s policy. Checks, as it
// goes: the new cache is empty; after every change, each layer's residency is ascending ids
// below E and within the slots; a placement is what was placed; STATIC's end_step changes
// nothing; an online policy admits at most max_promotions_per_step a layer at every end_step;
// and at the end, per layer, hits <= selections, the steps are the steps ended, and the stats
// are the replay's own count (selections, hits against the residency of the moment, experts
// that joined and left), their sum the QMOE_EXPERT_CACHE_ALL_LAYERS stats. Returns 0, or the
// exit code after the message on stderr: 1 for a failed library call (its message) or a broken
// check (what broke, for which layer and step).
int replay_cache(CacheRow row, const CacheReplaySetup& setup, const RoutingTrace& trace,
                 CacheReplayResult* result);

#endif  // QMOE_TOOLS_QMOE_CACHE_TRACE_H_
