// qmoe_gemm_timeline: where the time of one all-thread qmoe_gemm call on cold weights goes.
//
// qmoe_bench's threads:all rows give one figure per call; this tool splits it. Each round runs
// `calls` fast-level M = 1 calls on cold weights (each call the next of enough distinct
// matrices to fill --pool-mib) three ways, through the public ABI only:
//   pool   the context's own thread pool (pthreadpool), as qmoe_bench runs it: call time only;
//   team   a context whose parallel_for is this tool's team of spinning threads, which stamps
//          when each member starts and ends its share of the call's tasks: the start (from the
//          call's entry to the last member's first task, so argument checks, the activation
//          quantization and the hand-off), each member's busy span, and the tail (from the
//          last member's end to the call's return);
//   read   the same team reading the next matrix's slot (its bytes and the padding to the next
//          page) with qmoe_measure_read_bandwidth_over, no arithmetic: what the call pattern
//          itself leaves of the roof.
// Each time is the median over the round's calls, with its ratio to the ideal time, bytes over
// the all-thread roof that qmoe_measure_read_bandwidth measures over --pool-mib (default 1 GiB)
// at the start of the round.
//
// Team schedules (--schedule), over the R tasks of a call and T members: `static` splits them
// as pthreadpool first does (member t gets R / T tasks in one run, one more if t < R % T);
// pthreadpool then steals single tasks from the ends of other members' runs. `steal` starts
// the same way, and a member that runs out takes the upper half of the largest remaining run,
// so that a stolen share is still one forward stream. `counter` hands out one task at a time
// from a shared counter. Comparing them tells whether the members' busy spans differ because
// of the split or because some members read more slowly than others;
// docs/results/2026-11-30-int4-gemm-limits.md has the figures.
//
// The matrices live in qmoe_alloc_weight_memory's memory (huge pages where the OS gives them),
// as a runtime's expert weights should.
//
//   qmoe_gemm_timeline [--n N] [--k K] [--threads T] [--calls C] [--rounds R]
//                      [--schedule static|steal|counter] [--pool-mib P]
//   defaults: N 1536, K 2048 (Qwen3 FC1), T 0 (one per core), C 300, R 3, static, P 1024
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "qmoe/qmoe.h"
#include "qmoe/qmoe_experimental.h"

namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

enum class Schedule { kStatic, kSteal, kCounter };

const char* schedule_name(Schedule s) {
  return s == Schedule::kStatic ? "static" : s == Schedule::kSteal ? "steal" : "counter";
}

// A team of `size` members (member 0 is the calling thread) that spin between runs, so a run
// costs no futex wake-up, and stamp each member's first and last moment of every run.
class TimedTeam {
 public:
  TimedTeam(uint32_t size, Schedule schedule) : size_(size), schedule_(schedule), members_(size) {
    for (uint32_t m = 1; m < size; ++m) workers_.emplace_back([this, m] { worker(m); });
  }
  ~TimedTeam() {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    for (std::thread& w : workers_) w.join();
  }
  TimedTeam(const TimedTeam&) = delete;
  TimedTeam& operator=(const TimedTeam&) = delete;

  // qmoe_parallel_for_fn.
  static void parallel_for(void* team, qmoe_parallel_task_fn task, void* state, size_t range) {
    static_cast<TimedTeam*>(team)->run(task, state, range);
  }

  uint64_t runs() const { return runs_; }
  uint64_t first(uint32_t m) const { return members_[m].first; }
  uint64_t last(uint32_t m) const { return members_[m].last; }

 private:
  // One cache line per member, so that claiming a task or stamping a time does not move
  // another member's line (pthreadpool pads its per-thread state the same way).
  struct alignas(64) Member {
    std::atomic<uint64_t> range{0};  // [begin, end) of task indices, packed begin | end << 32
    uint64_t first = 0, last = 0;    // written by the member only, read after the run
  };

