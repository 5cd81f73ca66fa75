// `qmoe run`: a MoE decode end to end with a synthetic model of one MoE's layer shape (--model,
// model_presets.h; Qwen3-30B-A3B by default), on the CPU, or with --gpu the hybrid CPU/GPU
// decode (run_gpu.h), through the public C ABI only.
// Prints what a performance engineer wants to see.

#include <cstdio>

#include "commands.h"
#include "qmoe/qmoe_cuda.h"
#include "run_bandwidth.h"
#include "run_check.h"
#include "run_clock.h"
#include "run_context.h"
#include "run_decode.h"
#ifdef QMOE_TOOL_WITH_CUDA
#include "run_gpu.h"
#endif
#include "run_model.h"
#include "run_options.h"
#include "run_report.h"
#include "run_store.h"

// Each stage returns 0 or the exit code, after its own message on stderr.
int run_run_command(int argc, char** argv) {
  RunOptions options;
  bool help = false;
  if (const int code = parse_run_options(argc, argv, &options, &help); code != 0) return code;
  if (help) {
    print_run_usage(stdout);
    return 0;
  }
#ifndef QMOE_TOOL_WITH_CUDA
  if (options.gpu) {
    std::fprintf(stderr, "qmoe run: --gpu needs a qmoe built with CUDA (QMOE_CUDA=ON)\n");
    return 2;
  }
#else
  if (options.gpu) {  // before the weights are generated: no GPU, no run
    int devices = 0;
    const qmoe_status status = qmoe_cuda_get_device_count(&devices);
    if (status != QMOE_STATUS_OK) return report_failed_call(status);
    if (devices <= options.device) {
      std::fprintf(stderr, "qmoe run: --gpu: no CUDA device %d (%d visible)\n", options.device,
                   devices);
      return 1;
    }
  }
#endif
  std::FILE* out = options.json ? stderr : stdout;  // the human report
  const auto run_start = Clock::now();

  // The weights are sized, and refused if they cannot fit, before a context is made.
  RunContext run;
  RunModel model;
  RunStore store;  // --store: its layers and format become the model's before it is sized
  if (options.store != nullptr) {
    if (const int code = open_run_store(&options, &store); code != 0) return code;
  }
  model.mapped_sizing = options.map_store;
  if (const int code = size_run_model(options.shape, options.map_store, &model); code != 0) {
    return code;
  }
  if (const int code = open_run_context(options, &run); code != 0) return code;
  print_run_header(out, options, run, model);

  RunBandwidth bandwidth;
  if (const int code = measure_buffer_bandwidth(run, &bandwidth); code != 0) return code;
  print_buffer_bandwidth(out, run, bandwidth);
  if (options.store != nullptr) {
    if (const int code =
            load_run_model(options, run.context.get(), store.store, store.info, &model);
        code != 0) {
      return code;
    }
  } else if (const int code = generate_run_model(options, run.context.get(), &model); code != 0) {
    return code;
  }
  if (options.write_store != nullptr) {
    if (const int code = write_run_store(options, &model); code != 0) return code;
  }
  if (const int code = measure_weights_bandwidth(run, model, &bandwidth); code != 0) return code;

  if (options.gpu) {
#ifdef QMOE_TOOL_WITH_CUDA
    GpuDecodeResult gpu;
    if (const int code = run_gpu_decode(options, run.context.get(), model, &gpu); code != 0) {
      return code;
    }
    if (const int code = measure_buffer_bandwidth_again(run, &bandwidth); code != 0) return code;
    print_gpu_report(out, options, run, model, bandwidth, gpu, seconds_since(run_start));
    if (!gpu.conserved || !gpu.finite || !gpu.counts_match) {
      std::fprintf(stderr, "qmoe run: %s\n",
                   !gpu.conserved ? "the offload telemetry is not conserved"
                   : !gpu.finite  ? "the hidden state is not finite"
                                  : "the device's expert counts differ from the routing");
      return 1;
    }
    return 0;
#endif
  }

  DecodeResult decode;
  if (const int code = run_decode(options, run.context.get(), model, &decode); code != 0) {
    return code;
  }
  print_run_report(out, options, run, model, bandwidth, decode, seconds_since(run_start));
  if (!decode.finite) {
    std::fprintf(stderr, "qmoe run: the hidden state is not finite\n");
    return 1;
  }
  return 0;
}
