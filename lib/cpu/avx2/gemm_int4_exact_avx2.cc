// AVX2 INT4 dequant-GEMM, exact level: FP32 activations and accumulation, one 8-row group per
// call.
//
// Per chunk (32 k, 128 bytes): for each pair of rows one 32-byte load, AND / shift for the two
// nibble halves and a byte subtract of the zero points give signed codes (code - z) in
// [-15, 15]; vpmovsxbd + vcvtdq2ps widen them to a 1 KiB float tile of the chunk's 8 x 32
// weights, converted once and reused by every activation row of the tile (M > 1 costs only the
// FMAs). Each row's 32 products accumulate in one 8-lane vector (4 FMAs); eight rows reduce
// with in-lane unpack/add levels (reduce_rows) to one vector of row sums, scaled by the block's
// scales into the accumulator.
// M = 1 takes its own path (exact_single_row, below) that converts in registers. The limit of
// both is the conversion; docs/benchmarks.md has the measurements.
#include <immintrin.h>

#include "lib/cpu/avx2/kernels_avx2.h"
#include "lib/cpu/int4_group_dispatch.h"
#include "lib/cpu/int4_prefetch.h"
#include "lib/quant_layout.h"

namespace qmoe::avx2 {
namespace {

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

// [z_{2p} x16 | z_{2p+1} x16] from the block's eight zero points (bytes 0-7 of `zeros`).
inline __m256i pair_zero_points(__m256i zeros, int p) {
  const __m256i select =
      _mm256_setr_epi64x(0x0101010101010101ll * (2 * p), 0x0101010101010101ll * (2 * p),
                         0x0101010101010101ll * (2 * p + 1), 0x0101010101010101ll * (2 * p + 1));
  return _mm256_shuffle_epi8(zeros, select);
}

inline __m256i load_zero_bytes(const uint8_t* base, size_t index) {
  int64_t eight;
  __builtin_memcpy(&eight, base + index, 8);
  return _mm256_set1_epi64x(eight);
}

// The zero points of the chunk's block(s) as bytes 0-7 of *zeros_a (first 16 k) and *zeros_b
// (last 16 k; the same block unless the block size is 16); all 8 without a zero-point plane.
template <bool kZeros, bool kBlock16>
inline void chunk_zero_points(const Int4GroupArgs& a, uint32_t block_a, __m256i* zeros_a,
                              __m256i* zeros_b) {
  const __m256i default_zero = _mm256_set1_epi8(static_cast<char>(kInt4DefaultZeroPoint));
  *zeros_a = *zeros_b = default_zero;
  if constexpr (kZeros) {
    *zeros_a = load_zero_bytes(a.zero_points, block_a * a.zero_point_block_stride);
    *zeros_b = kBlock16 ? load_zero_bytes(a.zero_points, (block_a + 1) * a.zero_point_block_stride)
                        : *zeros_a;
  }
}

// Rows 2p and 2p + 1 of a chunk as int8 (code - z): *lo = [2p: k 0-15 | 2p+1: k 0-15],
// *hi = [2p: k 16-31 | 2p+1: k 16-31], in [-15, 15].
template <bool kZeros>
inline void signed_pair_codes(const uint8_t* codes, int p, __m256i zeros_a, __m256i zeros_b,
                              __m256i* lo, __m256i* hi) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * p));
  const __m256i l = _mm256_and_si256(bytes, mask);
  const __m256i h = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
  if constexpr (kZeros) {
    *lo = _mm256_sub_epi8(l, pair_zero_points(zeros_a, p));
    *hi = _mm256_sub_epi8(h, pair_zero_points(zeros_b, p));
  } else {  // zeros_a = zeros_b = 8 in every byte
    *lo = _mm256_sub_epi8(l, zeros_a);
    *hi = _mm256_sub_epi8(h, zeros_b);
  }
}

// The in-lane reduction levels shared by both paths. Per 128-bit lane:
//   interleave_add(a, b) = [a0+a2, b0+b2, a1+a3, b1+b3]
//   qwords_add(u, v)     = [u0+u2, u1+u3, v0+v2, v1+v3]
// so qwords_add(interleave_add(a, b), interleave_add(c, d)) = the lane sums of [a, b, c, d].
inline __m256 interleave_add(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
}
inline __m256 qwords_add(__m256 u, __m256 v) {
  const __m256d du = _mm256_castps_pd(u), dv = _mm256_castps_pd(v);
  return _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(du, dv)),
                       _mm256_castpd_ps(_mm256_unpackhi_pd(du, dv)));
}