  void run(qmoe_parallel_task_fn task, void* state, size_t range) {
    ++runs_;
    if (range > UINT32_MAX) {  // beyond the packed ranges: run it here, as the ABI requires
      for (size_t i = 0; i < range; ++i) task(state, i);
      return;
    }
    task_ = task;
    state_ = state;
    range_ = range;
    next_.store(0, std::memory_order_relaxed);
    // pthreadpool's first split: member t gets range / size tasks, one more if t < range % size.
    const size_t quotient = range / size_, remainder = range % size_;
    for (uint32_t m = 0; m < size_; ++m) {
      const size_t begin = m * quotient + std::min<size_t>(m, remainder);
      const size_t end = begin + quotient + (m < remainder ? 1 : 0);
      members_[m].range.store(pack(begin, end), std::memory_order_relaxed);
    }
    pending_.store(size_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);  // publishes the run's state
    work(0);
    while (pending_.load(std::memory_order_acquire) != 0) spin_pause();
  }

  void worker(uint32_t m) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) spin_pause();
      seen = g;
      if (stop_.load(std::memory_order_relaxed)) return;
      work(m);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  static uint64_t pack(uint64_t begin, uint64_t end) { return begin | end << 32; }
  static uint32_t begin_of(uint64_t r) { return static_cast<uint32_t>(r); }
  static uint32_t end_of(uint64_t r) { return static_cast<uint32_t>(r >> 32); }

  void work(uint32_t m) {
    Member& me = members_[m];
    me.first = now_ns();
    if (schedule_ == Schedule::kCounter) {
      for (size_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < range_;) {
        task_(state_, i);
      }
    } else {
      for (;;) {
        uint64_t r = me.range.load(std::memory_order_acquire);
        // Own range first, from the front (thieves cut its end).
        if (begin_of(r) < end_of(r)) {
          if (me.range.compare_exchange_weak(r, r + 1, std::memory_order_acq_rel)) {
            task_(state_, begin_of(r));
          }
          continue;
        }
        if (schedule_ != Schedule::kSteal) break;
        uint32_t stolen = 0;
        if (!steal_half(m, &stolen)) break;
        task_(state_, stolen);
      }
    }
    me.last = now_ns();
  }

  // Cuts the upper half of the largest remaining range (all of it when one task is left) from
  // its owner, returns its first task in *first and makes the rest member m's own range; false
  // when no range has work left. Member m runs the first task itself, so a stolen task cannot be
  // stolen back before anyone runs it.
  bool steal_half(uint32_t m, uint32_t* first) {
    for (;;) {
      uint32_t victim = size_, most = 0;
      for (uint32_t v = 0; v < size_; ++v) {
        const uint64_t r = members_[v].range.load(std::memory_order_relaxed);
        if (end_of(r) > begin_of(r) && end_of(r) - begin_of(r) > most) {
          most = end_of(r) - begin_of(r);
          victim = v;
        }
      }
      if (victim == size_) return false;
      uint64_t r = members_[victim].range.load(std::memory_order_acquire);
      const uint32_t begin = begin_of(r), end = end_of(r);
      if (begin >= end) continue;
      const uint32_t cut = end - begin == 1 ? begin : begin + (end - begin + 1) / 2;
      if (!members_[victim].range.compare_exchange_strong(r, pack(begin, cut),
                                                          std::memory_order_acq_rel)) {
        continue;
      }
      // Member m's own range is empty, so no thief touches it until this store.
      members_[m].range.store(pack(cut + 1, end), std::memory_order_release);
      *first = cut;
      return true;
    }
  }

  const uint32_t size_;
  const Schedule schedule_;
  std::vector<std::thread> workers_;
  std::vector<Member> members_;
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<uint32_t> pending_{0};
  alignas(64) std::atomic<size_t> next_{0};  // the counter schedule's next task
  std::atomic<bool> stop_{false};
  qmoe_parallel_task_fn task_ = nullptr;
  void* state_ = nullptr;
  size_t range_ = 0;
  uint64_t runs_ = 0;  // runs so far (the calling thread only)
};

