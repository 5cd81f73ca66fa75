// The MXFP4 and NVFP4 dequant-GEMMs through the public ABI (qmoe_gemm on a qmoe_context), with
// the rows of gemm_int4_bench.cc (gemm_bench_common.h: the cold rotation, the read roof, the
// read-only row). E2M1 codes in the canonical layout, scales in the grouped order (MXFP4: E8M0 per
// 32 k; NVFP4: E4M3 per 16 k and a global scale), no bias.
//
//   gemm_<mxfp4|nvfp4>/<shape>/<isa>/<exact|fast>/m:<1|4>/<cold|warm>/threads:<1|all>
//   gemm_<mxfp4|nvfp4>/<shape>/<isa>/read_only/cold/threads:<1|all>
//
//   shape   qwen3_fc1    N=1536 K=2048  Qwen3-30B-A3B expert FC1 (gate and up, fused)
//           qwen3_fc2    N=2048 K=768   Qwen3-30B-A3B expert FC2 (down)
//           gptoss_fc1   N=5760 K=2880  gpt-oss-20b expert FC1 (gate and up, fused), which
//                                       gpt-oss ships in MXFP4
//   isa     scalar (m:1 only), avx2, avx512; a tier the host lacks is skipped with the reason
//
// Issue 21's bars read these rows: fast, M = 1, cold, 1 thread, at least 0.85 frac_of_read_bw;
// and the avx2 rows at least 3x the scalar ones (us_per_call).
#include <iterator>

#include "benchmarks/bench_util.h"
#include "benchmarks/gemm/gemm_bench_common.h"
#include "qmoe/qmoe.h"

namespace qmoe::bench {
namespace {

constexpr GemmBenchShape kShapes[] = {
    {"qwen3_fc1", 1536, 2048, true},
    {"qwen3_fc2", 2048, 768, true},
    {"gptoss_fc1", 5760, 2880, true},
};
constexpr uint32_t kBatchSizes[] = {1, 4};

void register_gemm_fp4_benchmarks() {
  for (const GemmBenchFormat* format : {&kBenchMxfp4, &kBenchNvfp4}) {
    register_gemm_bench_rows(
        {format, kShapes, std::size(kShapes), kBatchSizes, std::size(kBatchSizes)});
  }
}

// After gemm_int4 (300) and gemm_int3 (310): the formats' rows in qmoe_weight_format order.
QMOE_BENCH_REGISTRAR(320, register_gemm_fp4_benchmarks);

}  // namespace
}  // namespace qmoe::bench
