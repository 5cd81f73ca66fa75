// Shared machinery of the qmoe_bench binary: host cache sizes, aligned buffers, a pinned
// thread team with one buffer slice per member, honest multi-thread timing, the DRAM read
// roof that memory-bound kernels are reported against, and deferred benchmark registration.
//
// Timing model (every benchmark here): the benchmark function runs on one Google Benchmark
// thread and uses UseManualTime(). An iteration's time runs from just before the work is handed
// to the team until the last member has finished it, so an N-thread figure is total bytes over
// wall time of the slowest thread, not an average of per-thread rates.
#ifndef QMOE_BENCHMARKS_BENCH_UTIL_H_
#define QMOE_BENCHMARKS_BENCH_UTIL_H_

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lib/cpu/kernel_table.h"
#include "lib/dispatch.h"
#include "qmoe/qmoe.h"

namespace qmoe::bench {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

// --- Host -----------------------------------------------------------------------------------

/// Data cache sizes from cpuinfo (per instance), with fallbacks when cpuinfo has none.
struct CacheSizes {
  size_t l1d;  // per core
  size_t l2;   // per instance
  size_t llc;  // last level: L3 when present, else L2
};
const CacheSizes& cache_sizes();

/// Hardware threads ("all threads" in benchmark names): cpuinfo_get_processors_count().
size_t hardware_threads();

/// The thread counts of `threads:1` and `threads:all` benchmarks: {1, all}, or {1} on a
/// single-threaded host.
std::vector<size_t> one_and_all_threads();

/// "threads:1" or "threads:all", the name part of a count from one_and_all_threads().
inline std::string threads_name(size_t threads) {
  return threads == 1 ? "threads:1" : "threads:all";
}

/// "fast" or "exact", as benchmark names spell the accuracy level.
inline const char* level_name(qmoe_accuracy accuracy) {
  return accuracy == QMOE_ACCURACY_FAST ? "fast" : "exact";
}

/// The tiers the build has (lib/cpu/isa_list.inc), lowest first: the ones benchmarks register.
std::vector<Isa> bench_tiers();

/// The kernel a context runs for `format` at `block_size` and `accuracy`
/// (qmoe_gemm_kernel_available), or "?".
const char* gemm_kernel_name(const qmoe_context* context, qmoe_weight_format format,
                             uint32_t block_size, qmoe_accuracy accuracy);
/// The kernel a context runs for INT4 (block 32) at `accuracy`, or "?".
const char* int4_gemm_kernel_name(const qmoe_context* context, qmoe_accuracy accuracy);

/// The assembled table of `isa`, or nullptr after state.SkipWithError("<isa> unavailable: why").
const KernelTable* table_or_skip(benchmark::State& state, Isa isa);

/// "256 KiB", "1.5 MiB", "96 B".
std::string format_bytes(double bytes);

// --- Memory ---------------------------------------------------------------------------------

/// Uninitialised storage from qmoe_alloc_weight_memory: 4096-byte aligned, and from 2 MiB up on
/// transparent huge pages where the OS allows, as qmoe_measure_read_bandwidth reads and as
/// docs/abi.md advises for weights (fewer TLB misses; the hardware prefetcher restarts at every
/// 4 KiB boundary). Pages are not touched here: first touch decides where they live.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// --- Threads --------------------------------------------------------------------------------

/// A fixed team: member 0 is the thread that constructs it (the benchmark thread), members
/// 1..size-1 are workers. Member t is pinned to the t-th allowed CPU (one per core first, then
/// SMT siblings) where the OS allows it, so the slice a member first-touches stays in that
/// core's caches and NUMA node for the team's life and for the next team of the same size.
/// The constructing thread's affinity is restored on destruction.
///
/// run() hands one task to every member and returns when all have finished it. Idle workers
/// spin on a generation counter for about a millisecond, then sleep on a condition variable,
/// so back-to-back iterations pay no wake-up syscall and an idle team costs no core.
class ThreadTeam {
 public:
  explicit ThreadTeam(size_t size);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  size_t size() const { return size_; }

  /// Calls fn(member) on every member (member 0 on the calling thread).
  template <typename Fn>
  void run(Fn& fn) {
    run_erased([](void* f, size_t member) { (*static_cast<Fn*>(f))(member); }, &fn);
  }

  /// "CPUs 0,1" or "not pinned (reason)"; for the benchmark context.
  static std::string pinning_description(size_t size);

 private:
  using Task = void (*)(void* state, size_t member);
  void run_erased(Task task, void* state);
  void worker_main(size_t member);