struct Options {
  uint32_t n = 1536, k = 2048, threads = 0, calls = 300, rounds = 3;
  Schedule schedule = Schedule::kStatic;
  size_t pool_mib = 1024;
};

bool parse_u32(const char* text, uint32_t max, uint32_t* out) {
  if (text[0] < '0' || text[0] > '9') return false;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (*end != '\0' || v > max) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

int usage(FILE* out, const char* why) {
  if (why != nullptr) std::fprintf(out, "qmoe_gemm_timeline: %s\n", why);
  std::fprintf(out,
               "usage: qmoe_gemm_timeline [--n N] [--k K] [--threads T] [--calls C] [--rounds R]\n"
               "                          [--schedule static|steal|counter] [--pool-mib P]\n"
               "defaults: N 1536, K 2048 (a multiple of 32), T 0 (one per core, at most %u),\n"
               "          C 300, R 3, static, P 1024 (MiB of cold matrices, at most 1048576)\n",
               QMOE_MAX_THREADS);
  return why != nullptr ? 2 : 0;
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return false;
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    uint32_t v = 0;
    if (flag == "--schedule") {
      if (std::strcmp(value, "static") == 0) {
        o->schedule = Schedule::kStatic;
      } else if (std::strcmp(value, "steal") == 0) {
        o->schedule = Schedule::kSteal;
      } else if (std::strcmp(value, "counter") == 0) {
        o->schedule = Schedule::kCounter;
      } else {
        return false;
      }
      continue;
    }
    if (!parse_u32(value, 1u << 20, &v)) return false;
    if (flag == "--n" && v > 0) {
      o->n = v;
    } else if (flag == "--k" && v > 0 && v % 32 == 0) {
      o->k = v;
    } else if (flag == "--threads" && v <= QMOE_MAX_THREADS) {
      o->threads = v;
    } else if (flag == "--calls" && v > 0) {
      o->calls = v;
    } else if (flag == "--rounds" && v > 0) {
      o->rounds = v;
    } else if (flag == "--pool-mib" && v > 0) {
      o->pool_mib = v;
    } else {
      return false;
    }
  }
  return true;
}

// R matrices of one shape, each in its own page-aligned slot (codes, then FP16 scales in the
// grouped order), R x slot >= the pool size, so consecutive calls read from DRAM.
class ColdMatrices {
 public:
  // memory() is null when the allocation failed.
  ColdMatrices(uint32_t n, uint32_t k, size_t pool_bytes) : n_(n), k_(k) {
    qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, n, k, &code_bytes_);
    scale_count_ = qmoe_grouped_plane_elements(n, k / 32);
    slot_ = (code_bytes_ + scale_count_ * sizeof(uint16_t) + 4095) / 4096 * 4096;
    count_ = std::max<size_t>(2, pool_bytes / slot_);
    void* memory = nullptr;
    if (qmoe_alloc_weight_memory(count_ * slot_, &memory) != QMOE_STATUS_OK) return;
    base_ = static_cast<unsigned char*>(memory);
    for (size_t i = 0; i < count_ * slot_; ++i) {
      base_[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
    }
    for (size_t r = 0; r < count_; ++r) {
      auto* scales = reinterpret_cast<uint16_t*>(base_ + r * slot_ + code_bytes_);
      for (size_t i = 0; i < scale_count_; ++i) scales[i] = static_cast<uint16_t>(0x2000 + i % 97);
    }
  }
  ~ColdMatrices() { qmoe_free_weight_memory(base_); }
  ColdMatrices(const ColdMatrices&) = delete;
  ColdMatrices& operator=(const ColdMatrices&) = delete;

