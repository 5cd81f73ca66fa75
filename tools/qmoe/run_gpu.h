// `qmoe run --gpu`: the hybrid decode. Each layer's most popular experts (--residency of them)
// are resident on the GPU and the rest stay on the CPU; every step is one CUDA graph of all
// layers, each layer a qmoe_cuda_offload_forward (the resident experts on the GPU, the cold
// ones on the CPU through the offload ring) and the tool's RMS rescale. The same steps then run
// through a graph of the resident layers alone (qmoe_cuda_moe_forward, cold experts skipped):
// the GPU's share of the work, timed in the same process. Last, the CPU's share alone: each
// step's cold work through qmoe_moe_forward on the session's context, no GPU involved, so that
// the hybrid's time over the CPU floor splits into the hand-off and the executor's own shortfall
// below the read roof.
#ifndef QMOE_TOOLS_QMOE_RUN_GPU_H_
#define QMOE_TOOLS_QMOE_RUN_GPU_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cuda.h"
#include "run_bandwidth.h"
#include "run_context.h"
#include "run_model.h"
#include "run_options.h"

struct GpuDecodeResult {
  std::string device_name;
  uint32_t resident_per_layer = 0;
  // Each timed step's graph, GPU time from CUDA events (the routing copy before it excluded),
  // and the host's wall time of the whole step (wake, routing copy, launch, synchronise).
  std::vector<double> hybrid_ms, resident_ms, hybrid_wall_ms;
  // Each timed step's wall time of the same cold work on the CPU alone: every layer call with a
  // cold selection, in layer order, through qmoe_moe_forward with the layer's cold experts as
  // the run mask. Empty when no expert is cold (the pass does not run).
  std::vector<double> cpu_alone_ms;
  // Over the timed steps, from the routing as drawn on the host: distinct experts a layer call
  // reads, cold (on the CPU) and resident; (token, slot) selections with a nonzero weight, and
  // those of cold experts; layer calls with at least one cold selection.
  uint64_t cold_experts = 0, resident_experts = 0;
  uint64_t selections = 0, cold_selections = 0;
  uint64_t calls_with_cold = 0, layer_calls = 0;
  // The session's counters around the timed hybrid steps, and at the end.
  qmoe_cuda_offload_telemetry before{}, after{};
  bool conserved = false;
  std::string conservation;  // what was checked, or what failed
  uint64_t checksum = 0;     // FNV-1a of the last hidden state (hybrid)
  bool finite = true;
  // Every layer of both graphs writes its selections per expert (expert_counts, what a
  // runtime's expert cache observes) into one [layers, E] buffer: after each pass, the last
  // step's counts equal the routing's (false, or the run fails).
  bool counts_match = false;
  // --cache: experts the schedule promotes over the timed steps, and those the hybrid pass's
  // begun updates copied (the same, or the conservation check fails).
  uint64_t scheduled_promotions = 0, copied_promotions = 0;
  // --cache: each timed hybrid step's host time in the residency updates (every layer's finish
  // and begin, before the step's graph is launched).
  std::vector<double> update_host_ms;
  // --host-memory pinned: the seconds cudaHostRegister took over every layer's weights.
  double pin_seconds = 0.0;
};

// Returns 0, or 1 after the library's or CUDA's message on stderr.
int run_gpu_decode(const RunOptions& options, qmoe_context* context, const RunModel& model,
                   GpuDecodeResult* result);

// The results in text, then in JSON under --json.
void print_gpu_report(std::FILE* out, const RunOptions& options, const RunContext& run,
                      const RunModel& model, const RunBandwidth& bandwidth,
                      const GpuDecodeResult& gpu, double total_s);

#endif  // QMOE_TOOLS_QMOE_RUN_GPU_H_
