// Read-bandwidth kernel, AVX2 tier: the XOR of every 64-bit word of [data, data + bytes), read
// with aligned 32-byte loads, 256 bytes (four cache lines) per iteration into eight independent
// accumulators so that the load ports, not a dependency chain, set the pace.
//
// Preconditions (checked by the caller): data is 64-byte aligned, bytes is a multiple of 64.
//
// No software prefetch: one prefetch per line, at any distance or hint tried, was no faster and
// often slower, on 4 KiB and 2 MiB pages and on one core or two; in an L2-resident buffer it
// made no difference (docs/results/2026-11-30-kernel-comment-figures.md has the measurements).
// Likely cause: the hardware stream prefetcher already keeps a sequential read's lines in
// flight, so the extra instructions only add pressure on the same miss buffers.
#include <immintrin.h>

#include "lib/cpu/kernels.h"

namespace qmoe::avx2 {

uint64_t read_bandwidth(const void* data, size_t bytes) {
  const __m256i* p = static_cast<const __m256i*>(data);
  const __m256i* const end = p + bytes / sizeof(__m256i);

  __m256i acc0 = _mm256_setzero_si256();
  __m256i acc1 = _mm256_setzero_si256();
  __m256i acc2 = _mm256_setzero_si256();
  __m256i acc3 = _mm256_setzero_si256();
  __m256i acc4 = _mm256_setzero_si256();
  __m256i acc5 = _mm256_setzero_si256();
  __m256i acc6 = _mm256_setzero_si256();
  __m256i acc7 = _mm256_setzero_si256();
  for (size_t i = bytes / 256; i != 0; --i, p += 8) {
    acc0 = _mm256_xor_si256(acc0, _mm256_load_si256(p + 0));
    acc1 = _mm256_xor_si256(acc1, _mm256_load_si256(p + 1));
    acc2 = _mm256_xor_si256(acc2, _mm256_load_si256(p + 2));
    acc3 = _mm256_xor_si256(acc3, _mm256_load_si256(p + 3));
    acc4 = _mm256_xor_si256(acc4, _mm256_load_si256(p + 4));
    acc5 = _mm256_xor_si256(acc5, _mm256_load_si256(p + 5));
    acc6 = _mm256_xor_si256(acc6, _mm256_load_si256(p + 6));
    acc7 = _mm256_xor_si256(acc7, _mm256_load_si256(p + 7));
  }
  __m256i x = _mm256_xor_si256(
      _mm256_xor_si256(_mm256_xor_si256(acc0, acc1), _mm256_xor_si256(acc2, acc3)),
      _mm256_xor_si256(_mm256_xor_si256(acc4, acc5), _mm256_xor_si256(acc6, acc7)));
  // Tail: zero to three whole 64-byte lines, folded into the combined value (folding them into
  // the loop accumulators instead makes GCC copy those registers on every main-loop iteration).
  for (; p != end; p += 2) {
    x = _mm256_xor_si256(x, _mm256_xor_si256(_mm256_load_si256(p), _mm256_load_si256(p + 1)));
  }

  const __m128i y = _mm_xor_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(y)) ^
         static_cast<uint64_t>(_mm_extract_epi64(y, 1));
}

}  // namespace qmoe::avx2
