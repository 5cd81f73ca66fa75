// Per-host tuning of how the INT4 kernels stream weights, chosen once per process. Tuning
// only: every choice computes the same bits.
#ifndef QMOE_LIB_GEMM_STREAM_TUNING_H_
#define QMOE_LIB_GEMM_STREAM_TUNING_H_

#include <cstdint>

namespace qmoe {

/// GemmGroupArgs::prefetch_l2_bytes for this host: 8192 on Intel CPUs, 0 elsewhere.
///
/// Why by vendor: a second, L2-only software prefetch 8 KiB ahead (beside the L1 prefetch
/// 3 KiB ahead) took the fast M = 1 cold Qwen3 FC1 call on the Sapphire Rapids device host from
/// a median of 155 us to 135 us (6 alternating rounds; M = 4 175 -> 156 us), and on the Zen 3
/// development host from 146 us to 164 us (3 rounds): Intel's L1 keeps fewer misses in flight
/// (16 fill buffers) than its L2 (48), AMD's hardware prefetcher already runs that far ahead.
uint32_t int4_l2_prefetch_bytes();

}  // namespace qmoe

#endif  // QMOE_LIB_GEMM_STREAM_TUNING_H_
