// The weights `qmoe run` decodes with: their size checked against the memory this process may
// use before anything is allocated, then every layer generated from --seed, and the workspace
// of one layer call sized and checked as soon as the first layer exists.
#ifndef QMOE_TOOLS_QMOE_RUN_MODEL_H_
#define QMOE_TOOLS_QMOE_RUN_MODEL_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "qmoe/qmoe.h"
#include "run_options.h"
#include "synthetic_model.h"

struct RunModel {
  ExpertBytes expert_bytes;
  double weight_bytes_total = 0.0;  // every expert of every layer
  double usable_memory = 0.0;       // physical, or the cgroup's limit if lower; 0 if unknown
  std::vector<std::unique_ptr<SyntheticLayer>> layers;
  size_t workspace_bytes = 0;  // one layer call of --batch tokens
  double generate_s = 0.0;
  unsigned generate_threads = 1;
  // --store: the seconds reading (and checking) every layer from the file, instead of
  // generate_s. --write-store: the seconds writing it.
  bool from_store = false;
  bool mapped = false;         // --map: the sets are over the mapped file (no weight memory)
  bool mapped_sizing = false;  // set before loading with --map: the weights are not counted
  double store_read_s = 0.0, store_write_s = 0.0;
  unsigned store_read_threads = 1;
};

// Sizes the weights of `shape`. Returns 0; 1 when the library cannot size them; 2 when they
// would fill over 70% of the usable memory (the message says how many layers fit).
// With `mapped` (--map) the weights are not counted against memory.
int size_run_model(const ModelShape& shape, bool mapped, RunModel* model);

// Generates every layer and sizes the workspace. Returns 0; 1 when a library call or an
// allocation fails; 2 when the weights and the workspace would fill over 80% of the usable
// memory.
int generate_run_model(const RunOptions& options, qmoe_context* context, RunModel* model);

// --store: reads every layer of options.shape from the open store (CRC-32C checked; layer 0
// first, to size the workspace, then the others on every hardware thread); returns as
// generate_run_model.
int load_run_model(const RunOptions& options, qmoe_context* context, const qmoe_expert_store* store,
                   const qmoe_expert_store_info& info, RunModel* model);

// Bytes of the weights on transparent huge pages: this process's anonymous huge pages, which
// are nearly all the weights', capped at their size (Linux; 0 elsewhere or when unknown).
double weight_bytes_on_huge_pages(const RunModel& model);

#endif  // QMOE_TOOLS_QMOE_RUN_MODEL_H_
