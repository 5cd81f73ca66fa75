#include "benchmarks/gemm/gemm_bench_common.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"
#include "qmoe/qmoe_experimental.h"

namespace qmoe::bench {
namespace {

constexpr uint32_t kBlockSize = 32;
constexpr size_t kPageBytes = 4096;

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The weights of one format and shape: R cold matrices plus one warm matrix, each a page-aligned
// slot of canonical codes followed by its FP16 scale plane. Random codes and scales of
// weight-like magnitude (2^-8 .. 2^-5, random sign). Kept for the consecutive benchmarks of one
// format and shape; the next one's pool replaces it.
class WeightPool {
 public:
  static WeightPool& get(qmoe_weight_format format, const GemmShape& shape) {
    static std::unique_ptr<WeightPool> current;
    if (current == nullptr || current->format_ != format || current->shape_name_ != shape.name) {
      current.reset();  // free the previous pool's buffer before allocating the next
      current.reset(new WeightPool(format, shape));
    }
    return *current;
  }

  const qmoe_quant_matrix& warm() const { return matrices_.back(); }
  // The next cold matrix; the cursor persists across benchmarks of the pool, so a matrix is
  // reused only after the other R - 1 were read.
  const qmoe_quant_matrix& next_cold() {
    const qmoe_quant_matrix& w = matrices_[cursor_];
    cursor_ = cursor_ + 1 == cold_count_ ? 0 : cursor_ + 1;
    return w;
  }
  size_t cold_count() const { return cold_count_; }
  size_t scale_bytes() const { return scale_bytes_; }
  size_t bytes_per_call() const { return codes_bytes_ + scale_bytes_; }

 private:
  WeightPool(qmoe_weight_format format, const GemmShape& shape)
      : format_(format), shape_name_(shape.name) {
    qmoe_quant_matrix_codes_size(format, shape.n, shape.k, &codes_bytes_);
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
      w.format = format;
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
      matrices_.push_back(w);
    }
  }

  qmoe_weight_format format_;
  std::string shape_name_;
  size_t codes_bytes_ = 0;
  size_t scale_bytes_ = 0;
  size_t cold_count_ = 0;
  size_t cursor_ = 0;
  AlignedBuffer buffer_;
  std::vector<qmoe_quant_matrix> matrices_;
};

struct Case {
  qmoe_weight_format format;
  const GemmShape* shape;
  Isa isa;
  qmoe_accuracy accuracy;
  uint32_t m;
  bool cold;
  size_t threads;
};

void gemm_benchmark(benchmark::State& state, const Case& c) {
  if (table_or_skip(state, c.isa) == nullptr) return;
  BenchContext context(c.isa, c.threads);
  if (!context.ok()) {
    state.SkipWithError(("qmoe_context_create failed: " + context.error()).c_str());
    return;
  }
  const char* kernel = gemm_kernel_name(context.get(), c.format, c.accuracy);

  const uint32_t n = c.shape->n, k = c.shape->k;
  WeightPool& pool = WeightPool::get(c.format, *c.shape);
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
// and pool, so one hand-off per matrix as for qmoe_gemm. A GEMM row's frac_of_read_bw over this
// row's is the kernel's efficiency against a pure read of the same pages in the same pattern.
void read_only_benchmark(benchmark::State& state, qmoe_weight_format format, const GemmShape* shape,
                         Isa isa, size_t threads) {
  if (table_or_skip(state, isa) == nullptr) return;
  BenchContext context(isa, threads);
  if (!context.ok()) {
    state.SkipWithError(("qmoe_context_create failed: " + context.error()).c_str());
    return;
  }
  WeightPool& pool = WeightPool::get(format, *shape);
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

}  // namespace

void register_gemm_bench_rows(const GemmBenchRows& rows) {
  const std::vector<size_t> thread_counts = one_and_all_threads();
  for (size_t s = 0; s < rows.shape_count; ++s) {
    const GemmShape& shape = rows.shapes[s];
    for (Isa isa : bench_tiers()) {
      for (qmoe_accuracy accuracy : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        for (size_t b = 0; b < rows.batch_size_count; ++b) {
          const uint32_t m = rows.batch_sizes[b];
          if (isa == Isa::kScalar && m != 1) continue;
          if (!shape.grouped_scales && m != 1 && m != 4) continue;
          for (bool cold : {true, false}) {
            for (size_t threads : thread_counts) {
              const Case c{rows.format, &shape, isa, accuracy, m, cold, threads};
              const std::string name = std::string(rows.prefix) + "/" + shape.name + "/" +
                                       isa_name(isa) + "/" + level_name(accuracy) +
                                       "/m:" + std::to_string(m) + "/" + (cold ? "cold" : "warm") +
                                       "/" + threads_name(threads);
              register_timed(name, [c](benchmark::State& state) { gemm_benchmark(state, c); });
            }
          }
        }
      }
      if (isa == Isa::kScalar || !shape.grouped_scales) continue;
      for (size_t threads : thread_counts) {
        const std::string name = std::string(rows.prefix) + "/" + shape.name + "/" + isa_name(isa) +
                                 "/read_only/cold/" + threads_name(threads);
        const GemmShape* sp = &shape;
        const qmoe_weight_format format = rows.format;
        register_timed(name, [format, sp, isa, threads](benchmark::State& state) {
          read_only_benchmark(state, format, sp, isa, threads);
        });
      }
    }
  }
}

}  // namespace qmoe::bench
