// AVX-VNNI INT4 dequant-GEMM, fast level: the AVX2 fast kernel (gemm_int4_fast_avx2.inc, whose
// comment has the layout and reduction) with the u8 x s8 dot products done by the VEX-encoded
// vpdpbusd, which sums four products straight into int32 lanes: two instructions per pair of
// rows and chunk replace vpmaddubsw, vpmaddubsw, vpaddw and the widening vpmaddwd. Compiled
// with -mavxvnni in its own translation unit (the compiler may emit VNNI anywhere in a file
// built with that flag); the table entry is taken only when the probe reports AVX-VNNI.
#include <immintrin.h>

#include "lib/cpu/avx2/kernels_avx2.h"
#include "lib/cpu/int4_prefetch.h"
#include "lib/quant_layout.h"

namespace qmoe::avxvnni {
namespace {

// Eight rows' int32 dot products for one chunk and one activation row: `kLow`/`kHigh` pick
// which halves of the chunk contribute (both for blocks >= 32; one each for block 16).
template <bool kLow, bool kHigh>
inline __m256i chunk_row_sums(const __m256i lo[4], const __m256i hi[4], __m256i x_lo,
                              __m256i x_hi) {
  __m256i pair[4];
  for (int p = 0; p < 4; ++p) {
    __m256i s = _mm256_setzero_si256();
    if constexpr (kLow) s = _mm256_dpbusd_avx_epi32(s, lo[p], x_lo);
    if constexpr (kHigh) s = _mm256_dpbusd_avx_epi32(s, hi[p], x_hi);
    pair[p] = s;
  }
  return _mm256_hadd_epi32(_mm256_hadd_epi32(pair[0], pair[1]),
                           _mm256_hadd_epi32(pair[2], pair[3]));
}

}  // namespace

// Defines gemm_int4_fast (and its templates) in this namespace.
#include "lib/cpu/avx2/gemm_int4_fast_avx2.inc"

}  // namespace qmoe::avxvnni
