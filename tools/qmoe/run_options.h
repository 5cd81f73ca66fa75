// `qmoe run`'s options: what a run can be asked to do, their --help text and their parsing.
#ifndef QMOE_TOOLS_QMOE_RUN_OPTIONS_H_
#define QMOE_TOOLS_QMOE_RUN_OPTIONS_H_

#include <cstdint>
#include <cstdio>

#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cache.h"
#include "run_routing.h"
#include "synthetic_model.h"

struct RunOptions {
  ModelShape shape;      // --model, --layers and --format (model_presets.h: the rest)
  uint32_t tokens = 64;  // timed decode steps
  uint32_t batch = 1;    // tokens per step
  qmoe_accuracy accuracy = QMOE_ACCURACY_FAST;
  qmoe_dtype activations = QMOE_DTYPE_F32;  // of the hidden state x, in and out of each layer
  qmoe_isa isa = QMOE_ISA_DEFAULT;          // the highest tier the context may use
  uint32_t threads = 0;                     // 0: one per physical core
  uint64_t seed = 1;                        // of the weights and the router logits
  bool json = false;                        // JSON summary on stdout, the human report on stderr
  RoutingKind routing = RoutingKind::kUniform;  // --routing
  // --gpu: the hybrid decode (tools/qmoe/run_gpu.h), each layer's `residency` fraction of its
  // experts (the most popular) resident on GPU `device`, the rest on the CPU.
  bool gpu = false;
  double residency = 1.0;
  int device = 0;
  // --routing drift: the Zipf order redrawn every this many steps (--drift-period).
  uint32_t drift_period = 500;
  // --cache (with --gpu): the expert cache's policy moves each layer's residency between steps
  // (tools/qmoe/residency_schedule.h), at most `cache_budget` promotions a layer a step
  // (--cache-budget, 0: none); 0 (no --cache): the residency stays as placed.
  qmoe_cache_policy cache = static_cast<qmoe_cache_policy>(0);
  uint32_t cache_budget = 0;
  // --cache-margin: the cache's admission_margin (qmoe/qmoe_cache.h).
  float cache_margin = 0.0f;
  // --host-memory (with --gpu): the host experts page-locked (cudaHostRegister) so that the
  // residency copies run on the copy engine without the host staging them, or left pageable.
  bool pin_host_experts = true;
  // --store FILE: the weights read from an expert store (qmoe/qmoe_store.h) instead of
  // generated; its first --layers layers (default: all). --write-store FILE: the generated
  // weights written to one first.
  const char* store = nullptr;
  const char* write_store = nullptr;
  // --map (with --store): the layers made over the file mapped read-only instead of read into
  // weight memory: the page cache holds them (qmoe_expert_store_map_layer).
  bool map_store = false;
  bool layers_given = false;  // --layers was on the command line
  bool format_given = false;  // --format was
};

void print_run_usage(std::FILE* out);

// Returns 0 when the options are parsed or --help was asked for (*help set); otherwise 2, the
// exit code of a usage error, after the complaint and the usage on stderr.
int parse_run_options(int argc, char** argv, RunOptions* options, bool* help);

// The option values as --accuracy, --activations and --cache spell them ("none": no cache).
const char* accuracy_name(qmoe_accuracy accuracy);
const char* cache_policy_name(qmoe_cache_policy policy);
const char* activations_name(qmoe_dtype activations);

#endif  // QMOE_TOOLS_QMOE_RUN_OPTIONS_H_
