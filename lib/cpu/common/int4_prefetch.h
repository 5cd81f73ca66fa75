// How far ahead (bytes) the INT4 CPU kernels software-prefetch their code stream, shared by
// every tier so it is tuned in one place. Overridable at build time
// (-DQMOE_INT4_PREFETCH_BYTES=N) for tuning runs.
//
// Why 3072: the distance must cover DRAM latency times the stream's rate (about 120 ns x
// 15 GB/s = 1.8 KB on the Sapphire Rapids device host). There, fast M = 1 cold Qwen3 FC1 with
// grouped scales read at 0.53-0.59 of the roof with no software prefetch, 0.68-0.80 at 1536 B
// and 0.70-0.89 at 3072 B (one run, both 256- and 512-bit kernels); 6144 B was no better on
// the 256-bit kernel. On the Zen 3 development host (lower latency) 768 B to 8 KiB measured the
// same within noise, but none at all is slower there too: fast M = 1 read 0.66-0.72 of the roof
// without it against 0.78-0.81 with it (docs/benchmarks.md, 2026-11-30).
#ifndef QMOE_LIB_CPU_COMMON_INT4_PREFETCH_H_
#define QMOE_LIB_CPU_COMMON_INT4_PREFETCH_H_

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

#ifndef QMOE_INT4_PREFETCH_BYTES
#define QMOE_INT4_PREFETCH_BYTES 3072
#endif

// How many scale blocks ahead of the current one the kernels also prefetch the group's scale
// line (0: none, the default). Overridable at build time for tuning runs. 16 was tried on
// 2026-11-30: alternated with 0 over 3 rounds on the device host and 2 on the dev host (cold
// Qwen3 and gpt-oss rows at M = 1 and 4, exact and fast, and the 1-thread decode), it won some
// rounds and lost others by as much (docs/benchmarks.md), so the default stays off. The scale
// stream does cost (about 7% of a one-thread fast M = 1 call, measured 2026-12-01); the GEMM
// driver covers it by prefetching each group's whole scale run a group ahead into L2
// (lib/gemm/gemm_rows.cc), which did separate.
#ifndef QMOE_INT4_SCALE_PREFETCH_BLOCKS
#define QMOE_INT4_SCALE_PREFETCH_BLOCKS 0
#endif

namespace qmoe {

inline constexpr size_t kInt4PrefetchBytes = QMOE_INT4_PREFETCH_BYTES;
inline constexpr uint32_t kInt4ScalePrefetchBlocks = QMOE_INT4_SCALE_PREFETCH_BLOCKS;

// Internal linkage: this header is compiled under every tier's flags, and an inline function
// with external linkage would leave the linker free to keep one tier's copy for all
// (docs/dispatch.md, "Flags never leak").
namespace {

// Called once per 128-byte chunk of the code stream: its two lines kInt4PrefetchBytes ahead
// into L1, and, when `l2_bytes` is not 0 (GemmGroupArgs::prefetch_l2_bytes, chosen once per
// process by lib/gemm/stream_tuning.h), two lines `l2_bytes` ahead into L2 only. Prefetches never
// fault, so running past the end of the codes is harmless.
//
// always_inline, because without it GCC 12 (-O3) silently deleted the L2 prefetch: its
// function splitting moved the `if` body into a `.part` function, the pure-const pass found
// that function free of side effects (a prefetch does not count) and so marked it const, and
// the call to a const function returning void was then removed as dead. No kernel contained
// a prefetcht1 until this was found. tests/cmake/check_int4_prefetch.cmake (ctest
// build.int4_kernels_emit_l2_prefetch) fails if a kernel object again holds L1 prefetches
// without the L2 ones.
__attribute__((always_inline)) inline void prefetch_int4_chunk(const uint8_t* codes,
                                                               uint32_t l2_bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(codes + kInt4PrefetchBytes), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(codes + kInt4PrefetchBytes + 64), _MM_HINT_T0);
  if (l2_bytes != 0) {
    _mm_prefetch(reinterpret_cast<const char*>(codes + l2_bytes), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(codes + l2_bytes + 64), _MM_HINT_T1);
  }
}

// Called once per chunk with the group's scale plane (`scales`, elements of `scale_bytes`) and
// the chunk's block, by every tier's kernels (one copy of the rule):
// - In [K/B, N] order, the line 64 bytes past this block's: one line serves four consecutive
//   groups, so this is the one the groups four ahead will read, and those strided misses do
//   not stall the code stream.
// - With kInt4ScalePrefetchBlocks set, also the line that many blocks ahead in this group (in
//   the grouped order, the group's sequential run of 16-byte slices; in [K/B, N] order, the
//   group's future blocks, a line each). The idea: a demand miss on a new scale line every
//   fourth chunk, with a long chunk (M = 4) filling the reorder buffer behind it. Measured, it
//   did not separate from the noise (above), so it is off by default.
// Prefetches never fault, so neither needs to stop at the plane's end.
__attribute__((always_inline)) inline void prefetch_int4_scales(const void* scales,
                                                                size_t scale_bytes, uint32_t block,
                                                                size_t block_stride) {
  const char* base = static_cast<const char*>(scales);
  if (kInt4ScalePrefetchBlocks != 0) {
    _mm_prefetch(base + (block + kInt4ScalePrefetchBlocks) * block_stride * scale_bytes,
                 _MM_HINT_T0);
  }
  _mm_prefetch(base + block * block_stride * scale_bytes + 64, _MM_HINT_T0);
}

}  // namespace

}  // namespace qmoe

#endif  // QMOE_LIB_CPU_COMMON_INT4_PREFETCH_H_
