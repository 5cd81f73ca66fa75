// AVX2 INT4 dequant-GEMM, fast level: int8 activations, u8 x s8 products (vpmaddubsw), one
// 8-row group per call.
//
// Per chunk (32 k, 128 bytes) and pair of rows (r, r+1), one 32-byte load holds both rows'
// 16 bytes; AND and a 4-bit shift give [r: codes 0-15 | r+1: codes 0-15] and the same for
// codes 16-31, which multiply against the activation halves broadcast to both lanes. Nibble
// unpacking costs three instructions per two rows, with no shuffles. Each int16 lane sums two
// products (|15 * 127 * 2| = 3810), the two halves are added (<= 7620) before vpmaddwd widens
// to int32, so nothing saturates. Three vphaddd reduce four pair vectors to one vector of the
// eight row sums in the order [0 2 4 6 1 3 5 7]; scales and zero points are permuted into that
// order once per block, and the accumulators are permuted back once per group.
//
// Zero point z: sum (code - z) * q = dot - z * sum_q (both exact integers in fp32).
#include <immintrin.h>

#include "lib/cpu/avx2/kernels_avx2.h"
#include "lib/quant_layout.h"

namespace qmoe::avx2 {
namespace {

// Codes are read as one stream; prefetch this far ahead (bytes), two lines per chunk.
constexpr size_t kPrefetchDistance = 1536;

// [0 2 4 6 1 3 5 7]: row order of the reduced sums; the inverse restores natural order.
inline __m256i reduced_order() {
  return _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
}
inline __m256i natural_order() {
  return _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
}

template <qmoe_dtype kScale>
constexpr size_t sizeof_scale() {
  return kScale == QMOE_DTYPE_F32 ? 4 : 2;
}

template <qmoe_dtype kScale>
inline __m256 load_scales(const void* base, size_t index) {
  if constexpr (kScale == QMOE_DTYPE_F32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + index);
  } else if constexpr (kScale == QMOE_DTYPE_F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index)));
  } else {
    const __m128i bits = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
}

inline __m256 load_zero_points(const uint8_t* base, size_t index) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(base + index));
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

// Eight rows' int32 dot products for one chunk and one activation row: `lo_sel`/`hi_sel` pick
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

