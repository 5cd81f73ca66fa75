// Which experts each step of `qmoe run --gpu` runs resident, decided before the GPU passes so
// that the hybrid pass, the resident-only pass, the CPU-alone pass and the accounting all use
// the same residency. Without a cache policy every step has the initial residency. With one
// (--cache), the tool drives the expert cache (qmoe/qmoe_cache.h) as a runtime would, with the
// begun residency updates of qmoe/qmoe_cuda.h at every step boundary:
//
//   step s's graph, and behind it the finish of the update begun before step s (the stream
//   waits for its copies, which ran during step s, then maps its newcomers);
//   observe step s's routing, end_step -> the cache's list R_s;
//   at the start of step s + 1: begin the update to R_s (the map keeps only the experts of both
//   lists; R_s's newcomers are copied during step s + 1);  step s + 1's graph.
//
// So step 0 runs with the initial residency I, and step s >= 1 with R_{s-2} and R_{s-1}'s common
// experts (R_{-1} = I): a promoted expert is on the CPU for the step after its selection and on
// the GPU from the one after that, and no step waits for a copy unless the copies outlast a step.
#ifndef QMOE_TOOLS_QMOE_RESIDENCY_SCHEDULE_H_
#define QMOE_TOOLS_QMOE_RESIDENCY_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cache.h"
#include "run_routing.h"

struct ResidencySchedule {
  uint32_t steps = 0, layers = 0, experts = 0;
  // Whether a cache moved the residency; false: every step has the initial residency.
  bool cached = false;
  // [layer]: the initial resident lists.
  std::vector<std::vector<uint32_t>> initial;
  // [step][layer][expert] (cached) or [0][layer][expert]: 1 when the expert is mapped when the
  // step's graph runs.
  std::vector<std::vector<std::vector<uint8_t>>> mapped;
  // cached: [step][layer], the list whose update begins at the start of the step (empty and
  // `begins` 0 where the list did not change, and at step 0).
  std::vector<std::vector<std::vector<uint32_t>>> begin_lists;
  std::vector<std::vector<uint8_t>> begins;
  // cached: experts that join over all updates begun at the starts of steps >= 1.
  uint64_t promotions = 0;

  const std::vector<uint8_t>& resident(uint32_t step, uint32_t layer) const {
    return mapped[cached ? step : 0][layer];
  }
};

struct CacheChoice {
  qmoe_cache_policy policy = static_cast<qmoe_cache_policy>(0);  // 0: no cache
  uint32_t budget = 0;                                           // promotions a layer a step
  float admission_margin = 0.0f;
  float half_life_steps = 32.0f;
};

// The schedule of `steps` steps of `trace` (ids [step][layer][token][slot], weights with a 0
// for a slot that is not routed) from the initial lists (each at most `slots` experts), under
// `cache` (num_slots = `slots`). Returns the library's status (its message stands) on failure.
qmoe_status build_residency_schedule(const RoutingTrace& trace, uint32_t steps, uint32_t layers,
                                     uint32_t experts, uint32_t slots,
                                     const std::vector<std::vector<uint32_t>>& initial,
                                     const CacheChoice& cache, ResidencySchedule* out);

#endif  // QMOE_TOOLS_QMOE_RESIDENCY_SCHEDULE_H_