  size_t size_;
  std::vector<std::thread> workers_;
  bool restore_affinity_ = false;
  std::vector<unsigned char> saved_affinity_;  // cpu_set_t bytes of the constructing thread

  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};  // bumped (release) once per run() and at shutdown
  std::atomic<size_t> pending_{0};       // workers still running the current task
  Task task_ = nullptr;                  // written before the generation bump
  void* task_state_ = nullptr;
  bool stop_ = false;
};

/// `slices` slices of `slice_bytes` each (rounded up to 64 bytes), slice t first-touched by
/// member t of a team of `slices` members (pinned, so the pages are local to where member t of
/// any later team of that size runs).
class SlicedBuffer {
 public:
  SlicedBuffer(ThreadTeam& team, size_t slice_bytes);
  unsigned char* slice(size_t member) const { return buffer_.data() + member * slice_bytes_; }
  size_t slice_bytes() const { return slice_bytes_; }

 private:
  size_t slice_bytes_;
  AlignedBuffer buffer_;
};

// --- Contexts -------------------------------------------------------------------------------

/// QMOE_BENCH_GEMM_POOL=team: multi-threaded contexts run on qmoe_bench's pinned ThreadTeam
/// through a caller parallel_for instead of libqmoe's own pthreadpool.
bool use_team_pool();

// A qmoe_parallel_for_fn over qmoe_bench's pinned team: member t runs items t, t + size, ...
struct TeamParallelFor {
  ThreadTeam* team;

  static void call(void* state, qmoe_parallel_task_fn task, void* task_state, size_t range) {
    ThreadTeam& team = *static_cast<TeamParallelFor*>(state)->team;
    const size_t size = team.size();
    auto items = [&](size_t member) {
      for (size_t i = member; i < range; i += size) task(task_state, i);
    };
    team.run(items);
  }
};

// Owns a context (and, in team mode, the team behind its parallel_for).
class BenchContext {
 public:
  BenchContext(Isa isa, size_t threads) {
    qmoe_context_options options;
    qmoe_context_options_init(&options);
    options.max_isa = static_cast<qmoe_isa>(isa);
    options.num_threads = static_cast<uint32_t>(threads);
    if (threads > 1 && use_team_pool()) {
      team_ = std::make_unique<ThreadTeam>(threads);
      team_parallel_for_.team = team_.get();
      options.parallel_for = &TeamParallelFor::call;
      options.parallel_for_state = &team_parallel_for_;
    }
    status_ = qmoe_context_create(&options, &context_);
    if (status_ != QMOE_STATUS_OK) error_ = qmoe_last_error_message();
  }
  ~BenchContext() { qmoe_context_destroy(context_); }
  BenchContext(const BenchContext&) = delete;
  BenchContext& operator=(const BenchContext&) = delete;

  qmoe_context* get() const { return context_; }
  bool ok() const { return status_ == QMOE_STATUS_OK; }
  const std::string& error() const { return error_; }

 private:
  std::unique_ptr<ThreadTeam> team_;
  TeamParallelFor team_parallel_for_{nullptr};
  qmoe_context* context_ = nullptr;
  qmoe_status status_ = QMOE_STATUS_OK;
  std::string error_;
};

// --- Data ---------------------------------------------------------------------------------

/// SplitMix64: the deterministic generator every benchmark fills its data from.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// `bytes` random bytes (INT4 codes: every nibble 0..15).
void fill_random_bytes(void* dst, size_t bytes, uint64_t& seed);

/// FP16 scales of weight-like magnitude: 2^-8 .. 2^-5, random sign and mantissa.
void fill_weight_scales_f16(uint16_t* dst, size_t count, uint64_t& seed);

/// Last-level cache of the whole host: the per-instance size times the number of instances, so
/// that a cold rotation also defeats several L3s (multi-CCD parts) with every thread running.
size_t llc_total_bytes();

// --- Timing and counters --------------------------------------------------------------------

/// The benchmark loop: each iteration runs `prepare()` untimed (picking the next cold matrix or
/// route, say), then times `work()` with a steady clock and reports it with SetIterationTime
/// (register the benchmark with UseManualTime()). Returns the summed time of `work`.
template <typename Prepare, typename Work>
double run_timed(benchmark::State& state, Prepare&& prepare, Work&& work) {
  double total_seconds = 0.0;
  for (auto _ : state) {
    prepare();
    const auto start = std::chrono::steady_clock::now();
    work();
    const auto stop = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(stop - start).count();
    state.SetIterationTime(seconds);
    total_seconds += seconds;
  }
  return total_seconds;
}

