#include "benchmarks/bench_util.h"

#include <cpuinfo.h>
#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include "qmoe/qmoe_experimental.h"

namespace qmoe::bench {
namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// CPUs for team members, in member order: the first allowed logical processor of every core,
// then the second of every core, and so on (so N <= cores threads land on N distinct cores).
// Empty when the OS gives no affinity control or no allowed CPU is known.
const std::vector<int>& pin_order() {
  static const std::vector<int> order = [] {
    std::vector<int> cpus;
#if defined(__linux__)
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return cpus;
    if (cpuinfo_initialize()) {
      uint32_t max_per_core = 0;
      for (uint32_t c = 0; c < cpuinfo_get_cores_count(); ++c) {
        max_per_core = std::max(max_per_core, cpuinfo_get_core(c)->processor_count);
      }
      for (uint32_t k = 0; k < max_per_core; ++k) {
        for (uint32_t c = 0; c < cpuinfo_get_cores_count(); ++c) {
          const cpuinfo_core* core = cpuinfo_get_core(c);
          if (k >= core->processor_count) continue;
          const int id = cpuinfo_get_processor(core->processor_start + k)->linux_id;
          if (id >= 0 && id < CPU_SETSIZE && CPU_ISSET(id, &allowed)) cpus.push_back(id);
        }
      }
    }
    if (cpus.empty()) {
      for (int id = 0; id < CPU_SETSIZE; ++id) {
        if (CPU_ISSET(id, &allowed)) cpus.push_back(id);
      }
    }
#endif
    return cpus;
  }();
  return order;
}

// Pins the calling thread to member `member`'s CPU; false when that is not possible.
bool pin_current_thread(size_t member) {
#if defined(__linux__)
  const std::vector<int>& cpus = pin_order();
  if (cpus.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpus[member % cpus.size()], &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
#else
  (void)member;
  return false;
#endif
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "unknown";
  return line;
}

std::string format_gbps(double bytes_per_second) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", bytes_per_second / 1e9);
  return text;
}

std::vector<std::pair<int, Registrar>>& registrars() {
  static std::vector<std::pair<int, Registrar>> list;
  return list;
}

// Best-of pass bandwidth of `read` over a buffer of about `total_bytes` split over `threads`.
double measure_read_bandwidth(ReadBandwidthFn read, size_t threads, size_t total_bytes) {
  ThreadTeam team(threads);
  SlicedBuffer buffer(team, total_bytes / threads / 64 * 64);
  constexpr size_t kSinkStride = 8;  // one cache line per member
  std::vector<uint64_t> sinks(threads * kSinkStride, 0);
  auto pass = [&](size_t member) {
    sinks[member * kSinkStride] ^= read(buffer.slice(member), buffer.slice_bytes());
  };
  team.run(pass);  // warm-up: TLB, page tables, frequency
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < ReadRoof::kRoofPasses; ++r) {
    const auto start = std::chrono::steady_clock::now();
    team.run(pass);
    const auto stop = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(stop - start).count());
  }
  benchmark::DoNotOptimize(sinks.data());
  return static_cast<double>(buffer.slice_bytes() * threads) / best;
}

}  // namespace

// --- Host -----------------------------------------------------------------------------------

const CacheSizes& cache_sizes() {
  static const CacheSizes sizes = [] {
    CacheSizes s{32 * kKiB, 1 * kMiB, 0};
    if (cpuinfo_initialize()) {
      if (cpuinfo_get_l1d_caches_count() > 0) s.l1d = cpuinfo_get_l1d_cache(0)->size;
      if (cpuinfo_get_l2_caches_count() > 0) s.l2 = cpuinfo_get_l2_cache(0)->size;
      if (cpuinfo_get_l3_caches_count() > 0) s.llc = cpuinfo_get_l3_cache(0)->size;
    }
    if (s.llc == 0) s.llc = s.l2;
    return s;
  }();
  return sizes;
}

