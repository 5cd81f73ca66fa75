#include "run_context.h"

#include <cstring>

#include "run_check.h"

int open_run_context(const RunOptions& options, RunContext* run) {
  std::memset(&run->host, 0, sizeof(run->host));
  run->host.struct_size = sizeof(run->host);
  QMOE_CHECK(qmoe_get_host_info(&run->host));

  qmoe_context_options context_options;
  qmoe_context_options_init(&context_options);
  context_options.max_isa = options.isa;
  context_options.num_threads = options.threads;
  qmoe_context* context = nullptr;
  QMOE_CHECK(qmoe_context_create(&context_options, &context));
  run->context.reset(context);

  QMOE_CHECK(qmoe_context_get_isa(context, &run->tier));
  QMOE_CHECK(qmoe_context_get_num_threads(context, &run->threads));
  const qmoe_kernel_slot gemm_slot = options.accuracy == QMOE_ACCURACY_FAST
                                         ? QMOE_KERNEL_GEMM_INT4_FAST
                                         : QMOE_KERNEL_GEMM_INT4_EXACT;
  QMOE_CHECK(qmoe_context_get_kernel_name(context, gemm_slot, &run->gemm_kernel));
  QMOE_CHECK(qmoe_context_get_kernel_name(context, QMOE_KERNEL_QUANTIZE_ACTIVATIONS_Q8,
                                          &run->quantize_kernel));
  QMOE_CHECK(
      qmoe_context_get_kernel_name(context, QMOE_KERNEL_READ_BANDWIDTH, &run->bandwidth_kernel));
  return 0;
}
