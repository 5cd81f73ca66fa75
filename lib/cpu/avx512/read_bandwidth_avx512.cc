// Read-bandwidth kernel, AVX-512 tier: the XOR of every 64-bit word of [data, data + bytes),
// read with aligned 64-byte loads (one cache line each), 512 bytes per iteration into eight
// independent accumulators.
//
// Preconditions (checked by the caller): data is 64-byte aligned, bytes is a multiple of 64.
//
// _mm512_xor_epi64 rather than _mm512_xor_si512: with the latter GCC 12 copies every
// accumulator once per iteration (eight extra vmovdqa64 in the loop).
//
// No software prefetch: the hardware stream prefetcher already keeps a sequential read's lines
// in flight. A T0 prefetch a few KiB ahead is no faster, and NTA is much slower, on one core and
// on all (docs/results/2026-11-30-kernel-comment-figures.md has the measurements; the AVX2 twin,
// read_bandwidth_avx2.cc, behaves the same).
#include <immintrin.h>

#include "lib/cpu/kernels.h"

namespace qmoe::avx512 {

uint64_t read_bandwidth(const void* data, size_t bytes) {
  const __m512i* p = static_cast<const __m512i*>(data);
  const __m512i* const end = p + bytes / sizeof(__m512i);

  __m512i acc0 = _mm512_setzero_si512();
  __m512i acc1 = _mm512_setzero_si512();
  __m512i acc2 = _mm512_setzero_si512();
  __m512i acc3 = _mm512_setzero_si512();
  __m512i acc4 = _mm512_setzero_si512();
  __m512i acc5 = _mm512_setzero_si512();
  __m512i acc6 = _mm512_setzero_si512();
  __m512i acc7 = _mm512_setzero_si512();
  for (size_t i = bytes / 512; i != 0; --i, p += 8) {
    acc0 = _mm512_xor_epi64(acc0, _mm512_load_si512(p + 0));
    acc1 = _mm512_xor_epi64(acc1, _mm512_load_si512(p + 1));
    acc2 = _mm512_xor_epi64(acc2, _mm512_load_si512(p + 2));
    acc3 = _mm512_xor_epi64(acc3, _mm512_load_si512(p + 3));
    acc4 = _mm512_xor_epi64(acc4, _mm512_load_si512(p + 4));
    acc5 = _mm512_xor_epi64(acc5, _mm512_load_si512(p + 5));
    acc6 = _mm512_xor_epi64(acc6, _mm512_load_si512(p + 6));
    acc7 = _mm512_xor_epi64(acc7, _mm512_load_si512(p + 7));
  }
  __m512i x = _mm512_xor_epi64(
      _mm512_xor_epi64(_mm512_xor_epi64(acc0, acc1), _mm512_xor_epi64(acc2, acc3)),
      _mm512_xor_epi64(_mm512_xor_epi64(acc4, acc5), _mm512_xor_epi64(acc6, acc7)));
  // Tail: zero to seven whole 64-byte lines, folded into the combined value (folding them into
  // the loop accumulators instead makes GCC copy those registers on every main-loop iteration).
  for (; p != end; ++p) {
    x = _mm512_xor_epi64(x, _mm512_load_si512(p));
  }

  // Horizontal XOR through a lane array rather than _mm512_extracti64x4_epi64 or
  // _mm512_castsi512_si256: GCC 12's headers build those from an "undefined" operand that
  // trips a false -Wuninitialized. It runs once per call.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, x);
  return (lanes[0] ^ lanes[1]) ^ (lanes[2] ^ lanes[3]) ^ (lanes[4] ^ lanes[5]) ^
         (lanes[6] ^ lanes[7]);
}

}  // namespace qmoe::avx512