// Eight rows' sums t[0..7] (one 8-lane vector each) -> one vector of row sums, natural order.
// In-lane unpack/add levels then one cross-lane add, not vhaddps (about 2.3 cycles each on
// Zen 3): [t0..t3 sums | t4..t7 sums] of each 128-bit lane, then the two lanes added.
inline __m256 reduce_rows(const __m256 t[8]) {
  const __m256 r0123 = qwords_add(interleave_add(t[0], t[1]), interleave_add(t[2], t[3]));
  const __m256 r4567 = qwords_add(interleave_add(t[4], t[5]), interleave_add(t[6], t[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(r0123, r4567, 0x20),
                       _mm256_permute2f128_ps(r0123, r4567, 0x31));
}

template <qmoe_dtype kScale, bool kZeros, bool kBlock16, int kM>
void exact_tile(const Int4GroupArgs& a, uint32_t m0) {
  // Chunks per block is 1, 2 or 4 (block 32, 64, 128): a shift, not a division per chunk.
  const uint32_t block_shift =
      kBlock16 ? 0 : static_cast<uint32_t>(__builtin_ctz(a.block_size / kChunkCodes));

  __m256 acc[kM];
  for (int i = 0; i < kM; ++i) acc[i] = _mm256_setzero_ps();

  // The chunk's weights (code - z) as floats, row r at 32r.
  alignas(32) float wf[kGroupRows * kChunkCodes];

  const uint8_t* codes = a.codes;
  for (uint32_t c = 0; c < a.chunks; ++c, codes += kChunkBytes) {
    prefetch_int4_chunk(codes, a.prefetch_l2_bytes);
    const uint32_t block_a = kBlock16 ? 2 * c : c >> block_shift;
    // In [K/B, N] order a group's scales are one 16-byte slice of a different line per block,
    // shared by four consecutive groups: fetch the line the groups four ahead will read, so
    // those strided misses do not stall the code stream. (Prefetches never fault.)
    _mm_prefetch(static_cast<const char*>(a.scales) +
                     block_a * a.scale_block_stride * sizeof_scale<kScale>() + 64,
                 _MM_HINT_T0);
    __m256i zeros_a, zeros_b;
    chunk_zero_points<kZeros, kBlock16>(a, block_a, &zeros_a, &zeros_b);
    for (int p = 0; p < 4; ++p) {
      __m256i lo, hi;
      signed_pair_codes<kZeros>(codes, p, zeros_a, zeros_b, &lo, &hi);
      // lo = [r: k 0-15 | r+1: k 0-15], hi = [r: k 16-31 | r+1: k 16-31] as int8.
      const __m128i lo_r = _mm256_castsi256_si128(lo), lo_r1 = _mm256_extracti128_si256(lo, 1);
      const __m128i hi_r = _mm256_castsi256_si128(hi), hi_r1 = _mm256_extracti128_si256(hi, 1);
      float* w0 = wf + (2 * p) * kChunkCodes;
      float* w1 = w0 + kChunkCodes;
      _mm256_store_ps(w0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo_r)));
      _mm256_store_ps(w0 + 8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo_r, 8))));
      _mm256_store_ps(w0 + 16, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi_r)));
      _mm256_store_ps(w0 + 24, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi_r, 8))));
      _mm256_store_ps(w1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo_r1)));
      _mm256_store_ps(w1 + 8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo_r1, 8))));
      _mm256_store_ps(w1 + 16, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi_r1)));
      _mm256_store_ps(w1 + 24, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi_r1, 8))));
    }

    const __m256 scale_a = load_scales<kScale>(a.scales, block_a * a.scale_block_stride);
    const __m256 scale_b =
        kBlock16 ? load_scales<kScale>(a.scales, (block_a + 1) * a.scale_block_stride) : scale_a;

    for (int i = 0; i < kM; ++i) {
      const float* x = a.x + (m0 + i) * a.ldx + c * kChunkCodes;
      const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
      const __m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
      __m256 ta[8], tb[8];
      for (int r = 0; r < 8; ++r) {
        const float* row = wf + r * kChunkCodes;
        __m256 s_lo = _mm256_mul_ps(_mm256_load_ps(row), x0);
        s_lo = _mm256_fmadd_ps(_mm256_load_ps(row + 8), x1, s_lo);
        __m256 s_hi = _mm256_mul_ps(_mm256_load_ps(row + 16), x2);
        s_hi = _mm256_fmadd_ps(_mm256_load_ps(row + 24), x3, s_hi);
        if constexpr (kBlock16) {
          ta[r] = s_lo;
          tb[r] = s_hi;
        } else {
          ta[r] = _mm256_add_ps(s_lo, s_hi);
        }
      }
      acc[i] = _mm256_fmadd_ps(reduce_rows(ta), scale_a, acc[i]);
      if constexpr (kBlock16) acc[i] = _mm256_fmadd_ps(reduce_rows(tb), scale_b, acc[i]);
    }
  }

  const __m256 bias = a.bias != nullptr ? _mm256_loadu_ps(a.bias) : _mm256_setzero_ps();
  for (int i = 0; i < kM; ++i) {
    const __m256 out = _mm256_add_ps(acc[i], bias);
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

// M = 1 (decode), conversion without lane-crossing shuffles. One 32-byte load holds rows 2p and
// 2p + 1 of a chunk; AND / shift give their codes k 0-15 (`lo`) and k 16-31 (`hi`) as bytes,
// one row per 128-bit lane. vpshufb with selector q zero-extends bytes 4q..4q+3 of each lane
// into int32 lanes, so one in-lane shuffle yields [2p: k 4q..4q+3 | 2p+1: the same k], which
// multiply against x[4q..4q+3] broadcast to both lanes: per 8 weights vpshufb, vpsubd (the
// zero point, exact in int32), vcvtdq2ps and one FMA, and X is read in its natural order.
// (The stored tile above widens with vpmovsxbd, a lane-crossing shuffle of about 1.3 cycles on
// Zen 3, plus vpsrldq / vextracti128 for the upper bytes: that is what limited this path.)
// Each pair's products collect in two FMA chains (k 0-15, k 16-31) per chunk, summed per pair
// (one chain of eight FMAs was slower; keeping all eight partials live spilled registers); an
// in-lane unpack tree reduces the four pairs to the eight row sums in the order
// [0 2 4 6 | 1 3 5 7], times the block scales permuted into that order; the accumulator
// returns to natural order once per group.
inline __m256i byte_to_dword_selector(int q) {
  // Bytes 4q..4q+3 of each 128-bit lane, each to the low byte of a dword (0x80: zero).
  const int b = 4 * q;
  return _mm256_setr_epi8(b, -128, -128, -128, b + 1, -128, -128, -128, b + 2, -128, -128, -128,
                          b + 3, -128, -128, -128, b, -128, -128, -128, b + 1, -128, -128, -128,
                          b + 2, -128, -128, -128, b + 3, -128, -128, -128);
}

// [z_{2p} x4 | z_{2p+1} x4] as int32 from a block's eight zero points (bytes 0-7 of `zeros`).
inline __m256i pair_zero_dwords(__m256i zeros, int p) {
  const char r0 = static_cast<char>(2 * p), r1 = static_cast<char>(2 * p + 1), z = -128;
  return _mm256_shuffle_epi8(
      zeros, _mm256_setr_epi8(r0, z, z, z, r0, z, z, z, r0, z, z, z, r0, z, z, z, r1, z, z, z, r1,
                              z, z, z, r1, z, z, z, r1, z, z, z));
}

// Four pairs' 8-lane float partials [2p: 4 | 2p+1: 4] -> the eight row sums in the order
// [0 2 4 6 | 1 3 5 7].
inline __m256 reduce_pairs(const __m256 t[4]) {
  return qwords_add(interleave_add(t[0], t[1]), interleave_add(t[2], t[3]));
}

template <qmoe_dtype kScale, bool kZeros, bool kBlock16>
void exact_single_row(const Int4GroupArgs& a) {
  const uint32_t block_shift =
      kBlock16 ? 0 : static_cast<uint32_t>(__builtin_ctz(a.block_size / kChunkCodes));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i to_reduced = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i default_zero = _mm256_set1_epi32(static_cast<int>(kInt4DefaultZeroPoint));
  __m256 acc = _mm256_setzero_ps();

  const uint8_t* codes = a.codes;
  const float* x = a.x;
  for (uint32_t c = 0; c < a.chunks; ++c, codes += kChunkBytes, x += kChunkCodes) {
    prefetch_int4_chunk(codes, a.prefetch_l2_bytes);
    const uint32_t block_a = kBlock16 ? 2 * c : c >> block_shift;
    _mm_prefetch(static_cast<const char*>(a.scales) +
                     block_a * a.scale_block_stride * sizeof_scale<kScale>() + 64,
                 _MM_HINT_T0);
    __m256i zeros_a, zeros_b;
    chunk_zero_points<kZeros, kBlock16>(a, block_a, &zeros_a, &zeros_b);

    // Partials of pair p: for blocks >= 32, t_lo[p] holds all 32 k (both halves share the
    // block's scale); for block 16, t_lo[p] holds k 0-15 and t_hi[p] k 16-31.
    __m256 t_lo[4], t_hi[4];
    for (int p = 0; p < 4; ++p) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * p));
      const __m256i lo = _mm256_and_si256(bytes, mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
      __m256i z_lo = default_zero, z_hi = default_zero;
      if constexpr (kZeros) {
        z_lo = pair_zero_dwords(zeros_a, p);
        z_hi = pair_zero_dwords(zeros_b, p);
      }
      __m256 s_lo = _mm256_setzero_ps(), s_hi = _mm256_setzero_ps();
      for (int q = 0; q < 4; ++q) {
        const __m256i select = byte_to_dword_selector(q);
        const __m256 w_lo =
            _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_shuffle_epi8(lo, select), z_lo));
        const __m256 w_hi =
            _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_shuffle_epi8(hi, select), z_hi));
        const __m256 x_lo = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x + 4 * q));
        const __m256 x_hi = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x + 16 + 4 * q));
        s_lo = q == 0 ? _mm256_mul_ps(w_lo, x_lo) : _mm256_fmadd_ps(w_lo, x_lo, s_lo);
        s_hi = q == 0 ? _mm256_mul_ps(w_hi, x_hi) : _mm256_fmadd_ps(w_hi, x_hi, s_hi);
      }
      if constexpr (kBlock16) {
        t_lo[p] = s_lo;
        t_hi[p] = s_hi;
      } else {
        t_lo[p] = _mm256_add_ps(s_lo, s_hi);
      }
    }

    const __m256 scale_a = _mm256_permutevar8x32_ps(
        load_scales<kScale>(a.scales, block_a * a.scale_block_stride), to_reduced);
    acc = _mm256_fmadd_ps(reduce_pairs(t_lo), scale_a, acc);
    if constexpr (kBlock16) {
      const __m256 scale_b = _mm256_permutevar8x32_ps(
          load_scales<kScale>(a.scales, (block_a + 1) * a.scale_block_stride), to_reduced);
      acc = _mm256_fmadd_ps(reduce_pairs(t_hi), scale_b, acc);
    }
  }

  const __m256i to_natural = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256 bias = a.bias != nullptr ? _mm256_loadu_ps(a.bias) : _mm256_setzero_ps();
  const __m256 out = _mm256_add_ps(_mm256_permutevar8x32_ps(acc, to_natural), bias);
  if (a.row_begin == 0 && a.row_end == kGroupRows) {
    _mm256_storeu_ps(a.y, out);
  } else {
    alignas(32) float lanes[kGroupRows];
    _mm256_store_ps(lanes, out);
    for (uint32_t r = a.row_begin; r < a.row_end; ++r) a.y[r] = lanes[r];
  }
}

template <qmoe_dtype kScale, bool kZeros, bool kBlock16>
void exact_group(const Int4GroupArgs& a) {
  if (a.m == 1) {
    exact_single_row<kScale, kZeros, kBlock16>(a);
    return;
  }
  uint32_t m0 = 0;
  for (; m0 + 2 <= a.m; m0 += 2) exact_tile<kScale, kZeros, kBlock16, 2>(a, m0);
  if (m0 < a.m) exact_tile<kScale, kZeros, kBlock16, 1>(a, m0);
}

}  // namespace

void gemm_int4_exact(const Int4GroupArgs& a) {
  dispatch_int4_group(a, [&a](auto scale, auto zeros, auto block16) {
    exact_group<decltype(scale)::value, decltype(zeros)::value, decltype(block16)::value>(a);
  });
}

}  // namespace qmoe::avx2