/// run_timed with nothing to prepare.
template <typename Work>
double run_timed(benchmark::State& state, Work&& work) {
  return run_timed(
      state, [] {}, std::forward<Work>(work));
}

/// Registers `body(state)` as benchmark `name` with the manual timing run_timed reports
/// (UseManualTime), in microseconds: how every qmoe_bench benchmark is registered.
template <typename Body>
void register_timed(const std::string& name, Body body) {
  benchmark::RegisterBenchmark(name.c_str(), std::move(body))
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

/// How many times one timed iteration repeats a pass of `bytes_per_pass` per thread so that it
/// moves at least 16 MiB per thread: the clock reads and the team hand-off (about a
/// microsecond) then stay under 1% of an iteration even for L1- and L2-resident passes.
inline size_t passes_for(size_t bytes_per_pass) {
  constexpr size_t kMinBytesPerIteration = 16 * kMiB;
  return bytes_per_pass >= kMinBytesPerIteration
             ? 1
             : (kMinBytesPerIteration + bytes_per_pass - 1) / bytes_per_pass;
}

/// Sets bytes_per_second (SetBytesProcessed), "GB/s" (1e9 bytes/s), and with
/// `versus_read_roof`, "frac_of_read_bw": achieved bytes/s over the read roof of `threads`.
void report_bandwidth(benchmark::State& state, double bytes_per_iteration, double total_seconds,
                      size_t threads, bool versus_read_roof);

/// Reads taken beside timed calls (the paired read, untimed): each one pass of
/// qmoe_measure_read_bandwidth_over over the next cold weights on the call's context and
/// threads, so the call's roof is measured in the same seconds as the call.
struct PairedRead {
  double bytes = 0.0, seconds = 0.0;
  qmoe_status failed = QMOE_STATUS_OK;  // the first failure (the read then counts nothing)

  /// Reads [data, data + size) once, on all the context's threads or on one.
  void read(qmoe_context* context, const void* data, size_t size, bool all_threads);
  /// "paired_read_GB/s" (the reads' bytes over their time) and "frac_of_paired_read" (the
  /// calls' rate, call_bytes in call_seconds, over it); nothing when no read counted.
  void report(benchmark::State& state, double call_bytes, double call_seconds) const;
};

// --- The read roof --------------------------------------------------------------------------

/// DRAM read bandwidth measured once per process: the best tier's read kernel streaming a
/// buffer of max(8 x LLC, 256 MiB), first on one thread, then on all hardware threads (one
/// first-touched slice each), best of kRoofPasses passes after a warm-up pass. A best-of figure
/// is the attainable peak, so fractions against it are conservative.
struct ReadRoof {
  static constexpr int kRoofPasses = 7;
  Isa isa;
  size_t buffer_bytes;
  size_t threads;                  // "all": hardware_threads()
  double one_thread_bytes_per_s;   // 1 thread
  double all_threads_bytes_per_s;  // `threads` threads
  /// The roof for 1 or for all hardware threads; 0 for other counts (not measured).
  double bytes_per_second(size_t thread_count) const;
};

/// Measured on first call (about half a second), then cached.
const ReadRoof& read_roof();

/// Adds the roof and the host facts (caches, huge-page mode, pinning) to the benchmark
/// context. Call before benchmark::RunSpecifiedBenchmarks().
void add_benchmark_context(bool measure_roof);

// --- Registration ---------------------------------------------------------------------------

/// Benchmark files register from main() (after cpuinfo is up, since sizes depend on the host):
/// `QMOE_BENCH_REGISTRAR(order, fn)` at namespace scope queues `void fn()`. Registrars run in
/// ascending `order` (the order benchmarks run and print in), whatever the link order:
/// 100 read bandwidth, 200 conversions; later kernels take the next hundreds.
using Registrar = void (*)();
bool add_registrar(int order, Registrar registrar);
void run_registrars();

}  // namespace qmoe::bench

#define QMOE_BENCH_CONCAT_INNER_(a, b) a##b
#define QMOE_BENCH_CONCAT_(a, b) QMOE_BENCH_CONCAT_INNER_(a, b)
#define QMOE_BENCH_REGISTRAR(order, fn)                                              \
  [[maybe_unused]] static const bool QMOE_BENCH_CONCAT_(qmoe_registrar_, __LINE__) = \
      ::qmoe::bench::add_registrar((order), (fn))

#endif  // QMOE_BENCHMARKS_BENCH_UTIL_H_
