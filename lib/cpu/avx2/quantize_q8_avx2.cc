// AVX2 activation quantization for the fast level: per 32 k, scale = max|x| / 127 and
// q = round-half-even(x * (127 / max|x|)) clamped to [-127, 127], the same float operations as
// the scalar tier, so both produce identical q, scales and sums for every input. A chunk whose
// max|x| is below kQ8FlushBelow (zero included) gives q = 0 and scale 0
// (lib/formats/int4_layout.h).
//
// Eight chunks at a time: their eight maxima and eight sums are reduced together by one
// transpose-and-combine tree each (21 instructions for eight chunks instead of about six per
// chunk), and the sixteen divisions are two 8-lane vdivps instead of sixteen vdivss. The maxima
// are taken over the absolute values' bit patterns as integers, which order every non-negative
// float as the float comparison does and put NaN above +Inf: one compare then tells whether a
// batch holds a NaN or an Inf. A batch of finite values quantizes with one multiply and one
// conversion per vector: |x| <= max gives |x * inv| <= 127 * (1 + 2^-24)^2 < 127.5 (inv is
// finite: flushed chunks have inv = 0), which converts to at most 127, so the scalar tier's
// clamp would change nothing and no product is NaN. Any other batch, and the last full chunks
// and a partial one, take the one-chunk path, which maps NaN to 0 as the scalar tier does.
#include <immintrin.h>

#include <cstring>

#include "lib/cpu/kernels.h"
#include "lib/formats/int4_layout.h"
#include "lib/gemm/group_args.h"

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

// A chunk's 32 quantized values (four vectors of int32 lanes) stored as int8 in k order (packs
// interleave 128-bit lanes: [i0 lo, i1 lo, i0 hi, i1 hi], which the permute restores); returns
// their lane-wise sum, whose eight lanes add up to the chunk's sum_q.
inline __m256i store_q8(__m256i i0, __m256i i1, __m256i i2, __m256i i3, int8_t* q) {
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  return _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
}

// One full chunk of 32 values, any input.
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
  const bool flush = amax < kQ8FlushBelow;
  const __m256 inv = _mm256_set1_ps(flush ? 0.0f : 127.0f / amax);
  // As the scalar tier: NaN products become 0 (with an Inf in the chunk, inv is 0 and that
  // product NaN). The scalar tier's clamp to [-127, 127] changes nothing: inv is finite, so
  // |x * inv| < 127.5 (see the top of the file).
  const auto scaled = [&inv](__m256 v) {
    const __m256 p = _mm256_mul_ps(v, inv);
    return _mm256_cvtps_epi32(_mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q)));
  };
  const __m256i i0 = scaled(v0);
  const __m256i i1 = scaled(v1);
  const __m256i i2 = scaled(v2);
  const __m256i i3 = scaled(v3);
  const __m256i sum = store_q8(i0, i1, i2, i3, q);
  *scale = flush ? 0.0f : amax / 127.0f;
  *sum_q = static_cast<float>(horizontal_sum(sum));
}

