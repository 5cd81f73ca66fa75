// The dequant-GEMM benchmark rows every weight format shares (gemm_int4_bench.cc,
// gemm_fp4_bench.cc): a pool of cold matrices of one format and shape, one qmoe_gemm call per
// iteration on a cold or a warm matrix, and the same cold pages read by the tier's read kernel
// alone. A format file says what its matrices hold (format, block, scale type, how to fill the
// scales) and which rows it registers.
#ifndef QMOE_BENCHMARKS_GEMM_GEMM_BENCH_COMMON_H_
#define QMOE_BENCHMARKS_GEMM_GEMM_BENCH_COMMON_H_

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "benchmarks/bench_util.h"
#include "qmoe/qmoe.h"

namespace qmoe::bench {

struct GemmBenchShape {
  const char* name;
  uint32_t n;  // a multiple of 8
  uint32_t k;
  bool grouped_scales;  // the grouped order (docs/formats.md); else [K/block, N]
};

struct GemmBenchFormat {
  const char* name;  // rows are named gemm_<name>/...
  qmoe_weight_format format;
  uint32_t block_size;
  qmoe_dtype scale_dtype;
  size_t scale_element_bytes;
  float global_scale;  // 0: none
  // Fills `count` scale elements of weight-like magnitude from `seed`.
  void (*fill_scales)(void* dst, size_t count, uint64_t& seed);
};

/// Scale fillers: FP16 2^-8 .. 2^-5 with random sign and mantissa; E8M0 2^-9 .. 2^-4; E4M3
/// 0.5 .. 448 (ModelOpt's block scales span the E4M3 range under a small global scale).
void fill_scales_f16(void* dst, size_t count, uint64_t& seed);
void fill_scales_e8m0(void* dst, size_t count, uint64_t& seed);
void fill_scales_e4m3(void* dst, size_t count, uint64_t& seed);

struct GemmBenchCase {
  const GemmBenchFormat* format;
  const GemmBenchShape* shape;
  Isa isa;
  qmoe_accuracy accuracy;
  uint32_t m;
  bool cold;
  size_t threads;
};

/// One qmoe_gemm call per iteration, on the next of R cold matrices (R x bytes >= 4 x the
/// last-level cache, so each call streams its weights from DRAM) or on one warm matrix.
/// Counters: us_per_call, GB/s and frac_of_read_bw (weight bytes, codes + scales, per call over
/// time; against the read roof of the same thread count), Gmac_per_s.
void gemm_benchmark(benchmark::State& state, const GemmBenchCase& c);

/// The same cold rotation read by the tier's read kernel alone, one call per matrix over its
/// slot (codes, the padding to the next page, scales).
void gemm_read_only_benchmark(benchmark::State& state, const GemmBenchFormat* format,
                              const GemmBenchShape* shape, Isa isa, size_t threads);

/// "gemm_<format>/<shape>/<isa>/<exact|fast>/m:<M>/<cold|warm>/<threads:1|all>".
std::string gemm_bench_name(const GemmBenchCase& c);

}  // namespace qmoe::bench

#endif  // QMOE_BENCHMARKS_GEMM_GEMM_BENCH_COMMON_H_
