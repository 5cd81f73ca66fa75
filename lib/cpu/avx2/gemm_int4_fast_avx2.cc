// AVX2 INT4 dequant-GEMM, fast level, with vpmaddubsw products: the kernel body is in
// gemm_int4_fast_avx2.inc (its comment has the layout and reduction); this file supplies the
// dot products. Each int16 lane sums two products (|15 * 127 * 2| = 3810) and the two halves
// are added (<= 7620) before vpmaddwd widens to int32, so nothing saturates.
#include <immintrin.h>

#include "lib/cpu/avx2/kernels_avx2.h"
#include "lib/quant_layout.h"

namespace qmoe::avx2 {
namespace {

// Eight rows' int32 dot products for one chunk and one activation row: `kLow`/`kHigh` pick
// which halves of the chunk contribute (both for blocks >= 32; one each for block 16).
template <bool kLow, bool kHigh>
inline __m256i chunk_row_sums(const __m256i lo[4], const __m256i hi[4], __m256i x_lo,
                              __m256i x_hi) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i pair[4];
  for (int p = 0; p < 4; ++p) {
    __m256i s16;
    if constexpr (kLow && kHigh) {
      s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[p], x_lo), _mm256_maddubs_epi16(hi[p], x_hi));
    } else if constexpr (kLow) {
      s16 = _mm256_maddubs_epi16(lo[p], x_lo);
    } else {
      s16 = _mm256_maddubs_epi16(hi[p], x_hi);
    }
    pair[p] = _mm256_madd_epi16(s16, ones);
  }
  return _mm256_hadd_epi32(_mm256_hadd_epi32(pair[0], pair[1]),
                           _mm256_hadd_epi32(pair[2], pair[3]));
}

}  // namespace

// Defines gemm_int4_fast (and its templates) in this namespace.
#include "lib/cpu/avx2/gemm_int4_fast_avx2.inc"

}  // namespace qmoe::avx2
