// AVX-512 activation quantization for the fast level: per 32 k, scale = max|x| / 127 and
// q = round-half-even(x * (127 / max|x|)), the same float operations as the scalar tier
// (division, multiplication, conversion by MXCSR as __builtin_nearbyintf does), so every tier
// produces identical q, scales and sums for finite inputs.
//
// Eight chunks at a time: their eight maxima and eight sums are reduced together by one
// transpose-and-combine tree each (about three instructions per chunk instead of eight), and
// the sixteen divisions (127 / max and max / 127) are two 8-lane vdivps instead of sixteen
// vdivss, which were the limit of the one-chunk loop. Remaining chunks and a partial last chunk
// (masked loads: nothing past x + k is touched; padding quantizes to 0) take the one-chunk path.
//
// A chunk whose max|x| is below kQ8FlushBelow (zero included) gives q = 0 and scale 0
// (lib/formats/int4_layout.h says why). Every other 127 / max|x| is finite and |x * inv| < 127.5,
// so no product needs the scalar tier's clamp to [-127, 127] (it changes nothing there either). A
// NaN product (x NaN, or x = +-Inf where inv = 127 / Inf = 0) maps to 0, as in the scalar tier.
#include "lib/cpu/avx512/immintrin_avx512.h"

#include "lib/cpu/kernels.h"
#include "lib/formats/int4_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::avx512 {
namespace {

// round(v * inv) as int32, NaN -> 0 (no clamp: see above).
inline __m512i quantize_lanes(__m512 v, __m512 inv) {
  const __m512 t = _mm512_mul_ps(v, inv);
  return _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask(t, t, _CMP_ORD_Q), t);
}

// max(|v0|, |v1|, 0) lane-wise: a NaN lane yields the other operand, as the scalar tier's
// comparison skips NaN.
inline __m512 lane_max(__m512 v0, __m512 v1) {
  const __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps());
  return _mm512_max_ps(_mm512_abs_ps(v1), m);
}

// Eight 16-lane vectors -> lane j of the result combines the 16 lanes of v[j] with `op`.
template <typename Op>
inline __m256 combine8(const __m512 v[8], Op op) {
  __m512 pair[4];  // 128-bit lanes [v(L0 L2), v(L1 L3), v'(L0 L2), v'(L1 L3)]
  for (int p = 0; p < 4; ++p) {
    pair[p] = op(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                 _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  __m512 quad[2];  // 128-bit lane i of quad[h]: four partials of v[4h + i]
  for (int h = 0; h < 2; ++h) {
    quad[h] = op(_mm512_shuffle_f32x4(pair[2 * h], pair[2 * h + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                 _mm512_shuffle_f32x4(pair[2 * h], pair[2 * h + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  __m512 s = op(_mm512_unpacklo_ps(quad[0], quad[1]), _mm512_unpackhi_ps(quad[0], quad[1]));
  s = op(s, _mm512_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));  // lane (i, 0): v[i], (i, 1): v[i+4]
  const __m512i natural = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(natural, s));
}

inline __m512 max_op(__m512 a, __m512 b) {
  return _mm512_max_ps(a, b);
}
inline __m512 add_epi32_op(__m512 a, __m512 b) {
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

// Chunks j = 0..7 at x + 32 j, whose 127 / max values are inv[j].
inline void quantize_8_chunks(const float* x, const float inv[8], int8_t* q, float* sum_q) {
  __m512 sums[8];
  for (int j = 0; j < 8; ++j) {
    const __m512 v = _mm512_set1_ps(inv[j]);
    const __m512i i0 = quantize_lanes(_mm512_loadu_ps(x + 32 * j), v);
    const __m512i i1 = quantize_lanes(_mm512_loadu_ps(x + 32 * j + 16), v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * j), _mm512_cvtepi32_epi8(i0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * j + 16), _mm512_cvtepi32_epi8(i1));
    sums[j] = _mm512_castsi512_ps(_mm512_add_epi32(i0, i1));
  }
  _mm256_storeu_ps(sum_q, _mm256_cvtepi32_ps(_mm256_castps_si256(combine8(sums, add_epi32_op))));
}

void quantize_batch(const float* x, int8_t* q, float* scale, float* sum_q) {
  __m512 m[8];
  for (int j = 0; j < 8; ++j) {
    m[j] = lane_max(_mm512_loadu_ps(x + 32 * j), _mm512_loadu_ps(x + 32 * j + 16));
  }
  const __m256 amax = combine8(m, max_op);  // exact: max of non-NaN values in any order
  // 127 / amax and amax / 127 correctly rounded like the scalar divisions, 0 in flushed lanes;
  // masked-off lanes raise no flag, so nothing divides by zero.
  const __mmask8 keep = _mm256_cmp_ps_mask(amax, _mm256_set1_ps(kQ8FlushBelow), _CMP_GE_OQ);
  const __m256 inv = _mm256_maskz_div_ps(keep, _mm256_set1_ps(127.0f), amax);
  _mm256_storeu_ps(scale, _mm256_maskz_div_ps(keep, amax, _mm256_set1_ps(127.0f)));
  alignas(32) float inv_lanes[8];
  _mm256_store_ps(inv_lanes, inv);
  quantize_8_chunks(x, inv_lanes, q, sum_q);
}

// One chunk of 32 values, lanes outside the masks m0, m1 read as 0.
inline void quantize_chunk(const float* x, __mmask16 m0, __mmask16 m1, int8_t* q, float* scale,
                           float* sum_q) {
  const __m512 v0 = _mm512_maskz_loadu_ps(m0, x);
  const __m512 v1 = _mm512_maskz_loadu_ps(m1, x + 16);
  const float amax = _mm512_reduce_max_ps(lane_max(v0, v1));
  const bool flush = amax < kQ8FlushBelow;
  const __m512 inv = _mm512_set1_ps(flush ? 0.0f : 127.0f / amax);
  const __m512i i0 = quantize_lanes(v0, inv);
  const __m512i i1 = quantize_lanes(v1, inv);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(i0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(i1));
  *scale = flush ? 0.0f : amax / 127.0f;
  *sum_q = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1)));
}

}  // namespace

void quantize_activations_q8(const float* x, size_t k, int8_t* q, float* scale, float* sum_q) {
  const size_t full = k / kChunkCodes;
  size_t c = 0;
  for (; c + 8 <= full; c += 8) {
    quantize_batch(x + c * kChunkCodes, q + c * kChunkCodes, scale + c, sum_q + c);
  }
  for (; c < full; ++c) {
    quantize_chunk(x + c * kChunkCodes, 0xFFFF, 0xFFFF, q + c * kChunkCodes, scale + c, sum_q + c);
  }
  if (const size_t tail = k - full * kChunkCodes; tail != 0) {
    // tail in 1..31: lanes [0, tail) of the 32.
    const uint32_t lanes = (1u << tail) - 1u;
    quantize_chunk(x + full * kChunkCodes, static_cast<__mmask16>(lanes),
                   static_cast<__mmask16>(lanes >> 16), q + full * kChunkCodes, scale + full,
                   sum_q + full);
  }
}

}  // namespace qmoe::avx512
