// The INT4 dequant-GEMM through the public ABI (qmoe_gemm on a qmoe_context), on the expert
// shapes libqmoe is built for. INT4 codes in the canonical layout, FP16 scales (block 32) in
// the grouped order docs/formats.md recommends (per 8-row group, K/32 x 8 scales in a row),
// no zero points (the default 8), no bias.
//
//   gemm_int4/<shape>/<isa>/<exact|fast>/m:<M>/<cold|warm>/threads:<1|all>
//
//   shape    qwen3_fc1  N=1536 K=2048  Qwen3-30B-A3B expert FC1 (gate and up, fused)
//            qwen3_fc2  N=2048 K=768   Qwen3-30B-A3B expert FC2 (down)
//            gptoss     N=2880 K=2880  gpt-oss-20b-like expert projection
//            qwen3_fc1_kn_scales  qwen3_fc1 with scales in plain [K/32, N] order (M 1 and 4
//                       only): what the grouped order gains (each block of a group's scales
//                       is then on a different cache line, 2 N bytes from the last)
//   isa      the context's max_isa (scalar, avx2, avx512); a tier the host lacks is skipped
//            with the reason. The scalar tier runs m:1 only (it is the reference; a full
//            scalar sweep would take minutes).
//   M        1, 2, 4, 8, 32 activation rows (tokens routed to the expert).
//   cold     every call uses the next of R distinct matrices, R x (codes + scales) >= 4 x the
//            last-level cache (all instances), so each call streams its weights from DRAM:
//            the cold-expert case.
//   warm     one matrix, called again and again (cache-resident when it fits).
//   threads  the context's own thread count: 1, or all hardware threads (the two counts the
//            read roof is measured for).
//
// One iteration is one qmoe_gemm call, timed alone (argument checks, activation quantization
// and the thread hand-off included). Counters:
//   us_per_call      mean time per call
//   GB/s             weight bytes (codes + scales) per call over time, 1e9 bytes/s
//   frac_of_read_bw  GB/s over the DRAM read roof of the same thread count, measured at
//                    startup; for cold rows the fraction of the memory-bound floor reached
//   Gmac_per_s       M x N x K multiply-adds per second (for compute-bound rows, large M)
//
// Threads: by default the context runs on libqmoe's own pool (pthreadpool, unpinned), as a
// runtime that does not pass a parallel_for would. QMOE_BENCH_GEMM_POOL=team instead passes a
// parallel_for that runs on qmoe_bench's pinned ThreadTeam (bench_util.h); the context line
// qmoe_gemm_int4_pool says which one ran. docs/results/2026-11-30-dev-host-method-notes.md
// compares the two.
#include <cpuinfo.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"
#include "qmoe/qmoe.h"
#include "qmoe/qmoe_experimental.h"

namespace qmoe::bench {
namespace {

struct Shape {
  const char* name;
  uint32_t n;  // a multiple of 8
  uint32_t k;
  bool grouped_scales;  // else [K/32, N]
};

constexpr Shape kShapes[] = {
    {"qwen3_fc1", 1536, 2048, true},
    {"qwen3_fc2", 2048, 768, true},
    {"gptoss", 2880, 2880, true},
    {"qwen3_fc1_kn_scales", 1536, 2048, false},
};
constexpr uint32_t kBlockSize = 32;
constexpr uint32_t kBatchSizes[] = {1, 2, 4, 8, 32};
constexpr size_t kPageBytes = 4096;

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The weights of one shape: R cold matrices plus one warm matrix, each a page-aligned slot of
// canonical codes followed by its FP16 scale plane (the grouped order, or [K/32, N] for the
// shapes that ask for it). Random codes (every nibble
// 0..15) and scales of weight-like magnitude (2^-8 .. 2^-5, random sign). Kept for the
// consecutive benchmarks of one shape; the next shape's pool replaces it.
class WeightPool {
 public:
  static WeightPool& for_shape(const Shape& shape) {
    static std::unique_ptr<WeightPool> current;
    if (current == nullptr || current->shape_name_ != shape.name) {
      current.reset();  // free the previous shape's buffer before allocating the next
      current.reset(new WeightPool(shape));
    }
    return *current;
  }

  const qmoe_quant_matrix& warm() const { return matrices_.back(); }
  // The next cold matrix; the cursor persists across benchmarks of the shape, so a matrix is
  // reused only after the other R - 1 were read.
  const qmoe_quant_matrix& next_cold() {
    const qmoe_quant_matrix& w = matrices_[cursor_];
    cursor_ = cursor_ + 1 == cold_count_ ? 0 : cursor_ + 1;
    return w;
  }
  size_t cold_count() const { return cold_count_; }
  size_t codes_bytes() const { return codes_bytes_; }
  size_t scale_bytes() const { return scale_bytes_; }
  size_t bytes_per_call() const { return codes_bytes_ + scale_bytes_; }