  const void* memory() const { return base_; }
  size_t bytes() const { return code_bytes_ + scale_count_ * sizeof(uint16_t); }
  size_t slot_bytes() const { return slot_; }
  const unsigned char* slot(size_t r) const { return base_ + (r % count_) * slot_; }

  qmoe_quant_matrix matrix(size_t r) const {
    qmoe_quant_matrix w;
    std::memset(&w, 0, sizeof w);
    w.struct_size = sizeof w;
    w.format = QMOE_WEIGHT_FORMAT_INT4;
    w.n = n_;
    w.k = k_;
    w.block_size = 32;
    w.codes = slot(r);
    w.scale_dtype = QMOE_DTYPE_F16;
    w.scales = slot(r) + code_bytes_;
    w.scale_row_stride = 1;  // grouped order: (1, 8, 8 * K/32)
    w.scale_block_stride = 8;
    w.scale_group_stride = size_t{8} * (k_ / 32);
    return w;
  }

 private:
  uint32_t n_, k_;
  size_t code_bytes_ = 0, scale_count_ = 0, slot_ = 0, count_ = 0;
  unsigned char* base_ = nullptr;
};

constexpr uint32_t kWarmupCalls = 3;  // untimed: thread start-up, the library's scratch

bool check(qmoe_status s, const char* what) {
  if (s == QMOE_STATUS_OK) return true;
  std::fprintf(stderr, "qmoe_gemm_timeline: %s: %s\n", what, qmoe_last_error_message());
  return false;
}

int run(const Options& o);

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    return usage(stdout, nullptr);
  }
  Options o;
  if (!parse(argc, argv, &o)) return usage(stderr, "bad option");
  try {
    return run(o);
  } catch (const std::exception& e) {  // bad_alloc, or system_error from starting a thread
    std::fprintf(stderr, "qmoe_gemm_timeline: %s\n", e.what());
    return 1;
  }
}