size_t hardware_threads() {
  static const size_t count = [] {
    size_t n = cpuinfo_initialize() ? cpuinfo_get_processors_count() : 0;
    if (n == 0) n = std::max(1u, std::thread::hardware_concurrency());
    return n;
  }();
  return count;
}

std::vector<size_t> one_and_all_threads() {
  const size_t all = hardware_threads();
  return all > 1 ? std::vector<size_t>{1, all} : std::vector<size_t>{1};
}

std::vector<Isa> bench_tiers() {
  std::vector<Isa> tiers;
  for (uint32_t i = 0; i < built_tier_count(); ++i) tiers.push_back(built_tier_at(i));
  return tiers;
}

const char* gemm_kernel_name(const qmoe_context* context, qmoe_weight_format format,
                             uint32_t block_size, qmoe_accuracy accuracy) {
  const char* name = nullptr;
  int available = 0;
  qmoe_gemm_kernel_available(context, format, block_size, accuracy, &available, &name);
  return name != nullptr ? name : "?";
}

const char* int4_gemm_kernel_name(const qmoe_context* context, qmoe_accuracy accuracy) {
  return gemm_kernel_name(context, QMOE_WEIGHT_FORMAT_INT4, 32, accuracy);
}

const KernelTable* table_or_skip(benchmark::State& state, Isa isa) {
  const KernelTable* table = kernel_table_for_isa(isa);
  if (table == nullptr) {
    const char* reason = isa_unavailable_reason(isa);
    const std::string message =
        std::string(isa_name(isa)) + " unavailable: " + (reason != nullptr ? reason : "unknown");
    state.SkipWithError(message.c_str());
  }
  return table;
}

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text),
                bytes == static_cast<double>(static_cast<long long>(bytes)) ? "%.0f %s" : "%.1f %s",
                bytes, kUnits[unit]);
  return text;
}

// --- Memory ---------------------------------------------------------------------------------

AlignedBuffer::AlignedBuffer(size_t bytes) {
  void* memory = nullptr;
  if (qmoe_alloc_weight_memory(std::max<size_t>(bytes, 1), &memory) != QMOE_STATUS_OK) {
    std::fprintf(stderr, "qmoe_bench: %s\n", qmoe_last_error_message());
    std::abort();
  }
  data_ = static_cast<unsigned char*>(memory);
  size_ = bytes;
}

AlignedBuffer::~AlignedBuffer() {
  qmoe_free_weight_memory(data_);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    qmoe_free_weight_memory(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SlicedBuffer::SlicedBuffer(ThreadTeam& team, size_t slice_bytes)
    : slice_bytes_((std::max<size_t>(slice_bytes, 1) + 63) / 64 * 64),
      buffer_(slice_bytes_ * team.size()) {
  // Written, not just allocated: never-written anonymous pages all map the shared zero page,
  // and reading them would measure the cache, not memory.
  auto touch = [this](size_t member) {
    std::memset(slice(member), static_cast<int>(member * 37 + 1), slice_bytes_);
  };
  team.run(touch);
}

// --- Threads --------------------------------------------------------------------------------

ThreadTeam::ThreadTeam(size_t size) : size_(std::max<size_t>(size, 1)) {
#if defined(__linux__)
  cpu_set_t saved;
  CPU_ZERO(&saved);
  if (pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) == 0) {
    saved_affinity_.assign(reinterpret_cast<const unsigned char*>(&saved),
                           reinterpret_cast<const unsigned char*>(&saved) + sizeof(saved));
    restore_affinity_ = pin_current_thread(0);
  }
#endif
  workers_.reserve(size_ - 1);
  for (size_t member = 1; member < size_; ++member) {
    workers_.emplace_back(&ThreadTeam::worker_main, this, member);
  }
}

ThreadTeam::~ThreadTeam() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
#if defined(__linux__)
  if (restore_affinity_) {
    cpu_set_t saved;
    std::memcpy(&saved, saved_affinity_.data(), sizeof(saved));
    pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  }
#endif
}

