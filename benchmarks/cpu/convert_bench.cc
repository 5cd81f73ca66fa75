// Row conversions (FP16/BF16 <-> FP32) of each tier, from L1-resident rows to rows well past the
// last-level cache. Throughput counts bytes read plus bytes written (src + dst) per element.
//
//   convert_<op>/<isa>/<size>/threads:<t>, size by working set (src + dst bytes):
//     l1    4 KiB of output
//     l2    half the L2
//     llc   half the LLC
//     dram  4 x LLC; also on all hardware threads, and reports frac_of_read_bw: achieved
//           (read + written) bytes/s over the DRAM read roof of the same thread count.
//
// The kernels are called directly from the tier's table (no ABI checks, no library threading);
// with t threads each converts its own contiguous part of the row, first-touched by itself.
// Note on the dram figure: a core writing to memory also reads each destination line first
// (read-for-ownership), so DRAM moves src + 2 x dst bytes while the counter credits src + dst.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"

namespace qmoe::bench {
namespace {

// Sources are finite normal numbers of activation- or weight-like magnitude, random sign and
// mantissa: the case the kernels are built for (no NaN, no overflow, no subnormal).
void fill_f16(void* dst, size_t n, uint64_t seed) {
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix64(seed);
    const uint32_t exponent = 1 + static_cast<uint32_t>((r >> 16) % 30);  // 1..30
    out[i] = static_cast<uint16_t>(((r & 1) << 15) | (exponent << 10) | ((r >> 1) & 0x3FF));
  }
}

void fill_bf16(void* dst, size_t n, uint64_t seed) {
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix64(seed);
    const uint32_t exponent = 67 + static_cast<uint32_t>((r >> 16) % 121);  // 2^-60 .. 2^60
    out[i] = static_cast<uint16_t>(((r & 1) << 15) | (exponent << 7) | ((r >> 1) & 0x7F));
  }
}

void fill_f32(void* dst, size_t n, uint64_t seed, uint32_t min_exponent, uint32_t span) {
  unsigned char* out = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix64(seed);
    const uint32_t exponent = min_exponent + static_cast<uint32_t>((r >> 32) % span);
    const uint32_t bits =
        static_cast<uint32_t>((r & 1) << 31) | (exponent << 23) | ((r >> 1) & 0x7FFFFF);
    std::memcpy(out + 4 * i, &bits, 4);
  }
}

// FP32 inputs that stay inside the FP16 normal range (2^-14 .. 2^15), and a wide BF16 range.
void fill_f32_for_f16(void* dst, size_t n, uint64_t seed) {
  fill_f32(dst, n, seed, 113, 30);
}
void fill_f32_for_bf16(void* dst, size_t n, uint64_t seed) {
  fill_f32(dst, n, seed, 67, 121);
}

void call_f16_to_f32(const KernelTable& t, const void* src, void* dst, size_t n) {
  t.convert_f16_to_f32.fn(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
}
void call_f32_to_f16(const KernelTable& t, const void* src, void* dst, size_t n) {
  t.convert_f32_to_f16.fn(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
}
void call_bf16_to_f32(const KernelTable& t, const void* src, void* dst, size_t n) {
  t.convert_bf16_to_f32.fn(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
}
void call_f32_to_bf16(const KernelTable& t, const void* src, void* dst, size_t n) {
  t.convert_f32_to_bf16.fn(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
}

struct ConvertOp {
  const char* name;
  size_t src_bytes;  // per element
  size_t dst_bytes;
  void (*fill)(void* src, size_t n, uint64_t seed);
  void (*call)(const KernelTable& table, const void* src, void* dst, size_t n);
};

const ConvertOp kOps[] = {
    {"convert_f16_to_f32", 2, 4, &fill_f16, &call_f16_to_f32},
    {"convert_f32_to_f16", 4, 2, &fill_f32_for_f16, &call_f32_to_f16},
    {"convert_bf16_to_f32", 2, 4, &fill_bf16, &call_bf16_to_f32},
    {"convert_f32_to_bf16", 4, 2, &fill_f32_for_bf16, &call_f32_to_bf16},
};

void convert_benchmark(benchmark::State& state, const ConvertOp& op, Isa isa,
                       size_t elements_per_thread, size_t threads, bool dram) {
  const KernelTable* table = table_or_skip(state, isa);
  if (table == nullptr) return;

  ThreadTeam team(threads);
  SlicedBuffer src(team, elements_per_thread * op.src_bytes);
  SlicedBuffer dst(team, elements_per_thread * op.dst_bytes);
  auto fill = [&](size_t member) {
    op.fill(src.slice(member), elements_per_thread, 0x5EED0000u + member);
  };
  team.run(fill);

  const size_t bytes_per_pass = elements_per_thread * (op.src_bytes + op.dst_bytes);
  const size_t passes = passes_for(bytes_per_pass);
  auto work = [&](size_t member) {
    for (size_t p = 0; p < passes; ++p) {
      op.call(*table, src.slice(member), dst.slice(member), elements_per_thread);
    }
  };
  team.run(work);  // warm-up: caches, TLB

  const double seconds = run_timed(state, [&] { team.run(work); });

  state.SetLabel("n=" + std::to_string(elements_per_thread) + " per thread (src+dst " +
                 format_bytes(static_cast<double>(bytes_per_pass)) + "), " +
                 std::to_string(passes) + (passes == 1 ? " pass" : " passes") + "/iteration");
  report_bandwidth(state,
                   static_cast<double>(bytes_per_pass) * static_cast<double>(passes) *
                       static_cast<double>(threads),
                   seconds, threads, /*versus_read_roof=*/dram);
}

void register_convert_benchmarks() {
  const CacheSizes& caches = cache_sizes();
  const size_t all = hardware_threads();
  struct SizeClass {
    const char* name;
    bool dram;
    bool all_threads;  // also register a run on all hardware threads
  };
  const SizeClass kSizes[] = {
      {"l1", false, false}, {"l2", false, false}, {"llc", false, false}, {"dram", true, true}};

  for (const ConvertOp& op : kOps) {
    const size_t element_bytes = op.src_bytes + op.dst_bytes;
    for (const SizeClass& size : kSizes) {
      size_t working_set = 0;  // src + dst bytes of the whole row
      if (std::strcmp(size.name, "l1") == 0) working_set = 4 * kKiB / op.dst_bytes * element_bytes;
      if (std::strcmp(size.name, "l2") == 0) working_set = caches.l2 / 2;
      if (std::strcmp(size.name, "llc") == 0) working_set = caches.llc / 2;
      if (std::strcmp(size.name, "dram") == 0) working_set = 4 * llc_total_bytes();
      const size_t row = working_set / element_bytes;

      std::vector<size_t> thread_counts = {1};
      if (size.all_threads && all > 1) thread_counts.push_back(all);
      for (size_t threads : thread_counts) {
        // Whole 64-element groups per thread: every tier runs its main loop only (tails are
        // the tests' business).
        const size_t per_thread = std::max<size_t>(64, row / threads / 64 * 64);
        for (Isa isa : bench_tiers()) {
          const std::string name = std::string(op.name) + "/" + isa_name(isa) + "/" + size.name +
                                   "/threads:" + std::to_string(threads);
          const ConvertOp* op_ptr = &op;
          const bool dram = size.dram;
          register_timed(name, [=](benchmark::State& state) {
            convert_benchmark(state, *op_ptr, isa, per_thread, threads, dram);
          });
        }
      }
    }
  }
}

QMOE_BENCH_REGISTRAR(200, register_convert_benchmarks);

}  // namespace
}  // namespace qmoe::bench
