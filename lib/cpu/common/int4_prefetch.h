// How far ahead (bytes) the INT4 CPU kernels software-prefetch their code stream, shared by
// every tier so it is tuned in one place. Overridable at build time
// (-DQMOE_INT4_PREFETCH_BYTES=N) for tuning runs.
//
// Why 3072: the distance must be at least DRAM latency times the stream's rate, with margin;
// shorter distances, and none at all, read cold weights slower, and longer ones are no faster.
// Where DRAM latency is lower the distance matters less, but some software prefetch still beats
// none (docs/results/2026-11-30-int4-gemm-limits.md has the measurements).
#ifndef QMOE_LIB_CPU_COMMON_INT4_PREFETCH_H_
#define QMOE_LIB_CPU_COMMON_INT4_PREFETCH_H_

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

#ifndef QMOE_INT4_PREFETCH_BYTES
#define QMOE_INT4_PREFETCH_BYTES 3072
#endif

// How many scale blocks ahead of the current one the kernels also prefetch the group's scale
// line (0: none, the default). Overridable at build time for tuning runs. Off because it did
// not separate from the noise; the scale stream does cost, but the GEMM driver's prefetch of
// each group's whole scale run a group ahead into L2 (lib/gemm/gemm_rows.cc) covers it
// (docs/results/2026-11-30-int4-gemm-limits.md and docs/results/2026-12-01-int4-gemm-limits.md
// have the measurements).
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

// Called once per `kLines` 64-byte lines of the code stream (INT4 and E2M1: one 128-byte chunk,
// two lines; the 512-bit INT3 body: two 96-byte tiles, three lines): those lines
// kInt4PrefetchBytes ahead into L1, and, when `l2_bytes` is not 0
// (GemmGroupArgs::prefetch_l2_bytes, chosen once per process by lib/gemm/stream_tuning.h), the
// lines `l2_bytes` ahead into L2 only. Prefetches never fault, so running past the end of the
// codes is harmless.
//
// always_inline, because without it GCC 12 (-O3) silently deleted the L2 prefetch: its
// function splitting moved the `if` body into a `.part` function, the pure-const pass found
// that function free of side effects (a prefetch does not count) and so marked it const, and
// the call to a const function returning void was then removed as dead. No kernel contained
// a prefetcht1 until this was found. tests/cmake/check_int4_prefetch.cmake (ctest
// build.int4_kernels_emit_l2_prefetch) fails if a kernel object again holds L1 prefetches
// without the L2 ones.
template <int kLines>
__attribute__((always_inline)) inline void prefetch_code_lines(const uint8_t* codes,
                                                               uint32_t l2_bytes) {
  for (int i = 0; i < kLines; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(codes + kInt4PrefetchBytes + 64 * i), _MM_HINT_T0);
  }
  if (l2_bytes != 0) {
    for (int i = 0; i < kLines; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + l2_bytes + 64 * i), _MM_HINT_T1);
    }
  }
}

// One 128-byte chunk: its two lines.
__attribute__((always_inline)) inline void prefetch_int4_chunk(const uint8_t* codes,
                                                               uint32_t l2_bytes) {
  prefetch_code_lines<2>(codes, l2_bytes);
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
//   did not separate from the noise (docs/results/2026-11-30-int4-gemm-limits.md), so it is off
//   by default.
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
