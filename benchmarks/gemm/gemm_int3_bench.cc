// The INT3 dequant-GEMM through the public ABI (qmoe_gemm on a qmoe_context), on the INT4
// benchmark's expert shapes (gemm_int4_bench.cc documents the rows, the cold rotation and the
// counters): INT3 codes in the canonical layout (lib/formats/int3_layout.h), FP16 scales
// (block 32) in the grouped order, no zero points (the default 4), no bias.
//
//   gemm_int3/<shape>/<isa>/<exact|fast>/m:<1|4>/<cold|warm>/threads:<1|all>
//   gemm_int3/<shape>/<isa>/read_only/cold/threads:<1|all>
//
//   shape    qwen3_fc1  N=1536 K=2048  Qwen3-30B-A3B expert FC1 (gate and up, fused)
//            qwen3_fc2  N=2048 K=768   Qwen3-30B-A3B expert FC2 (down)
//            gptoss     N=2880 K=2880  gpt-oss-20b-like expert projection
//
// An INT3 matrix reads 3/8 of a byte per weight and its FP16 block-32 scales 1/16: 0.4375 bytes
// against INT4's 0.5625, so at the same fraction of the read roof a call takes 78% of INT4's
// time. docs/results/2026-12-01-int3-layout.md has the bars measured with these rows.
#include <cstdint>
#include <iterator>

#include "benchmarks/bench_util.h"
#include "benchmarks/gemm/gemm_bench_common.h"
#include "qmoe/qmoe.h"

namespace qmoe::bench {
namespace {

constexpr GemmBenchShape kShapes[] = {
    {"qwen3_fc1", 1536, 2048, true},
    {"qwen3_fc2", 2048, 768, true},
    {"gptoss", 2880, 2880, true},
};
constexpr uint32_t kBatchSizes[] = {1, 4};

void register_gemm_int3_benchmarks() {
  register_gemm_bench_rows(
      {&kBenchInt3, kShapes, std::size(kShapes), kBatchSizes, std::size(kBatchSizes)});
}

// Between gemm_int4 (300) and gemm_mxfp4 / gemm_nvfp4 (320): the formats' rows in
// qmoe_weight_format order.
QMOE_BENCH_REGISTRAR(310, register_gemm_int3_benchmarks);

}  // namespace
}  // namespace qmoe::bench
