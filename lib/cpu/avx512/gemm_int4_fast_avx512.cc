// AVX-512 INT4 dequant-GEMM, fast level: int8 activations, u8 x s8 products (vpmaddubsw), one
// 8-row group per call.
//
// Per chunk (32 k, 128 bytes) two 64-byte loads hold rows 0-3 and rows 4-7, one row per 128-bit
// lane. AND and a 4-bit shift give codes 0-15 and codes 16-31 of four rows, which multiply
// against the activation halves broadcast to all four lanes (vbroadcasti32x4): six instructions
// unpack the whole chunk, with no shuffles. Each int16 lane sums two products
// (|2 * 15 * 127| = 3810) and the two halves are added (<= 7620).
//
// Reduction, per activation row and chunk: the int16 vectors A (rows 0-3) and B (rows 4-7) are
// interleaved by dwords and added (<= 15240, still exact in int16), then one vpmaddwd against
// ones widens to int32 lanes holding partial sums of rows [L, L+4, L, L+4] in 128-bit lane L.
// Four instructions, and no lane of the 16 is wasted: each row owns two lanes, each a partial
// sum. The float epilogue (convert, zero-point correction, scale, accumulate) runs on those
// lanes; scales and zero points are permuted into that order once per chunk (shared by every
// activation row of the tile) and the two partials of a row are added once per group.
//
// Zero point z: sum (code - z) * q = dot - z * sum_q (exact integers in fp32); the correction is
// applied to the first of a row's two lanes only (zeros in the others).
//
// GCC 12's _mm512_undefined_* trips -Wmaybe-uninitialized and -Wuninitialized inside the header
// (GCC bug 105593, fixed in GCC 13); the suppression is scoped to the header's own lines.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "lib/cpu/avx512/kernels_avx512.h"
#include "lib/quant_layout.h"

namespace qmoe::avx512 {
namespace {

// Codes are read as one stream; prefetch this far ahead (bytes), two lines per chunk.
constexpr size_t kPrefetchDistance = 1536;

template <qmoe_dtype kScale>
constexpr size_t sizeof_scale() {
  return kScale == QMOE_DTYPE_F32 ? 4 : 2;
}

// Lane order of the reduced partial sums: 128-bit lane L holds rows [L, L+4, L, L+4].
inline __m512i partial_order() {
  return _mm512_setr_epi32(0, 4, 0, 4, 1, 5, 1, 5, 2, 6, 2, 6, 3, 7, 3, 7);
}
// The first lane of each row in partial order (where the zero-point correction goes).
constexpr __mmask16 kFirstPartial = 0x3333;

// Eight per-row floats of block `index` (8 consecutive elements), in partial order.
template <qmoe_dtype kScale>
inline __m512 load_scales(const void* base, size_t index, __m512i order) {
  __m512 s;
  if constexpr (kScale == QMOE_DTYPE_F32) {
    s = _mm512_zextps256_ps512(_mm256_loadu_ps(static_cast<const float*>(base) + index));
  } else if constexpr (kScale == QMOE_DTYPE_F16) {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index));
    s = _mm512_cvtph_ps(_mm256_zextsi128_si256(h));
  } else {
    const __m128i b = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index));
    s = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_zextsi128_si256(b)), 16));
  }
  return _mm512_permutexvar_ps(order, s);
}

// Zero points of block `index` as floats in the first partial lane of each row, 0 elsewhere.
inline __m512 load_zero_points(const uint8_t* base, size_t index, __m512i order) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(base + index));
  const __m512 z = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
  return _mm512_maskz_permutexvar_ps(kFirstPartial, order, z);
}

