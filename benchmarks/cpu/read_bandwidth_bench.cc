// Read bandwidth of each tier's read kernel (the XOR of every 64-bit word), from L2 and from
// DRAM, on one thread and on all hardware threads.
//
//   read_bandwidth/<isa>/l2/threads:<t>    half an L2 per thread (an L2 shared by k of the
//                                          threads gets 1/k of that), re-read many times
//   read_bandwidth/<isa>/dram/threads:<t>  max(8 x LLC, 256 MiB) split over the threads;
//                                          also reports frac_of_read_bw against the roof
//
// Each thread reads its own slice, first-touched by itself; see bench_util.h for the timing.
#include <cpuinfo.h>

#include <algorithm>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"

namespace qmoe::bench {
namespace {

void read_bandwidth_benchmark(benchmark::State& state, Isa isa, size_t slice_bytes, size_t threads,
                              bool dram) {
  const KernelTable* table = table_or_skip(state, isa);
  if (table == nullptr) return;
  const ReadBandwidthFn read = table->read_bandwidth.fn;

  ThreadTeam team(threads);
  SlicedBuffer buffer(team, slice_bytes);
  const size_t passes = passes_for(buffer.slice_bytes());
  constexpr size_t kSinkStride = 8;  // one cache line per thread
  std::vector<uint64_t> sinks(threads * kSinkStride, 0);
  auto work = [&](size_t member) {
    uint64_t x = 0;
    for (size_t p = 0; p < passes; ++p) x ^= read(buffer.slice(member), buffer.slice_bytes());
    sinks[member * kSinkStride] ^= x;
  };
  team.run(work);  // warm-up: caches, TLB

  const double seconds = run_timed(state, [&] { team.run(work); });
  benchmark::DoNotOptimize(sinks.data());

  state.SetLabel(format_bytes(static_cast<double>(buffer.slice_bytes())) + " per thread, " +
                 std::to_string(passes) + (passes == 1 ? " pass" : " passes") + "/iteration");
  report_bandwidth(state,
                   static_cast<double>(buffer.slice_bytes()) * static_cast<double>(passes) *
                       static_cast<double>(threads),
                   seconds, threads, /*versus_read_roof=*/dram);
}

void register_read_bandwidth_benchmarks() {
  const CacheSizes& caches = cache_sizes();
  const size_t all = hardware_threads();
  // Threads sharing one L2 instance when all hardware threads run (SMT siblings).
  size_t l2_sharers = 1;
  if (cpuinfo_initialize() && cpuinfo_get_l2_caches_count() > 0) {
    l2_sharers = std::max<uint32_t>(1, cpuinfo_get_l2_cache(0)->processor_count);
  }
  const size_t dram_total = std::max(8 * llc_total_bytes(), 256 * kMiB);  // every L3 instance

  std::vector<size_t> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  for (Isa isa : bench_tiers()) {
    for (bool dram : {false, true}) {
      for (size_t threads : thread_counts) {
        const size_t slice_bytes =
            dram ? dram_total / threads / 64 * 64 : caches.l2 / 2 / (threads == 1 ? 1 : l2_sharers);
        const std::string name = std::string("read_bandwidth/") + isa_name(isa) +
                                 (dram ? "/dram" : "/l2") + "/threads:" + std::to_string(threads);
        register_timed(name, [=](benchmark::State& state) {
          read_bandwidth_benchmark(state, isa, slice_bytes, threads, dram);
        });
      }
    }
  }
}

QMOE_BENCH_REGISTRAR(100, register_read_bandwidth_benchmarks);

}  // namespace
}  // namespace qmoe::bench