// Rows [m0, m0 + kM) of the activations against the group's 8 rows.
template <qmoe_dtype kScale, bool kZeros, bool kBlock16, int kM>
void fast_tile(const Int4GroupArgs& a, uint32_t m0) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i to_reduced = reduced_order();
  const __m256 default_zero = _mm256_set1_ps(static_cast<float>(kInt4DefaultZeroPoint));
  // Chunks per block is 1, 2 or 4 (block 32, 64, 128): a shift, not a division per chunk.
  const uint32_t block_shift =
      kBlock16 ? 0 : static_cast<uint32_t>(__builtin_ctz(a.block_size / kChunkCodes));

  __m256 acc[kM];
  for (int i = 0; i < kM; ++i) acc[i] = _mm256_setzero_ps();

  const uint8_t* codes = a.codes;
  for (uint32_t c = 0; c < a.chunks; ++c, codes += kChunkBytes) {
    _mm_prefetch(reinterpret_cast<const char*>(codes + kPrefetchDistance), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(codes + kPrefetchDistance + 64), _MM_HINT_T0);
    __m256i lo[4], hi[4];
    for (int p = 0; p < 4; ++p) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * p));
      lo[p] = _mm256_and_si256(bytes, mask);
      hi[p] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
    }
    // Scales (and zero points) of the block(s) this chunk covers, in reduced row order.
    const uint32_t block_a = kBlock16 ? 2 * c : c >> block_shift;
    // In [K/B, N] order a group's scales are one 16-byte slice of a different line per block,
    // shared by four consecutive groups: fetch the line the groups four ahead will read, so
    // those strided misses do not stall the code stream. (Prefetches never fault.)
    _mm_prefetch(static_cast<const char*>(a.scales) +
                     block_a * a.scale_block_stride * sizeof_scale<kScale>() + 64,
                 _MM_HINT_T0);
    const __m256 scale_a = _mm256_permutevar8x32_ps(
        load_scales<kScale>(a.scales, block_a * a.scale_block_stride), to_reduced);
    __m256 zero_a = default_zero, scale_b = scale_a, zero_b = default_zero;
    if constexpr (kZeros) {
      zero_a = _mm256_permutevar8x32_ps(
          load_zero_points(a.zero_points, block_a * a.zero_point_block_stride), to_reduced);
    }
    if constexpr (kBlock16) {
      scale_b = _mm256_permutevar8x32_ps(
          load_scales<kScale>(a.scales, (block_a + 1) * a.scale_block_stride), to_reduced);
      if constexpr (kZeros) {
        zero_b = _mm256_permutevar8x32_ps(
            load_zero_points(a.zero_points, (block_a + 1) * a.zero_point_block_stride), to_reduced);
      }
    }

    for (int i = 0; i < kM; ++i) {
      const uint32_t m = m0 + i;
      const int8_t* q = a.xq.q + m * a.xq.q_stride + c * kChunkCodes;
      const __m256i x_lo =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
      const __m256i x_hi =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)));
      const __m256 x_scale = _mm256_set1_ps(a.xq.scale[m * a.xq.chunk_stride + c]);
      if constexpr (kBlock16) {
        // Block 2c holds codes 0-15, block 2c+1 codes 16-31; each has its own sum of q.
        const int8_t* qa = q;
        int32_t sum_a = 0, sum_b = 0;
        for (int j = 0; j < 16; ++j) {
          sum_a += qa[j];
          sum_b += qa[16 + j];
        }
        const __m256 da = _mm256_cvtepi32_ps(chunk_row_sums<true, false>(lo, hi, x_lo, x_hi));
        const __m256 db = _mm256_cvtepi32_ps(chunk_row_sums<false, true>(lo, hi, x_lo, x_hi));
        const __m256 ta = _mm256_fnmadd_ps(zero_a, _mm256_set1_ps(static_cast<float>(sum_a)), da);
        const __m256 tb = _mm256_fnmadd_ps(zero_b, _mm256_set1_ps(static_cast<float>(sum_b)), db);
        acc[i] = _mm256_fmadd_ps(ta, _mm256_mul_ps(scale_a, x_scale), acc[i]);
        acc[i] = _mm256_fmadd_ps(tb, _mm256_mul_ps(scale_b, x_scale), acc[i]);
      } else {
        const __m256 d = _mm256_cvtepi32_ps(chunk_row_sums<true, true>(lo, hi, x_lo, x_hi));
        const __m256 sum_q = _mm256_set1_ps(a.xq.sum_q[m * a.xq.chunk_stride + c]);
        const __m256 t = _mm256_fnmadd_ps(zero_a, sum_q, d);
        acc[i] = _mm256_fmadd_ps(t, _mm256_mul_ps(scale_a, x_scale), acc[i]);
      }
    }
  }

  const __m256i to_natural = natural_order();
  const __m256 bias = a.bias != nullptr ? _mm256_loadu_ps(a.bias) : _mm256_setzero_ps();
  for (int i = 0; i < kM; ++i) {
    const __m256 out = _mm256_add_ps(_mm256_permutevar8x32_ps(acc[i], to_natural), bias);
    float* y = a.y + (m0 + i) * a.ldy;
    if (a.row_begin == 0 && a.row_end == kGroupRows) {
      _mm256_storeu_ps(y, out);
    } else {
      alignas(32) float lanes[kGroupRows];
      _mm256_store_ps(lanes, out);
      for (uint32_t r = a.row_begin; r < a.row_end; ++r) y[r] = lanes[r];
    }
  }
}

template <qmoe_dtype kScale, bool kZeros, bool kBlock16>
void fast_group(const Int4GroupArgs& a) {
  uint32_t m0 = 0;
  for (; m0 + 4 <= a.m; m0 += 4) fast_tile<kScale, kZeros, kBlock16, 4>(a, m0);
  switch (a.m - m0) {
    case 3:
      fast_tile<kScale, kZeros, kBlock16, 3>(a, m0);
      break;
    case 2:
      fast_tile<kScale, kZeros, kBlock16, 2>(a, m0);
      break;
    case 1:
      fast_tile<kScale, kZeros, kBlock16, 1>(a, m0);
      break;
    default:
      break;
  }
}

template <qmoe_dtype kScale>
void fast_group_for_scale(const Int4GroupArgs& a) {
  const bool zeros = a.zero_points != nullptr;
  const bool block16 = a.block_size == 16;
  if (zeros) {
    block16 ? fast_group<kScale, true, true>(a) : fast_group<kScale, true, false>(a);
  } else {
    block16 ? fast_group<kScale, false, true>(a) : fast_group<kScale, false, false>(a);
  }
}

}  // namespace

void gemm_int4_fast(const Int4GroupArgs& a) {
  switch (a.scale_dtype) {
    case QMOE_DTYPE_F16:
      fast_group_for_scale<QMOE_DTYPE_F16>(a);
      break;
    case QMOE_DTYPE_BF16:
      fast_group_for_scale<QMOE_DTYPE_BF16>(a);
      break;
    case QMOE_DTYPE_F32:
      fast_group_for_scale<QMOE_DTYPE_F32>(a);
      break;
  }
}

}  // namespace qmoe::avx2
