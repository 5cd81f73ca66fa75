// The dequant-GEMM benchmark machinery every weight format's benchmark file shares
// (gemm_int4_bench.cc, gemm_int3_bench.cc): a pool of cold matrices and a warm one per shape,
// one qmoe_gemm call per iteration through the public ABI, the same cold rotation read by the
// tier's read kernel alone, and the registration of the rows
//
//   <prefix>/<shape>/<isa>/<exact|fast>/m:<M>/<cold|warm>/threads:<1|all>
//   <prefix>/<shape>/<isa>/read_only/cold/threads:<1|all>
//
// Codes are random bytes in the format's canonical layout (every byte pattern is valid codes for
// INT4 and INT3), FP16 scales (block 32) in the grouped order of docs/formats.md, or [K/32, N]
// for shapes that ask for it; no zero points, no bias. gemm_int4_bench.cc documents the rows, the
// cold rotation and the counters.
#ifndef QMOE_BENCHMARKS_GEMM_GEMM_BENCH_COMMON_H_
#define QMOE_BENCHMARKS_GEMM_GEMM_BENCH_COMMON_H_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe::bench {

struct GemmShape {
  const char* name;
  uint32_t n;  // a multiple of 8
  uint32_t k;
  bool grouped_scales;  // else [K/32, N]
};

/// One format's rows: every shape, tier (the scalar tier at M = 1 only), level, M, cold and
/// warm, one and all threads; the [K/32, N] shapes at M = 1 and 4 only; a read_only row per
/// grouped shape, SIMD tier and thread count.
struct GemmBenchRows {
  const char* prefix;  // "gemm_int4"
  qmoe_weight_format format;
  const GemmShape* shapes;
  size_t shape_count;
  const uint32_t* batch_sizes;
  size_t batch_size_count;
};

/// Registers the rows (call from a QMOE_BENCH_REGISTRAR function).
void register_gemm_bench_rows(const GemmBenchRows& rows);

}  // namespace qmoe::bench

#endif  // QMOE_BENCHMARKS_GEMM_GEMM_BENCH_COMMON_H_