void ThreadTeam::run_erased(Task task, void* state) {
  if (size_ == 1) {
    task(state, 0);
    return;
  }
  task_ = task;
  task_state_ = state;
  pending_.store(size_ - 1, std::memory_order_relaxed);
  {
    // Under the mutex so that a worker checking the generation before sleeping cannot miss it.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();  // no syscall while every worker is still spinning
  task(state, 0);
  while (pending_.load(std::memory_order_acquire) != 0) cpu_relax();
}

void ThreadTeam::worker_main(size_t member) {
  pin_current_thread(member);
  uint64_t seen = 0;
  for (;;) {
    uint64_t generation = generation_.load(std::memory_order_acquire);
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    for (uint32_t i = 1; generation == seen; ++i) {
      cpu_relax();
      generation = generation_.load(std::memory_order_acquire);
      if (generation == seen && i % 64 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] {
          generation = generation_.load(std::memory_order_acquire);
          return generation != seen;
        });
      }
    }
    seen = generation;
    if (stop_) return;  // written before the bump this thread acquired
    task_(task_state_, member);
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

std::string ThreadTeam::pinning_description(size_t size) {
  const std::vector<int>& cpus = pin_order();
  if (cpus.empty()) return "not pinned (no affinity control)";
  std::string text = "members 0.." + std::to_string(size - 1) + " on CPUs ";
  for (size_t member = 0; member < size; ++member) {
    if (member != 0) text += ",";
    text += std::to_string(cpus[member % cpus.size()]);
  }
  return text;
}

// --- Data ---------------------------------------------------------------------------------

void fill_random_bytes(void* dst, size_t bytes, uint64_t& seed) {
  auto* out = static_cast<unsigned char*>(dst);
  for (size_t b = 0; b < bytes; b += 8) {
    const uint64_t r = splitmix64(seed);
    std::memcpy(out + b, &r, std::min<size_t>(8, bytes - b));
  }
}

void fill_weight_scales_f16(uint16_t* dst, size_t count, uint64_t& seed) {
  for (size_t e = 0; e < count; ++e) {
    const uint64_t r = splitmix64(seed);
    const uint32_t exponent = 7 + static_cast<uint32_t>((r >> 16) % 4);  // 2^-8 .. 2^-5
    dst[e] = static_cast<uint16_t>(((r & 1) << 15) | (exponent << 10) | ((r >> 1) & 0x3FF));
  }
}

size_t llc_total_bytes() {
  size_t instances = 1;
  if (cpuinfo_initialize() && cpuinfo_get_l3_caches_count() > 0) {
    instances = cpuinfo_get_l3_caches_count();
  }
  return cache_sizes().llc * instances;
}

// --- Contexts -------------------------------------------------------------------------------

bool use_team_pool() {
  const char* value = std::getenv("QMOE_BENCH_GEMM_POOL");
  return value != nullptr && std::strcmp(value, "team") == 0;
}

// --- Timing and counters --------------------------------------------------------------------

void report_bandwidth(benchmark::State& state, double bytes_per_iteration, double total_seconds,
                      size_t threads, bool versus_read_roof) {
  const double bytes = bytes_per_iteration * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  if (total_seconds <= 0.0) return;
  const double rate = bytes / total_seconds;
  state.counters["GB/s"] = rate / 1e9;
  if (versus_read_roof) {
    const double roof = read_roof().bytes_per_second(threads);
    if (roof > 0.0) state.counters["frac_of_read_bw"] = rate / roof;
  }
}

void PairedRead::read(qmoe_context* context, const void* data, size_t size, bool all_threads) {
  double bytes_per_second = 0.0;
  const qmoe_status s = qmoe_measure_read_bandwidth_over(context, data, size, 1,
                                                         all_threads ? 1 : 0, &bytes_per_second);
  if (s != QMOE_STATUS_OK || !(bytes_per_second > 0.0)) {
    if (failed == QMOE_STATUS_OK) failed = s != QMOE_STATUS_OK ? s : QMOE_STATUS_INTERNAL_ERROR;
    return;
  }
  bytes += static_cast<double>(size);
  seconds += static_cast<double>(size) / bytes_per_second;
}

void PairedRead::report(benchmark::State& state, double call_bytes, double call_seconds) const {
  if (seconds <= 0.0 || call_seconds <= 0.0) return;
  const double rate = bytes / seconds;
  state.counters["paired_read_GB/s"] = rate / 1e9;
  state.counters["frac_of_paired_read"] = call_bytes / call_seconds / rate;
}

// --- The read roof --------------------------------------------------------------------------

double ReadRoof::bytes_per_second(size_t thread_count) const {
  if (thread_count == 1) return one_thread_bytes_per_s;
  if (thread_count == threads) return all_threads_bytes_per_s;
  return 0.0;
}

const ReadRoof& read_roof() {
  static const ReadRoof roof = [] {
    ReadRoof r{};
    r.isa = best_supported_isa();
    r.threads = hardware_threads();
    // 8x the whole host's LLC (every instance: on a host with several L3s one instance's
    // size would leave the all-thread roof partly cache-resident).
    r.buffer_bytes =
        std::max(8 * llc_total_bytes(), 256 * kMiB) / (64 * r.threads) * (64 * r.threads);
    const ReadBandwidthFn read = kernel_table_for_isa(r.isa)->read_bandwidth.fn;
    r.one_thread_bytes_per_s = measure_read_bandwidth(read, 1, r.buffer_bytes);
    r.all_threads_bytes_per_s = measure_read_bandwidth(read, r.threads, r.buffer_bytes);
    return r;
  }();
  return roof;
}

void add_benchmark_context(bool measure_roof) {
  const CacheSizes& caches = cache_sizes();
  benchmark::AddCustomContext(
      "qmoe_caches", "L1d " + format_bytes(caches.l1d) + ", L2 " + format_bytes(caches.l2) +
                         ", LLC " + format_bytes(caches.llc) + " (cpuinfo, per instance)");
  benchmark::AddCustomContext("qmoe_hardware_threads", std::to_string(hardware_threads()));
  benchmark::AddCustomContext("qmoe_best_isa", isa_name(best_supported_isa()));
  benchmark::AddCustomContext("qmoe_thread_pinning",
                              ThreadTeam::pinning_description(hardware_threads()));
  benchmark::AddCustomContext("qmoe_transparent_hugepage",
                              read_first_line("/sys/kernel/mm/transparent_hugepage/enabled"));
  if (!measure_roof) return;
  const ReadRoof& roof = read_roof();
  benchmark::AddCustomContext("qmoe_read_roof_1_thread_GB/s",
                              format_gbps(roof.one_thread_bytes_per_s));
  benchmark::AddCustomContext("qmoe_read_roof_all_threads_GB/s",
                              format_gbps(roof.all_threads_bytes_per_s));
  benchmark::AddCustomContext(
      "qmoe_read_roof_method",
      std::string(isa_name(roof.isa)) + " read kernel, " + format_bytes(roof.buffer_bytes) +
          " buffer, 1 and " + std::to_string(roof.threads) + " threads, best of " +
          std::to_string(ReadRoof::kRoofPasses) + " passes, measured at startup");
}

// --- Registration ---------------------------------------------------------------------------

bool add_registrar(int order, Registrar registrar) {
  registrars().emplace_back(order, registrar);
  return true;
}

void run_registrars() {
  std::vector<std::pair<int, Registrar>> list = registrars();
  std::stable_sort(list.begin(), list.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& entry : list) entry.second();
}

}  // namespace qmoe::bench
