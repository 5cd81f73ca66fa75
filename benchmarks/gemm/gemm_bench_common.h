// The dequant-GEMM benchmark machinery every weight format's file shares (gemm_int4_bench.cc,
// gemm_int3_bench.cc, gemm_fp4_bench.cc): a pool of cold matrices of one format and shape, one
// qmoe_gemm call per iteration on a cold or a warm matrix, the same cold pages read by the
// tier's read kernel alone, and the registration of a format's rows
//
//   gemm_<format>/<shape>/<isa>/<exact|fast>/m:<M>/<cold|warm>/threads:<1|all>
//   gemm_<format>/<shape>/<isa>/read_only/cold/threads:<1|all>
//
// A format file says what its matrices hold (format, block, scale type, how to fill the scales),
// its shapes and its M values. Codes are random bytes in the format's canonical layout (every
// byte pattern is valid codes for INT4, INT3, MXFP4 and NVFP4); no zero points, no bias.
// gemm_int4_bench.cc documents the rows, the cold rotation and the counters.
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

/// What every benchmark's weights of each format hold (the GEMM rows and the MoE layer rows),
/// no zero points and no bias:
///   int4   INT4 codes, FP16 scales per 32 k (zero point 8)
///   int3   INT3 codes, FP16 scales per 32 k (zero point 4)
///   mxfp4  E2M1 codes, E8M0 scales per 32 k
///   nvfp4  E2M1 codes, E4M3 scales per 16 k, global scale 2^-12
extern const GemmBenchFormat kBenchInt4, kBenchInt3, kBenchMxfp4, kBenchNvfp4;

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

/// One format's rows: every shape, tier (the scalar tier at M = 1 only), level, M, cold and
/// warm, one and all threads; the [K/block, N] shapes at M = 1 and 4 only; a read_only row per
/// grouped shape, SIMD tier and thread count.
struct GemmBenchRows {
  const GemmBenchFormat* format;
  const GemmBenchShape* shapes;
  size_t shape_count;
  const uint32_t* batch_sizes;
  size_t batch_size_count;
};

/// Registers the rows (call from a QMOE_BENCH_REGISTRAR function).
void register_gemm_bench_rows(const GemmBenchRows& rows);

}  // namespace qmoe::bench

#endif  // QMOE_BENCHMARKS_GEMM_GEMM_BENCH_COMMON_H_
