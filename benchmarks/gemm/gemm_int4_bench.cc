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
//            deepseek_v3_fc1  N=4096 K=7168   DeepSeek-V3 routed expert FC1 (gate and up)
//            mixtral_fc2      N=4096 K=14336  Mixtral-8x7B expert FC2 (down): the longest K,
//                       whose scale runs (7 KiB a group) the GEMM driver streams differently
//                       (lib/gemm/gemm_rows.cc)
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
// The machinery (weight pools, the timed call, the read-only rows, the registration) is shared
// with the other formats' files in gemm_bench_common.{h,cc}.
//
// One iteration is one qmoe_gemm call, timed alone (argument checks, activation quantization
// and the thread hand-off included). Before each call of a cold row, untimed, the same context
// reads the next cold matrix's slot with qmoe_measure_read_bandwidth_over (the paired read),
// and the call takes the matrix after it: the same pages, the same threads, the same seconds,
// so that a host whose bandwidth drifts between processes or leases (other tenants, a shared
// socket) moves the call and its roof together. Counters:
//   us_per_call          mean time per call
//   GB/s                 weight bytes (codes + scales) per call over time, 1e9 bytes/s
//   frac_of_read_bw      GB/s over the DRAM read roof of the same thread count, measured at
//                        startup; for cold rows the fraction of the memory-bound floor reached
//   paired_read_GB/s     cold rows: the paired reads' bytes over their time
//   frac_of_paired_read  cold rows: GB/s over paired_read_GB/s, the same fraction against the
//                        roof measured beside each call (issue 21's one-thread bar reads it)
//   Gmac_per_s           M x N x K multiply-adds per second (for compute-bound rows, large M)
//
// Threads: by default the context runs on libqmoe's own pool (pthreadpool, unpinned), as a
// runtime that does not pass a parallel_for would. QMOE_BENCH_GEMM_POOL=team instead passes a
// parallel_for that runs on qmoe_bench's pinned ThreadTeam (bench_util.h); the context line
// qmoe_gemm_int4_pool says which one ran. docs/results/2026-11-30-dev-host-method-notes.md
// compares the two.
#include <iterator>

#include "benchmarks/bench_util.h"
#include "benchmarks/gemm/gemm_bench_common.h"
#include "qmoe/qmoe.h"

namespace qmoe::bench {
namespace {

// One shape a line.
// clang-format off
constexpr GemmBenchShape kShapes[] = {
    {"qwen3_fc1", 1536, 2048, true},
    {"qwen3_fc2", 2048, 768, true},
    {"gptoss", 2880, 2880, true},
    {"qwen3_fc1_kn_scales", 1536, 2048, false},
    {"deepseek_v3_fc1", 4096, 7168, true},
    {"mixtral_fc2", 4096, 14336, true},
};
// clang-format on
constexpr uint32_t kBatchSizes[] = {1, 2, 4, 8, 32};

void register_gemm_int4_benchmarks() {
  benchmark::AddCustomContext("qmoe_gemm_int4_pool",
                              use_team_pool()
                                  ? "threads:all on qmoe_bench's pinned team via parallel_for "
                                    "(QMOE_BENCH_GEMM_POOL=team)"
                                  : "threads:all on the context's own pthreadpool (unpinned)");
  register_gemm_bench_rows(
      {&kBenchInt4, kShapes, std::size(kShapes), kBatchSizes, std::size(kBatchSizes)});
}

QMOE_BENCH_REGISTRAR(300, register_gemm_int4_benchmarks);

}  // namespace
}  // namespace qmoe::bench