namespace {

// Owns a context.
using ContextPtr = std::unique_ptr<qmoe_context, decltype(&qmoe_context_destroy)>;

ContextPtr make_context(const qmoe_context_options& options) {
  qmoe_context* context = nullptr;
  if (!check(qmoe_context_create(&options, &context), "qmoe_context_create")) context = nullptr;
  return ContextPtr(context, &qmoe_context_destroy);
}

int run(const Options& o) {
  ColdMatrices pool(o.n, o.k, o.pool_mib << 20);
  if (pool.memory() == nullptr) {
    std::fprintf(stderr, "qmoe_gemm_timeline: %s (--pool-mib %zu)\n", qmoe_last_error_message(),
                 o.pool_mib);
    return 1;
  }
  std::vector<float> x(o.k), y(o.n);
  for (uint32_t i = 0; i < o.k; ++i) {
    x[i] = static_cast<float>(static_cast<int>(i * 7919 % 201) - 100) / 37.0f;
  }
  const double bytes = static_cast<double>(pool.bytes());
  size_t next = 0;

  for (uint32_t round = 0; round < o.rounds; ++round) {
    std::vector<double> pool_us, team_us, start_us, busy_min, busy_max, tail_us, read_us;
    double roof = 0.0;
    uint32_t threads = 0;
    qmoe_context_options options;
    qmoe_context_options_init(&options);
    options.num_threads = o.threads;
    {
      // 1. The context's own pool, gone before the team starts (they never spin at once).
      const ContextPtr own = make_context(options);
      if (own == nullptr) return 1;
      qmoe_context_get_num_threads(own.get(), &threads);
      if (!check(qmoe_measure_read_bandwidth(own.get(), o.pool_mib << 20, 3, 1, &roof),
                 "qmoe_measure_read_bandwidth")) {
        return 1;
      }
      for (uint32_t c = 0; c < kWarmupCalls + o.calls; ++c) {
        const qmoe_quant_matrix w = pool.matrix(next++);
        const uint64_t t0 = now_ns();
        const qmoe_status s =
            qmoe_gemm(own.get(), &w, QMOE_ACCURACY_FAST, 1, x.data(), o.k, y.data(), o.n, 0, o.n);
        if (c >= kWarmupCalls) pool_us.push_back(static_cast<double>(now_ns() - t0) / 1e3);
        if (!check(s, "qmoe_gemm")) return 1;
      }
    }
    std::vector<std::vector<double>> busy(threads);
    uint32_t inline_calls = 0;
    {
      // 2. The timed team, 3. the pure read on it.
      TimedTeam team(threads, o.schedule);
      options.num_threads = threads;
      options.parallel_for = &TimedTeam::parallel_for;
      options.parallel_for_state = &team;
      const ContextPtr timed = make_context(options);
      if (timed == nullptr) return 1;
      for (uint32_t c = 0; c < kWarmupCalls + o.calls; ++c) {
        const qmoe_quant_matrix w = pool.matrix(next++);
        const uint64_t runs = team.runs();
        const uint64_t t0 = now_ns();
        const qmoe_status s =
            qmoe_gemm(timed.get(), &w, QMOE_ACCURACY_FAST, 1, x.data(), o.k, y.data(), o.n, 0, o.n);
        const uint64_t t1 = now_ns();
        if (!check(s, "qmoe_gemm")) return 1;
        const bool split = team.runs() != runs;  // else too small: it ran on the calling thread
        if (c >= kWarmupCalls && split) {
          // Read before the read below reuses the team's stamps.
          uint64_t last_start = 0, last_end = 0;
          double lo = 1e300, hi = 0.0;
          for (uint32_t m = 0; m < threads; ++m) {
            last_start = std::max(last_start, team.first(m));
            last_end = std::max(last_end, team.last(m));
            const double b = static_cast<double>(team.last(m) - team.first(m)) / 1e3;
            busy[m].push_back(b);
            lo = std::min(lo, b);
            hi = std::max(hi, b);
          }
          start_us.push_back(static_cast<double>(last_start - t0) / 1e3);
          tail_us.push_back(static_cast<double>(t1 - last_end) / 1e3);
          busy_min.push_back(lo);
          busy_max.push_back(hi);
        }
        double unused = 0.0;
        const uint64_t r0 = now_ns();
        if (!check(qmoe_measure_read_bandwidth_over(timed.get(), pool.slot(next++),
                                                    pool.slot_bytes(), 1, 1, &unused),
                   "qmoe_measure_read_bandwidth_over")) {
          return 1;
        }
        const uint64_t r1 = now_ns();
        if (c < kWarmupCalls) continue;
        team_us.push_back(static_cast<double>(t1 - t0) / 1e3);
        read_us.push_back(static_cast<double>(r1 - r0) / 1e3);
        inline_calls += split ? 0 : 1;
      }
    }

    const double ideal = bytes / roof * 1e6;
    std::printf(
        "n %u k %u threads %u %s round %u: roof %.1f GB/s, ideal %.1f us | pool %.1f us "
        "(%.2f) | team %.1f us (%.2f)",
        o.n, o.k, threads, schedule_name(o.schedule), round, roof / 1e9, ideal, median(pool_us),
        ideal / median(pool_us), median(team_us), ideal / median(team_us));
    if (!start_us.empty()) {
      std::printf(": start %.1f, busy %.1f-%.1f, tail %.1f", median(start_us), median(busy_min),
                  median(busy_max), median(tail_us));
    }
    std::printf(" | read on team %.1f us (%.2f)\n", median(read_us), ideal / median(read_us));
    std::printf("  busy per member (median us):");
    for (uint32_t m = 0; m < threads; ++m) std::printf(" %.1f", median(busy[m]));
    if (inline_calls > 0) {
      std::printf(
          " (start, busy and tail leave out %u of the %u calls, which ran on the calling "
          "thread alone)",
          inline_calls, o.calls);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
