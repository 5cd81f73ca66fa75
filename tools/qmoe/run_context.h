// What `qmoe run` runs on: the host as the library sees it, the context made from the
// options, and the tier, thread count and kernels that context chose.
#ifndef QMOE_TOOLS_QMOE_RUN_CONTEXT_H_
#define QMOE_TOOLS_QMOE_RUN_CONTEXT_H_

#include <cstdint>
#include <memory>

#include "qmoe/qmoe.h"
#include "run_options.h"

struct ContextDeleter {
  void operator()(qmoe_context* c) const { qmoe_context_destroy(c); }
};

struct RunContext {
  qmoe_host_info host{};
  std::unique_ptr<qmoe_context, ContextDeleter> context;
  qmoe_isa tier = QMOE_ISA_SCALAR;
  uint32_t threads = 1;
  const char* gemm_kernel = nullptr;  // the dequant-GEMM of --accuracy
  const char* quantize_kernel = nullptr;
  const char* bandwidth_kernel = nullptr;
};

// Creates the context for --isa and --threads and reads back what it chose. Returns 0, or 1
// after the library's message on stderr.
int open_run_context(const RunOptions& options, RunContext* run);

#endif  // QMOE_TOOLS_QMOE_RUN_CONTEXT_H_