// int16 products of four rows (one per 128-bit lane) -> int32 partial sums in partial order:
// a holds rows 0-3, b rows 4-7.
inline __m512i reduce_pairs(__m512i a, __m512i b) {
  const __m512i s = _mm512_add_epi16(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  return _mm512_madd_epi16(s, _mm512_set1_epi16(1));
}

// Partial-order accumulator -> the eight row sums in natural order (low 256 bits).
inline __m256 finish_rows(__m512 acc) {
  // Lanes [L, L+4, L, L+4] -> [L + L, L+4 + L+4, ...]: add the 64-bit halves of each 128 lane.
  const __m512 s = _mm512_add_ps(acc, _mm512_permute_ps(acc, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512i natural = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(natural, s));
}

// Rows [m0, m0 + kM) of the activations against the group's 8 rows.
template <qmoe_dtype kScale, bool kZeros, bool kBlock16, int kM>
void fast_tile(const Int4GroupArgs& a, uint32_t m0) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const __m512i order = partial_order();
  const __m512 default_zero =
      _mm512_maskz_mov_ps(kFirstPartial, _mm512_set1_ps(static_cast<float>(kInt4DefaultZeroPoint)));
  // Chunks per block is 1, 2 or 4 (block 32, 64, 128): a shift, not a division per chunk.
  const uint32_t block_shift =
      kBlock16 ? 0 : static_cast<uint32_t>(__builtin_ctz(a.block_size / kChunkCodes));

  __m512 acc[kM];
  for (int i = 0; i < kM; ++i) acc[i] = _mm512_setzero_ps();

  const uint8_t* codes = a.codes;
  for (uint32_t c = 0; c < a.chunks; ++c, codes += kChunkBytes) {
    _mm_prefetch(reinterpret_cast<const char*>(codes + kPrefetchDistance), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(codes + kPrefetchDistance + 64), _MM_HINT_T0);
    const __m512i b0 = _mm512_loadu_si512(codes);
    const __m512i b1 = _mm512_loadu_si512(codes + 64);
    const __m512i lo0 = _mm512_and_si512(b0, mask);
    const __m512i hi0 = _mm512_and_si512(_mm512_srli_epi16(b0, 4), mask);
    const __m512i lo1 = _mm512_and_si512(b1, mask);
    const __m512i hi1 = _mm512_and_si512(_mm512_srli_epi16(b1, 4), mask);

    // Scales (and zero points) of the block(s) this chunk covers, in partial order.
    const uint32_t block_a = kBlock16 ? 2 * c : c >> block_shift;
    // In [K/B, N] order a group's scales are one 16-byte slice of a different line per block,
    // shared by four consecutive groups: fetch the line the groups four ahead will read, so
    // those strided misses do not stall the code stream. (Prefetches never fault.)
    _mm_prefetch(static_cast<const char*>(a.scales) +
                     block_a * a.scale_block_stride * sizeof_scale<kScale>() + 64,
                 _MM_HINT_T0);
    const __m512 scale_a = load_scales<kScale>(a.scales, block_a * a.scale_block_stride, order);
    __m512 zero_a = default_zero, scale_b = scale_a, zero_b = default_zero;
    if constexpr (kZeros) {
      zero_a = load_zero_points(a.zero_points, block_a * a.zero_point_block_stride, order);
    }
    if constexpr (kBlock16) {
      scale_b = load_scales<kScale>(a.scales, (block_a + 1) * a.scale_block_stride, order);
      if constexpr (kZeros) {
        zero_b = load_zero_points(a.zero_points, (block_a + 1) * a.zero_point_block_stride, order);
      }
    }

    for (int i = 0; i < kM; ++i) {
      const uint32_t m = m0 + i;
      const int8_t* q = a.xq.q + m * a.xq.q_stride + c * kChunkCodes;
      const __m512i x_lo =
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
      const __m512i x_hi =
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)));
      const __m512 x_scale = _mm512_set1_ps(a.xq.scale[m * a.xq.chunk_stride + c]);
      const float chunk_sum = a.xq.sum_q[m * a.xq.chunk_stride + c];
      if constexpr (kBlock16) {
        // Block 2c holds codes 0-15, block 2c+1 codes 16-31; each has its own sum of q:
        // sum_a from the biased byte sums of q[0, 16), sum_b = chunk sum - sum_a.
        const __m128i sad =
            _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)),
                                       _mm_set1_epi8(static_cast<char>(0x80))),
                         _mm_setzero_si128());
        const int32_t sum_a = _mm_cvtsi128_si32(sad) + _mm_extract_epi16(sad, 4) - 16 * 128;
        const float sum_b = chunk_sum - static_cast<float>(sum_a);
        const __m512 da = _mm512_cvtepi32_ps(
            reduce_pairs(_mm512_maddubs_epi16(lo0, x_lo), _mm512_maddubs_epi16(lo1, x_lo)));
        const __m512 db = _mm512_cvtepi32_ps(
            reduce_pairs(_mm512_maddubs_epi16(hi0, x_hi), _mm512_maddubs_epi16(hi1, x_hi)));
        const __m512 ta = _mm512_fnmadd_ps(zero_a, _mm512_set1_ps(static_cast<float>(sum_a)), da);
        const __m512 tb = _mm512_fnmadd_ps(zero_b, _mm512_set1_ps(sum_b), db);
        acc[i] = _mm512_fmadd_ps(ta, _mm512_mul_ps(scale_a, x_scale), acc[i]);
        acc[i] = _mm512_fmadd_ps(tb, _mm512_mul_ps(scale_b, x_scale), acc[i]);
      } else {
        const __m512i s0 =
            _mm512_add_epi16(_mm512_maddubs_epi16(lo0, x_lo), _mm512_maddubs_epi16(hi0, x_hi));
        const __m512i s1 =
            _mm512_add_epi16(_mm512_maddubs_epi16(lo1, x_lo), _mm512_maddubs_epi16(hi1, x_hi));
        const __m512 d = _mm512_cvtepi32_ps(reduce_pairs(s0, s1));
        const __m512 t = _mm512_fnmadd_ps(zero_a, _mm512_set1_ps(chunk_sum), d);
        acc[i] = _mm512_fmadd_ps(t, _mm512_mul_ps(scale_a, x_scale), acc[i]);
      }
    }
  }

  const __m256 bias = a.bias != nullptr ? _mm256_loadu_ps(a.bias) : _mm256_setzero_ps();
  // Rows [row_begin, row_end) only: masked-off lanes are not written.
  const __mmask8 rows =
      static_cast<__mmask8>((0xFFu >> (kGroupRows - a.row_end)) & (0xFFu << a.row_begin));
  for (int i = 0; i < kM; ++i) {
    const __m256 out = _mm256_add_ps(finish_rows(acc[i]), bias);
    _mm256_mask_storeu_ps(a.y + (m0 + i) * a.ldy, rows, out);
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

}  // namespace qmoe::avx512
