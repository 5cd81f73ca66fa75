// AVX2 activation quantization for the fast level: per 32 k, scale = max|x| / 127 and
// q = round-half-even(x * (127 / max|x|)) clamped to [-127, 127], the same float operations as
// the scalar tier, so both produce identical q, scales and sums for finite inputs.
#include <immintrin.h>

#include <cstring>

#include "lib/cpu/avx2/kernels_avx2.h"
#include "lib/quant_layout.h"

namespace qmoe::avx2 {
namespace {

inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t horizontal_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// One full chunk of 32 values.
inline void quantize_chunk(const float* x, int8_t* q, float* scale, float* sum_q) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
  const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
  // max(|v|, acc): a NaN lane yields acc, as the scalar tier's comparison does.
  __m256 m = _mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_setzero_ps());
  m = _mm256_max_ps(_mm256_and_ps(v1, abs_mask), m);
  m = _mm256_max_ps(_mm256_and_ps(v2, abs_mask), m);
  m = _mm256_max_ps(_mm256_and_ps(v3, abs_mask), m);
  const float amax = horizontal_max(m);
  const __m256 inv = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
  // As the scalar tier: NaN products become 0 and the rest clamp to [-127, 127] before the
  // conversion (when max|x| < ~3.7e-37, 127 / max|x| is +inf and the products are +-inf).
  const auto scaled = [&inv](__m256 v) {
    __m256 p = _mm256_mul_ps(v, inv);
    p = _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q));
    p = _mm256_max_ps(_mm256_min_ps(p, _mm256_set1_ps(127.0f)), _mm256_set1_ps(-127.0f));
    return _mm256_cvtps_epi32(p);
  };
  const __m256i i0 = scaled(v0);
  const __m256i i1 = scaled(v1);
  const __m256i i2 = scaled(v2);
  const __m256i i3 = scaled(v3);
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
  // packs interleave 128-bit lanes: [i0 lo, i1 lo, i0 hi, i1 hi] -> restore k order.
  const __m256i w01 = _mm256_packs_epi32(i0, i1);
  const __m256i w23 = _mm256_packs_epi32(i2, i3);
  const __m256i b = _mm256_packs_epi16(w01, w23);
  const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  *scale = amax / 127.0f;
  *sum_q = static_cast<float>(horizontal_sum(sum));
}

}  // namespace

void quantize_activations_q8(const float* x, size_t k, int8_t* q, float* scale, float* sum_q) {
  const size_t full = k / kChunkCodes;
  for (size_t c = 0; c < full; ++c) {
    quantize_chunk(x + c * kChunkCodes, q + c * kChunkCodes, scale + c, sum_q + c);
  }
  if (const size_t tail = k - full * kChunkCodes; tail != 0) {
    // Zero-padded copy: padding quantizes to 0 and does not change max|x|.
    alignas(32) float last[kChunkCodes] = {};
    std::memcpy(last, x + full * kChunkCodes, tail * sizeof(float));
    quantize_chunk(last, q + full * kChunkCodes, scale + full, sum_q + full);
  }
}

}  // namespace qmoe::avx2
