#include "benchmarks/gemm/gemm_bench_common.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace qmoe::bench {
namespace {

constexpr size_t kPageBytes = 4096;

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The weights of one format and shape: R cold matrices plus one warm matrix, each a page-aligned
// slot of canonical codes followed by its scale plane (the grouped order, or [K/block, N] for the
// shapes that ask for it). Random code bytes (every byte is valid codes) and the format's scales.
// Kept for the consecutive benchmarks of one format and shape; the next one's pool replaces it.
class WeightPool {
 public:
  static WeightPool& get(const GemmBenchFormat& format, const GemmBenchShape& shape) {
    static std::unique_ptr<WeightPool> current;
    if (current == nullptr || current->format_ != &format || current->shape_ != &shape) {
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
  WeightPool(const GemmBenchFormat& format, const GemmBenchShape& shape)
      : format_(&format), shape_(&shape) {
    qmoe_quant_matrix_codes_size(format.format, shape.n, shape.k, &codes_bytes_);
    const size_t blocks = shape.k / format.block_size;
    scale_bytes_ = size_t{shape.n} * blocks * format.scale_element_bytes;
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
      unsigned char* scales = slot + scale_offset;
      format.fill_scales(scales, size_t{shape.n} * blocks, seed);
      qmoe_quant_matrix w{};
      w.struct_size = sizeof(w);
      w.format = format.format;
      w.n = shape.n;
      w.k = shape.k;
      w.block_size = format.block_size;
      w.codes = slot;
      w.scale_dtype = format.scale_dtype;
      w.scales = scales;
      w.scale_row_stride = 1;
      if (shape.grouped_scales) {  // element (n, b) at (n / 8) * 8 K/block + b * 8 + n % 8
        w.scale_block_stride = 8;
        w.scale_group_stride = 8 * blocks;
      } else {  // [K/block, N]: element (n, b) at b * N + n
        w.scale_block_stride = shape.n;
      }
      w.global_scale = format.global_scale;
      matrices_.push_back(w);
    }
  }

  const GemmBenchFormat* format_;
  const GemmBenchShape* shape_;
  size_t codes_bytes_ = 0;
  size_t scale_bytes_ = 0;
  size_t cold_count_ = 0;
  size_t cursor_ = 0;
  AlignedBuffer buffer_;
  std::vector<qmoe_quant_matrix> matrices_;
};

// One read of a cold matrix's slot (codes, the padding to the next page, scales: at most 4 KiB
// more than a GEMM call reads) by the tier's read kernel on the context's threads.
void read_slot(qmoe_context* context, const WeightPool& pool, const qmoe_quant_matrix& w,
               bool all_threads, PairedRead* reads) {
  const auto* first = static_cast<const unsigned char*>(w.codes);
  const auto* end = static_cast<const unsigned char*>(w.scales) + pool.scale_bytes();
  reads->read(context, first, static_cast<size_t>(end - first), all_threads);
}

}  // namespace

void fill_scales_f16(void* dst, size_t count, uint64_t& seed) {
  fill_weight_scales_f16(static_cast<uint16_t*>(dst), count, seed);
}

void fill_scales_e8m0(void* dst, size_t count, uint64_t& seed) {
  auto* out = static_cast<uint8_t*>(dst);
  for (size_t e = 0; e < count; ++e) out[e] = static_cast<uint8_t>(118 + splitmix64(seed) % 6);
}

void fill_scales_e4m3(void* dst, size_t count, uint64_t& seed) {
  auto* out = static_cast<uint8_t*>(dst);
  for (size_t e = 0; e < count; ++e) out[e] = static_cast<uint8_t>(0x30 + splitmix64(seed) % 0x4F);
}

const GemmBenchFormat kBenchInt4 = {
    "int4", QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_DTYPE_F16, sizeof(uint16_t), 0.0f, &fill_scales_f16};
const GemmBenchFormat kBenchInt3 = {
    "int3", QMOE_WEIGHT_FORMAT_INT3, 32, QMOE_DTYPE_F16, sizeof(uint16_t), 0.0f, &fill_scales_f16};
const GemmBenchFormat kBenchMxfp4 = {"mxfp4", QMOE_WEIGHT_FORMAT_MXFP4, 32, QMOE_DTYPE_E8M0, 1,
                                     0.0f,    &fill_scales_e8m0};
const GemmBenchFormat kBenchNvfp4 = {
    "nvfp4",        QMOE_WEIGHT_FORMAT_NVFP4, 16, QMOE_DTYPE_F8_E4M3, 1,
    1.0f / 4096.0f, &fill_scales_e4m3};

std::string gemm_bench_name(const GemmBenchCase& c) {
  return std::string("gemm_") + c.format->name + "/" + c.shape->name + "/" + isa_name(c.isa) + "/" +
         level_name(c.accuracy) + "/m:" + std::to_string(c.m) + "/" + (c.cold ? "cold" : "warm") +
         "/" + threads_name(c.threads);
}

void gemm_benchmark(benchmark::State& state, const GemmBenchCase& c) {
  if (table_or_skip(state, c.isa) == nullptr) return;
  BenchContext context(c.isa, c.threads);
  if (!context.ok()) {
    state.SkipWithError(("qmoe_context_create failed: " + context.error()).c_str());
    return;
  }
  const char* kernel =
      gemm_kernel_name(context.get(), c.format->format, c.format->block_size, c.accuracy);

  const uint32_t n = c.shape->n, k = c.shape->k;
  WeightPool& pool = WeightPool::get(*c.format, *c.shape);
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

  // Cold rows: before each call, untimed, the next cold matrix is read by the read kernel on
  // the same threads (the paired read; gemm_int4_bench.cc says why), and the call takes the
  // one after it.
  qmoe_status failed = QMOE_STATUS_OK;
  PairedRead paired;
  const qmoe_quant_matrix* w = nullptr;
  const double seconds = run_timed(
      state,
      [&] {
        if (c.cold) read_slot(context.get(), pool, pool.next_cold(), c.threads > 1, &paired);
        w = next();
      },
      [&] {
        const qmoe_status s = qmoe_gemm(context.get(), w, c.accuracy, c.m, x, k, y, n, 0, n);
        if (s != QMOE_STATUS_OK) failed = s;
      });
  benchmark::DoNotOptimize(y);
  if (failed != QMOE_STATUS_OK) {
    state.SkipWithError((std::string("qmoe_gemm failed: ") + qmoe_status_string(failed)).c_str());
    return;
  }
  if (paired.failed != QMOE_STATUS_OK) {
    state.SkipWithError(
        (std::string("the paired read failed: ") + qmoe_status_string(paired.failed)).c_str());
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
    paired.report(state, bytes * iterations, seconds);
  }
}

// One qmoe_measure_read_bandwidth_over call per matrix over its slot (codes, the padding to the
// next page, scales: at most 4 KiB more than the GEMM reads), through the same kind of context
// and pool, so one hand-off per matrix as for qmoe_gemm. A GEMM row's frac_of_read_bw over this
// row's is the kernel's efficiency against a pure read of the same pages in the same pattern,
// and this row's own is what the call pattern (matrix starts, the hand-off) leaves of the roof.
void gemm_read_only_benchmark(benchmark::State& state, const GemmBenchFormat* format,
                              const GemmBenchShape* shape, Isa isa, size_t threads) {
  if (table_or_skip(state, isa) == nullptr) return;
  BenchContext context(isa, threads);
  if (!context.ok()) {
    state.SkipWithError(("qmoe_context_create failed: " + context.error()).c_str());
    return;
  }
  WeightPool& pool = WeightPool::get(*format, *shape);
  PairedRead reads;  // the read itself is what this row times
  auto read = [&](const qmoe_quant_matrix& w) {
    read_slot(context.get(), pool, w, threads > 1, &reads);
  };
  for (int i = 0; i < 3; ++i) read(pool.next_cold());  // warm-up, as the GEMM rows do
  const qmoe_quant_matrix* w = nullptr;
  const double seconds = run_timed(
      state, [&] { w = &pool.next_cold(); }, [&] { read(*w); });
  if (reads.failed != QMOE_STATUS_OK) {
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

void register_gemm_bench_rows(const GemmBenchRows& rows) {
  const GemmBenchFormat* format = rows.format;
  const std::vector<size_t> thread_counts = one_and_all_threads();
  for (size_t s = 0; s < rows.shape_count; ++s) {
    const GemmBenchShape* shape = &rows.shapes[s];
    for (Isa isa : bench_tiers()) {
      for (qmoe_accuracy accuracy : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        for (size_t b = 0; b < rows.batch_size_count; ++b) {
          const uint32_t m = rows.batch_sizes[b];
          if (isa == Isa::kScalar && m != 1) continue;
          if (!shape->grouped_scales && m != 1 && m != 4) continue;
          for (bool cold : {true, false}) {
            for (size_t threads : thread_counts) {
              const GemmBenchCase c{format, shape, isa, accuracy, m, cold, threads};
              register_timed(gemm_bench_name(c),
                             [c](benchmark::State& state) { gemm_benchmark(state, c); });
            }
          }
        }
      }
      if (isa == Isa::kScalar || !shape->grouped_scales) continue;
      for (size_t threads : thread_counts) {
        const std::string name = std::string("gemm_") + format->name + "/" + shape->name + "/" +
                                 isa_name(isa) + "/read_only/cold/" + threads_name(threads);
        register_timed(name, [format, shape, isa, threads](benchmark::State& state) {
          gemm_read_only_benchmark(state, format, shape, isa, threads);
        });
      }
    }
  }
}

}  // namespace qmoe::bench
