// qmoe_bench: every libqmoe benchmark in one Google Benchmark binary (docs/benchmarks.md).
//
// Differences from benchmark_main: cpuinfo is initialised and the benchmark files register
// after flag parsing (their sizes come from the host's caches); the default minimum time is
// 0.2 s per benchmark instead of 0.5 s (an explicit --benchmark_min_time or BENCHMARK_MIN_TIME
// wins); and the DRAM read roof is measured once, before the first benchmark, and printed in
// the context.
#include <benchmark/benchmark.h>
#include <cpuinfo.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "benchmarks/bench_util.h"

namespace {

// The value of the last `--name` or `--name=value` in argv: "" for a bare flag, nullptr when the
// flag is absent.
const char* flag_value(int argc, char** argv, const char* name) {
  const size_t length = std::strlen(name);
  const char* value = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, length) != 0) continue;
    if (argv[i][length] == '\0') value = "";
    if (argv[i][length] == '=') value = argv[i] + length + 1;
  }
  return value;
}

bool flag_is_true(int argc, char** argv, const char* name) {
  const char* value = flag_value(argc, argv, name);
  return value != nullptr && std::strcmp(value, "false") != 0 && std::strcmp(value, "0") != 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (!cpuinfo_initialize()) {
    std::fprintf(stderr, "qmoe_bench: cpuinfo_initialize failed; using fallback cache sizes\n");
  }

  char default_min_time[] = "--benchmark_min_time=0.2";
  std::vector<char*> args(argv, argv + argc);
  if (argc >= 1 && flag_value(argc, argv, "--benchmark_min_time") == nullptr &&
      std::getenv("BENCHMARK_MIN_TIME") == nullptr) {
    args.insert(args.begin() + 1, default_min_time);  // before the user's flags
  }
  args.push_back(nullptr);
  int args_count = static_cast<int>(args.size()) - 1;
  benchmark::Initialize(&args_count, args.data());
  if (benchmark::ReportUnrecognizedArguments(args_count, args.data())) return 1;

  qmoe::bench::run_registrars();
  // Listing needs no measurement.
  qmoe::bench::add_benchmark_context(
      /*measure_roof=*/!flag_is_true(argc, argv, "--benchmark_list_tests"));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