 private:
  explicit WeightPool(const Shape& shape) : shape_name_(shape.name) {
    qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, shape.n, shape.k, &codes_bytes_);
    const size_t blocks = shape.k / kBlockSize;
    scale_bytes_ = size_t{shape.n} * blocks * sizeof(uint16_t);
    const size_t scale_offset = round_up(codes_bytes_, kPageBytes);
    const size_t slot_bytes = scale_offset + round_up(scale_bytes_, kPageBytes);
    cold_count_ =
        std::max<size_t>(2, (4 * llc_total_bytes() + bytes_per_call() - 1) / bytes_per_call());
    const size_t count = cold_count_ + 1;  // the last slot is the warm matrix
    buffer_ = AlignedBuffer(slot_bytes * count);

    uint64_t seed = 0x1A7E5EEDull ^ (uint64_t{shape.n} << 32) ^ shape.k;
    matrices_.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      unsigned char* slot = buffer_.data() + i * slot_bytes;
      fill_random_bytes(slot, codes_bytes_, seed);
      auto* scales = reinterpret_cast<uint16_t*>(slot + scale_offset);
      fill_weight_scales_f16(scales, size_t{shape.n} * blocks, seed);
      qmoe_quant_matrix w{};
      w.struct_size = sizeof(w);
      w.format = QMOE_WEIGHT_FORMAT_INT4;
      w.n = shape.n;
      w.k = shape.k;
      w.block_size = kBlockSize;
      w.codes = slot;
      w.scale_dtype = QMOE_DTYPE_F16;
      w.scales = scales;
      w.scale_row_stride = 1;
      if (shape.grouped_scales) {  // element (n, b) at (n / 8) * 8 K/32 + b * 8 + n % 8
        w.scale_block_stride = 8;
        w.scale_group_stride = 8 * blocks;
      } else {  // [K/32, N]: element (n, b) at b * N + n
        w.scale_block_stride = shape.n;
      }
      w.zero_points = nullptr;
      w.bias = nullptr;
      matrices_.push_back(w);
    }
  }

  std::string shape_name_;
  size_t codes_bytes_ = 0;
  size_t scale_bytes_ = 0;
  size_t cold_count_ = 0;
  size_t cursor_ = 0;
  AlignedBuffer buffer_;
  std::vector<qmoe_quant_matrix> matrices_;
};

struct Case {
  const Shape* shape;
  Isa isa;
  qmoe_accuracy accuracy;
  uint32_t m;
  bool cold;
  size_t threads;
};

void gemm_int4_benchmark(benchmark::State& state, const Case& c) {
  if (table_or_skip(state, c.isa) == nullptr) return;
  BenchContext context(c.isa, c.threads);
  if (!context.ok()) {
    state.SkipWithError(("qmoe_context_create failed: " + context.error()).c_str());
    return;
  }
  const char* kernel = int4_gemm_kernel_name(context.get(), c.accuracy);

  const uint32_t n = c.shape->n, k = c.shape->k;
  WeightPool& pool = WeightPool::for_shape(*c.shape);
  AlignedBuffer x_buffer(size_t{c.m} * k * sizeof(float));
  AlignedBuffer y_buffer(size_t{c.m} * n * sizeof(float));
  auto* x = reinterpret_cast<float*>(x_buffer.data());
  auto* y = reinterpret_cast<float*>(y_buffer.data());
  uint64_t seed = 0xAC71u + c.m;
  for (size_t i = 0; i < size_t{c.m} * k; ++i) {
    x[i] = static_cast<float>(static_cast<int64_t>(splitmix64(seed) >> 40) - (1 << 23)) /
           static_cast<float>(1 << 23);  // uniform in [-1, 1)
  }
  std::memset(y, 0, size_t{c.m} * n * sizeof(float));

  auto next = [&]() -> const qmoe_quant_matrix* {
    return c.cold ? &pool.next_cold() : &pool.warm();
  };
  // Warm-up: code, TLB, the library's scratch buffers, the pool's threads.
  for (int i = 0; i < 3; ++i) {
    const qmoe_status s = qmoe_gemm(context.get(), next(), c.accuracy, c.m, x, k, y, n, 0, n);
    if (s != QMOE_STATUS_OK) {
      state.SkipWithError((std::string("qmoe_gemm failed: ") + qmoe_last_error_message()).c_str());
      return;
    }
  }

  qmoe_status failed = QMOE_STATUS_OK;
  const qmoe_quant_matrix* w = nullptr;
  const double seconds = run_timed(
      state, [&] { w = next(); },
      [&] {
        const qmoe_status s = qmoe_gemm(context.get(), w, c.accuracy, c.m, x, k, y, n, 0, n);
        if (s != QMOE_STATUS_OK) failed = s;
      });
  benchmark::DoNotOptimize(y);
  if (failed != QMOE_STATUS_OK) {
    state.SkipWithError((std::string("qmoe_gemm failed: ") + qmoe_status_string(failed)).c_str());
    return;
  }

  const double bytes = static_cast<double>(pool.bytes_per_call());
  std::string label =
      "N=" + std::to_string(n) + " K=" + std::to_string(k) + ", " + format_bytes(bytes) + "/call, ";
  if (c.cold) {
    label += std::to_string(pool.cold_count()) + " matrices (" +
             format_bytes(bytes * static_cast<double>(pool.cold_count())) + ") rotated";
  } else {
    label += "1 matrix repeated";
  }
  state.SetLabel(label + ", " + kernel);
  report_bandwidth(state, bytes, seconds, c.threads, /*versus_read_roof=*/true);
  const double iterations = static_cast<double>(state.iterations());
  if (seconds > 0.0 && iterations > 0.0) {
    state.counters["us_per_call"] = seconds / iterations * 1e6;
    state.counters["Gmac_per_s"] = static_cast<double>(c.m) * n * k * iterations / seconds / 1e9;
  }
}

