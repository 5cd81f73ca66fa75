// Per-host tuning of how the INT4 kernels stream weights, chosen once per process. Tuning
// only: every choice computes the same bits.
#ifndef QMOE_LIB_GEMM_STREAM_TUNING_H_
#define QMOE_LIB_GEMM_STREAM_TUNING_H_

#include <cstdint>

namespace qmoe {

/// GemmGroupArgs::prefetch_l2_bytes for this host: 8192 on Intel CPUs, 0 elsewhere.
///
/// Why by vendor: a second, L2-only software prefetch 8 KiB ahead (beside the L1 prefetch
/// 3 KiB ahead) speeds a cold stream on Intel, whose L1 keeps fewer misses in flight (16 fill
/// buffers) than its L2 (48), and costs on AMD, whose hardware prefetcher already runs that far
/// ahead (docs/results/2026-11-30-kernel-comment-figures.md has the measurements).
uint32_t int4_l2_prefetch_bytes();

}  // namespace qmoe

#endif  // QMOE_LIB_GEMM_STREAM_TUNING_H_
