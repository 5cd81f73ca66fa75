// `qmoe run --store FILE` and `--write-store FILE`: the weights read from, or written to, an
// expert store file (qmoe/qmoe_store.h), as a runtime would load its model.
#ifndef QMOE_TOOLS_QMOE_RUN_STORE_H_
#define QMOE_TOOLS_QMOE_RUN_STORE_H_

#include "qmoe/qmoe_store.h"
#include "run_model.h"
#include "run_options.h"

// An open --store file.
struct RunStore {
  RunStore() = default;
  RunStore(const RunStore&) = delete;
  RunStore& operator=(const RunStore&) = delete;
  ~RunStore() { qmoe_expert_store_close(store); }
  qmoe_expert_store* store = nullptr;
  qmoe_expert_store_info info{};
};

// Opens options->store and checks it against the model options: the preset's experts, hidden
// and intermediate widths, both projections of one format, the format --format named if any,
// and at most the file's layers if --layers named a count. Then options->shape takes the file's
// format and (without --layers) its layer count. Returns 0; 1 when the file cannot be opened
// or is damaged (the library's message); 2 when it does not match the options.
int open_run_store(RunOptions* options, RunStore* store);

// Writes every generated layer to options.write_store; model->store_write_s the seconds taken.
// Returns 0, or 1 after the library's message.
int write_run_store(const RunOptions& options, RunModel* model);

#endif  // QMOE_TOOLS_QMOE_RUN_STORE_H_
