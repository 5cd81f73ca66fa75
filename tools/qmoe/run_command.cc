// `qmoe run`: a MoE decode end to end on the CPU with a synthetic model of the Qwen3-30B-A3B
// shape, through the public C ABI only. Prints what a performance engineer wants to see.

#include <cstdio>

#include "commands.h"
#include "run_bandwidth.h"
#include "run_clock.h"
#include "run_context.h"
#include "run_decode.h"
#include "run_model.h"
#include "run_options.h"
#include "run_report.h"

// Each stage returns 0 or the exit code, after its own message on stderr.
int run_run_command(int argc, char** argv) {
  RunOptions options;
  bool help = false;
  if (const int code = parse_run_options(argc, argv, &options, &help); code != 0) return code;
  if (help) {
    print_run_usage(stdout);
    return 0;
  }
  std::FILE* out = options.json ? stderr : stdout;  // the human report
  const auto run_start = Clock::now();

  // The weights are sized, and refused if they cannot fit, before a context is made.
  RunContext run;
  RunModel model;
  if (const int code = size_run_model(options.shape, &model); code != 0) return code;
  if (const int code = open_run_context(options, &run); code != 0) return code;
  print_run_header(out, options, run, model);

  RunBandwidth bandwidth;
  if (const int code = measure_buffer_bandwidth(run, &bandwidth); code != 0) return code;
  print_buffer_bandwidth(out, run, bandwidth);
  if (const int code = generate_run_model(options, run.context.get(), &model); code != 0) {
    return code;
  }
  if (const int code = measure_weights_bandwidth(run, model, &bandwidth); code != 0) return code;

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
