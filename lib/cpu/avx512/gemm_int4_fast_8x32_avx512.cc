// AVX-512 INT4 dequant-GEMM, fast level, with vpmaddubsw products: the kernel body is in
// gemm_int4_fast_8x32_avx512.inc (its comment has the layout and reduction); this file supplies the
// dot products.
#include <type_traits>
#include "lib/cpu/avx512/immintrin_avx512.h"

#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int4_layout.h"

namespace qmoe::avx512 {
namespace {

// int16 products of four rows (one per 128-bit lane; a rows 0-3, b rows 4-7) -> int32 partial
// sums in partial order: interleaved by dwords and added (<= 15240, still exact in int16),
// then one vpmaddwd against ones widens to int32.
inline __m512i reduce_pairs(__m512i a, __m512i b) {
  const __m512i s = _mm512_add_epi16(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  return _mm512_madd_epi16(s, _mm512_set1_epi16(1));
}

inline __m512i half_partials(__m512i c0, __m512i c1, __m512i x) {
  return reduce_pairs(_mm512_maddubs_epi16(c0, x), _mm512_maddubs_epi16(c1, x));
}

// Each int16 lane sums two products (|2 * 15 * 127| = 3810); the halves add to <= 7620.
inline __m512i chunk_partials(__m512i lo0, __m512i lo1, __m512i hi0, __m512i hi1, __m512i x_lo,
                              __m512i x_hi) {
  return reduce_pairs(
      _mm512_add_epi16(_mm512_maddubs_epi16(lo0, x_lo), _mm512_maddubs_epi16(hi0, x_hi)),
      _mm512_add_epi16(_mm512_maddubs_epi16(lo1, x_lo), _mm512_maddubs_epi16(hi1, x_hi)));
}

}  // namespace

// M = 1: the 256-bit body with vpmaddubsw (gemm_int4_fast_single_row.inc says why).
namespace ymm {
namespace {
#include "lib/cpu/common/int4_row_sums_maddubs.inc"
}  // namespace
}  // namespace ymm
#include "lib/cpu/avx512/gemm_int4_fast_single_row.inc"

// Defines gemm_int4_fast_8x32 (and its templates) in this namespace.
#include "lib/cpu/avx512/gemm_int4_fast_8x32_avx512.inc"

}  // namespace qmoe::avx512