// Eight 8-lane vectors -> lane j of the result combines the 8 lanes of v[j] with `op`.
template <typename Op>
inline __m256i combine8(const __m256i v[8], Op op) {
  __m256i quad[2];  // 128-bit lane h of quad[g]: lane h of v[4g + 0..3], each fully combined
  for (int g = 0; g < 2; ++g) {
    __m256i pair[2];  // per 128-bit lane: [a(0,2) b(0,2) a(1,3) b(1,3)] of v[4g + 2p], v[.. + 1]
    for (int p = 0; p < 2; ++p) {
      const __m256i a = v[4 * g + 2 * p], b = v[4 * g + 2 * p + 1];
      pair[p] = op(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    }
    quad[g] = op(_mm256_unpacklo_epi64(pair[0], pair[1]), _mm256_unpackhi_epi64(pair[0], pair[1]));
  }
  // quad[g]'s 32-bit lanes: [v0 v1 v2 v3 | v0 v1 v2 v3] of its four, each half over its own
  // 128-bit lane: combining the halves finishes v[0..3] in lanes 0-3 and v[4..7] in 4-7.
  return op(_mm256_permute2x128_si256(quad[0], quad[1], 0x20),
            _mm256_permute2x128_si256(quad[0], quad[1], 0x31));
}

// Chunks j = 0..7 at x + 32 j; false (nothing written) when the batch needs the one-chunk path.
inline bool quantize_batch(const float* x, int8_t* q, float* scale, float* sum_q) {
  const __m256i abs_bits = _mm256_set1_epi32(0x7FFFFFFF);
  const auto bits = [&abs_bits](const float* p) {
    return _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(p)), abs_bits);
  };
  __m256i m[8];
  for (int j = 0; j < 8; ++j) {
    const float* c = x + 32 * j;
    m[j] = _mm256_max_epi32(_mm256_max_epi32(bits(c), bits(c + 8)),
                            _mm256_max_epi32(bits(c + 16), bits(c + 24)));
  }
  const __m256i amax_bits =
      combine8(m, [](__m256i a, __m256i b) { return _mm256_max_epi32(a, b); });
  // NaN or Inf among the values (bit pattern >= +Inf's): the one-chunk path maps them.
  if (_mm256_movemask_ps(
          _mm256_castsi256_ps(_mm256_cmpgt_epi32(amax_bits, _mm256_set1_epi32(0x7F7FFFFF)))) != 0) {
    return false;
  }
  const __m256 amax = _mm256_castsi256_ps(amax_bits);
  // Flushed lanes (max below kQ8FlushBelow, zero included) get inv = 0 and scale 0; the others
  // 127 / max and max / 127 correctly rounded like the scalar divisions. The divisions run on
  // max(amax, kQ8FlushBelow), so no lane divides by zero.
  const __m256 keep = _mm256_cmp_ps(amax, _mm256_set1_ps(kQ8FlushBelow), _CMP_GE_OQ);
  const __m256 safe = _mm256_max_ps(amax, _mm256_set1_ps(kQ8FlushBelow));
  const __m256 inv = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(127.0f), safe), keep);
  alignas(32) float inv_lanes[8];
  _mm256_store_ps(inv_lanes, inv);
  __m256i sums[8];
  for (int j = 0; j < 8; ++j) {
    const float* c = x + 32 * j;
    const __m256 v = _mm256_set1_ps(inv_lanes[j]);
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c), v));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c + 8), v));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c + 16), v));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c + 24), v));
    sums[j] = store_q8(i0, i1, i2, i3, q + 32 * j);
  }
  _mm256_storeu_ps(scale, _mm256_and_ps(_mm256_div_ps(safe, _mm256_set1_ps(127.0f)), keep));
  _mm256_storeu_ps(sum_q, _mm256_cvtepi32_ps(combine8(
                              sums, [](__m256i a, __m256i b) { return _mm256_add_epi32(a, b); })));
  return true;
}

}  // namespace

void quantize_activations_q8(const float* x, size_t k, int8_t* q, float* scale, float* sum_q) {
  const size_t full = k / kChunkCodes;
  for (size_t c = 0; c < full;) {
    if (c + 8 <= full &&
        quantize_batch(x + c * kChunkCodes, q + c * kChunkCodes, scale + c, sum_q + c)) {
      c += 8;
      continue;
    }
    // The batch's chunks one at a time (or the last fewer than eight).
    const size_t end = c + 8 <= full ? c + 8 : full;
    for (; c < end; ++c) {
      quantize_chunk(x + c * kChunkCodes, q + c * kChunkCodes, scale + c, sum_q + c);
    }
  }
  if (const size_t tail = k - full * kChunkCodes; tail != 0) {
    // Zero-padded copy: padding quantizes to 0 and does not change max|x|.
    alignas(32) float last[kChunkCodes] = {};
    std::memcpy(last, x + full * kChunkCodes, tail * sizeof(float));
    quantize_chunk(last, q + full * kChunkCodes, scale + full, sum_q + full);
  }
}

}  // namespace qmoe::avx2
