#include "run_context.h"

#include <cstdio>
#include <cstring>

#include "qmoe/qmoe_experimental.h"
#include "run_check.h"

int open_run_context(const RunOptions& options, RunContext* run) {
  std::memset(&run->host, 0, sizeof(run->host));
  run->host.struct_size = sizeof(run->host);
  QMOE_CHECK(qmoe_get_host_info(&run->host));

  qmoe_context_options context_options;
  qmoe_context_options_init(&context_options);
  context_options.max_isa = options.isa;
  context_options.num_threads = options.threads;
  // --gpu: the host thread that launches each step's graph and spins on its event needs a core
  // of its own, besides the context's threads (the offload service thread is one of them: it is
  // the pool's caller). One thread too many parks a worker for a scheduler tick inside every
  // layer's cold work (docs/offload.md, "Sizing the context").
  if (options.gpu && options.threads == 0 && run->host.physical_cores > 1) {
    context_options.num_threads = run->host.physical_cores - 1;
  }
  qmoe_context* context = nullptr;
  QMOE_CHECK(qmoe_context_create(&context_options, &context));
  run->context.reset(context);

  QMOE_CHECK(qmoe_context_get_isa(context, &run->tier));
  QMOE_CHECK(qmoe_context_get_num_threads(context, &run->threads));
  int available = 0;
  const RunFormat& format = run_format(options.shape.format);
  QMOE_CHECK(qmoe_gemm_kernel_available(context, format.format, format.block_size, options.accuracy,
                                        &available, &run->gemm_kernel));
  if (!available) {
    std::fprintf(stderr, "qmoe run: the %s tier has no %s GEMM for %s block %u weights\n",
                 qmoe_isa_name(run->tier), accuracy_name(options.accuracy), format.name,
                 format.block_size);
    return 1;
  }
  uint32_t count = 0;
  QMOE_CHECK(qmoe_context_get_kernel_count(context, &count));
  for (uint32_t i = 0; i < count; ++i) {
    qmoe_kernel_info info{};
    info.struct_size = sizeof info;
    QMOE_CHECK(qmoe_context_get_kernel_info(context, i, &info));
    if (std::strcmp(info.operation, "quantize_activations_q8") == 0)
      run->quantize_kernel = info.name;
    if (std::strcmp(info.operation, "read_bandwidth") == 0) run->bandwidth_kernel = info.name;
  }
  return 0;
}