// The same cold rotation read by the tier's read kernel alone: one
// qmoe_measure_read_bandwidth_over call per matrix over its slot (codes, the padding to the
// next page, scales: at most 4 KiB more than the GEMM reads), through the same kind of context
// and pool, so one hand-off per matrix as for qmoe_gemm. What streaming these bytes one matrix
// per call costs without any arithmetic: a GEMM row's frac_of_read_bw over this row's is the
// kernel's efficiency against a pure read of the same pages in the same pattern, and this
// row's own is what the call pattern (matrix starts, the hand-off) leaves of the roof.
void read_only_benchmark(benchmark::State& state, const Shape* shape, Isa isa, size_t threads) {
  if (table_or_skip(state, isa) == nullptr) return;
  BenchContext context(isa, threads);
  if (!context.ok()) {
    state.SkipWithError(("qmoe_context_create failed: " + context.error()).c_str());
    return;
  }
  WeightPool& pool = WeightPool::for_shape(*shape);
  const int all = threads > 1;
  qmoe_status failed = QMOE_STATUS_OK;
  auto read = [&](const qmoe_quant_matrix& w) {
    const auto* first = static_cast<const unsigned char*>(w.codes);
    const auto* end = static_cast<const unsigned char*>(w.scales) + pool.scale_bytes();
    double unused = 0.0;
    const qmoe_status s = qmoe_measure_read_bandwidth_over(
        context.get(), first, static_cast<size_t>(end - first), 1, all, &unused);
    if (s != QMOE_STATUS_OK) failed = s;
  };
  for (int i = 0; i < 3; ++i) read(pool.next_cold());  // warm-up, as the GEMM rows do
  const qmoe_quant_matrix* w = nullptr;
  const double seconds = run_timed(
      state, [&] { w = &pool.next_cold(); }, [&] { read(*w); });
  if (failed != QMOE_STATUS_OK) {
    state.SkipWithError(
        (std::string("qmoe_measure_read_bandwidth_over failed: ") + qmoe_last_error_message())
            .c_str());
    return;
  }
  const double bytes = static_cast<double>(pool.bytes_per_call());
  state.SetLabel("N=" + std::to_string(shape->n) + " K=" + std::to_string(shape->k) + ", " +
                 format_bytes(bytes) + "/call, " + std::to_string(pool.cold_count()) +
                 " matrices rotated, read kernel only");
  report_bandwidth(state, bytes, seconds, threads, /*versus_read_roof=*/true);
  const double iterations = static_cast<double>(state.iterations());
  if (seconds > 0.0 && iterations > 0.0) state.counters["us_per_call"] = seconds / iterations * 1e6;
}

void register_gemm_int4_benchmarks() {
  benchmark::AddCustomContext("qmoe_gemm_int4_pool",
                              use_team_pool()
                                  ? "threads:all on qmoe_bench's pinned team via parallel_for "
                                    "(QMOE_BENCH_GEMM_POOL=team)"
                                  : "threads:all on the context's own pthreadpool (unpinned)");
  const std::vector<size_t> thread_counts = one_and_all_threads();
  for (const Shape& shape : kShapes) {
    for (Isa isa : bench_tiers()) {
      for (qmoe_accuracy accuracy : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        for (uint32_t m : kBatchSizes) {
          if (isa == Isa::kScalar && m != 1) continue;
          if (!shape.grouped_scales && m != 1 && m != 4) continue;
          for (bool cold : {true, false}) {
            for (size_t threads : thread_counts) {
              const Case c{&shape, isa, accuracy, m, cold, threads};
              const std::string name = std::string("gemm_int4/") + shape.name + "/" +
                                       isa_name(isa) + "/" + level_name(accuracy) +
                                       "/m:" + std::to_string(m) + "/" + (cold ? "cold" : "warm") +
                                       "/" + threads_name(threads);
              register_timed(name, [c](benchmark::State& state) { gemm_int4_benchmark(state, c); });
            }
          }
        }
      }
      if (isa == Isa::kScalar || !shape.grouped_scales) continue;
      for (size_t threads : thread_counts) {
        const std::string name = std::string("gemm_int4/") + shape.name + "/" + isa_name(isa) +
                                 "/read_only/cold/" + threads_name(threads);
        const Shape* sp = &shape;
        register_timed(name, [sp, isa, threads](benchmark::State& state) {
          read_only_benchmark(state, sp, isa, threads);
        });
      }
    }
  }
}

QMOE_BENCH_REGISTRAR(300, register_gemm_int4_benchmarks);

}  // namespace
}  // namespace qmoe::bench
