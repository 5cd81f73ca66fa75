// AVX512-VNNI INT4 dequant-GEMM, fast level: the AVX-512 fast kernel
// (gemm_int4_fast_8x32_avx512.inc, whose comment has the layout and reduction) with the u8 x s8 dot
// products done by vpdpbusd, which sums four products straight into int32 lanes: two
// instructions per four rows and chunk replace vpmaddubsw, vpmaddubsw, vpaddw and the widening
// vpmaddwd. Compiled with -mavx512vnni in its own translation unit (the compiler may emit VNNI
// anywhere in a file built with that flag); the table entry is taken only when the probe
// reports AVX512-VNNI.
#include <cstring>
#include <type_traits>

#include "lib/cpu/avx512/immintrin_avx512.h"

#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int4_layout.h"

namespace qmoe::avx512vnni {

// M = 1: the 256-bit body with EVEX vpdpbusd (gemm_int4_fast_single_row.inc says why).
namespace ymm {
namespace {
#define QMOE_INT4_DPBUSD256 _mm256_dpbusd_epi32
#include "lib/cpu/common/int4_row_sums_dpbusd.inc"
#undef QMOE_INT4_DPBUSD256
}  // namespace
}  // namespace ymm
#include "lib/cpu/avx512/gemm_int4_fast_single_row.inc"

namespace {

// int32 partials of four rows (one per 128-bit lane; a rows 0-3, b rows 4-7) -> partial
// order. |partial| <= 16 * 15 * 127, exact in int32 and fp32.
inline __m512i reduce_pairs(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}

inline __m512i half_partials(__m512i c0, __m512i c1, __m512i x) {
  const __m512i zero = _mm512_setzero_si512();
  return reduce_pairs(_mm512_dpbusd_epi32(zero, c0, x), _mm512_dpbusd_epi32(zero, c1, x));
}

inline __m512i chunk_partials(__m512i lo0, __m512i lo1, __m512i hi0, __m512i hi1, __m512i x_lo,
                              __m512i x_hi) {
  const __m512i zero = _mm512_setzero_si512();
  return reduce_pairs(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo0, x_lo), hi0, x_hi),
                      _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo1, x_lo), hi1, x_hi));
}

}  // namespace

// Defines gemm_int4_fast_8x32 (and its templates) in this namespace.
#include "lib/cpu/avx512/gemm_int4_fast_8x32_avx512.inc"

}  // namespace qmoe::avx512vnni
