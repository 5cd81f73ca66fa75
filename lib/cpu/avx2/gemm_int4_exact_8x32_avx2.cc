// AVX2 INT4 dequant-GEMM, exact level: FP32 activations and accumulation, one 8-row group per
// call.
//
// Conversion (both paths). One 32-byte load holds rows 2p and 2p + 1 of a chunk (32 k,
// 128 bytes); each row's codes k 0-15 (`lo`) and k 16-31 (`hi`) become bytes, one row per
// 128-bit lane. vpshufb with selector q moves bytes 4q..4q+3 of each lane into int32 lanes, so
// one in-lane shuffle yields [2p: k 4q..4q+3 | 2p+1: the same k], which multiply against
// x[4q..4q+3] broadcast to both lanes: X is read in its natural order, with no lane-crossing
// shuffle. With the default zero point the bytes are (code ^ 8) << 4 and land in the top byte
// of each lane, which then reads as (code - 8) * 2^28: per 8 weights vpshufb, vcvtdq2ps and one
// FMA (PairCodes has the exactness argument). With a zero-point plane they are the codes, land
// in the low byte, and vpsubd takes z first. (vpmovsxbd, which an earlier version widened with,
// crosses 128-bit lanes and so costs more than vpshufb, which does not.)
//
// Reduction. Each pair's products for a chunk collect in one 8-lane vector per half
// [2p: 4 partials | 2p+1: 4 partials]; an in-lane unpack tree (reduce_pairs) turns the four
// pairs into the eight row sums in the order [0 2 4 6 | 1 3 5 7]; the result returns to
// natural order once per group.
//
// M = 1 (exact_single_row) converts in registers and consumes at once, and keeps one
// accumulator per pair: the partials multiply [s_2p x4 | s_2p+1 x4] and the tree runs once per
// group. M > 1 (exact_tile) stores a chunk's converted weights once (1 KiB, in the same pair
// layout) and reuses them for up to four activation rows; each row's chunk is reduced by the
// tree and multiplies the block's scales permuted into the reduced order (per-pair accumulators
// for four rows would not fit the registers). docs/results/2026-11-30-int4-gemm-limits.md has
// the measurements.
#include <immintrin.h>

#include <cmath>

#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int4_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::avx2 {
namespace {

#include "lib/cpu/avx2/exact_pairs_avx2.inc"
#include "lib/cpu/common/int4_scales_ymm.inc"

// The zero points of the chunk's block(s) as bytes 0-7 of *zeros_a (first 16 k) and *zeros_b
// (last 16 k; the same block unless the block size is 16); all 8 without a zero-point plane.
template <bool kZeros, bool kBlock16>
inline void chunk_zero_points(const GemmGroupArgs& a, uint32_t block_a, __m256i* zeros_a,
                              __m256i* zeros_b) {
  const __m256i default_zero = _mm256_set1_epi8(static_cast<char>(kInt4DefaultZeroPoint));
  *zeros_a = *zeros_b = default_zero;
  if constexpr (kZeros) {
    *zeros_a = load_zero_bytes(a.zero_points, block_a * a.zero_point_block_stride);
    *zeros_b = kBlock16 ? load_zero_bytes(a.zero_points, (block_a + 1) * a.zero_point_block_stride)
                        : *zeros_a;
  }
}

// Pair p of a chunk, converted on demand: the codes of k 0-15 (`lo`) and k 16-31 (`hi`) as
// bytes, row 2p in the low 128-bit lane and 2p + 1 in the high one. Two forms:
//
// Zero-point form (kTopNibble false; any zero points): codes in the low nibble of each byte,
// z as int32 per half ([z_{2p} x4 | z_{2p+1} x4]); a weight is cvt(code - z), exact.
//
// Top-nibble form (default zero point 8 only): each byte is (code ^ 8) << 4, so a byte moved to
// the top of an int32 lane reads as (code - 8) * 2^28 (code ^ 8 is code - 8 in 4-bit two's
// complement): per 8 weights vpshufb, vcvtdq2ps and the FMA, without the vpsubd. Every product
// and sum of a chunk is then exactly 2^28 times the zero-point form's (a power of two commutes
// with rounding while nothing overflows; products that would be subnormal are only more
// precise); the scaled sums multiply the block scales as they are, so each row's accumulator
// holds exactly 2^28 times the zero-point form's, and finish_row multiplies it by 2^-28 once:
// the output bits are the zero-point form's on the same path. A result or an activation large
// enough to overflow the scaled sums (|x| above about 2^90) leaves inf or NaN in the row's
// accumulator, which FMAs and adds keep to the end: finish_row sees it and recomputes the row
// in the zero-point form.
template <bool kTopNibble>
struct PairCodes {
  __m256i lo, hi, z_lo, z_hi;

  // The weights of k 16h + 4q .. 16h + 4q + 3, [2p | 2p + 1]: code - z, or (code - 8) * 2^28.
  __m256 weights(int h, int q) const {
    const __m256i nibbles = h == 0 ? lo : hi;
    if constexpr (kTopNibble) {
      return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(nibbles, byte_to_dword_selector(q, 3)));
    } else {
      const __m256i dword_codes = _mm256_shuffle_epi8(nibbles, byte_to_dword_selector(q, 0));
      return _mm256_cvtepi32_ps(_mm256_sub_epi32(dword_codes, h == 0 ? z_lo : z_hi));
    }
  }
};

// The top-nibble form's scale: 2^28 (exact in float).
constexpr float kTopNibbleUnscale = 1.0f / 268435456.0f;

template <bool kTopNibble>
inline PairCodes<kTopNibble> load_pair(const uint8_t* chunk, int p, __m256i zeros_a,
                                       __m256i zeros_b) {
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * p));
  PairCodes<kTopNibble> pair;
  if constexpr (kTopNibble) {
    // Both nibbles ^ 8, then each into the high nibble of its byte with the low nibble clear
    // (the 16-bit shift carries the next byte's bits into the low nibble; the AND drops them).
    const __m256i mask = _mm256_set1_epi8(static_cast<char>(0xF0));
    const __m256i flipped = _mm256_xor_si256(bytes, _mm256_set1_epi8(static_cast<char>(0x88)));
    pair.lo = _mm256_and_si256(_mm256_slli_epi16(flipped, 4), mask);
    pair.hi = _mm256_and_si256(flipped, mask);
    pair.z_lo = pair.z_hi = _mm256_setzero_si256();
  } else {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    pair.lo = _mm256_and_si256(bytes, mask);
    pair.hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
    pair.z_lo = pair_zero_dwords(zeros_a, p);
    pair.z_hi = pair_zero_dwords(zeros_b, p);
  }
  return pair;
}

// A chunk's weights converted once, in the same pair layout: vector (p, h, q) at
// 8 * ((2p + h) * 4 + q). 1 KiB, reused by every activation row of a tile.
struct ChunkTile {
  alignas(32) float w[4 * 2 * 4 * 8];

  template <bool kTopNibble>
  void convert(const uint8_t* chunk, __m256i zeros_a, __m256i zeros_b) {
    for (int p = 0; p < 4; ++p) {
      const auto pair = load_pair<kTopNibble>(chunk, p, zeros_a, zeros_b);
      for (int h = 0; h < 2; ++h) {
        for (int q = 0; q < 4; ++q) _mm256_store_ps(at(p, h, q), pair.weights(h, q));
      }
    }
  }
  float* at(int p, int h, int q) { return w + 8 * ((2 * p + h) * 4 + q); }
  const float* at(int p, int h, int q) const { return w + 8 * ((2 * p + h) * 4 + q); }
};

// The reduced row sums of one chunk for one activation row: `lo` for k 0-31 (blocks >= 32)
// or k 0-15 (block 16), `hi` for k 16-31 (block 16 only), in the order [0 2 4 6 | 1 3 5 7].
struct ChunkSums {
  __m256 lo, hi;
};

// The unreduced partials of one chunk: per pair p, lo[p] (k 0-31, or k 0-15 for block 16) and
// hi[p] (k 16-31, block 16 only), each [2p: 4 partials | 2p+1: 4 partials].
struct PairPartials {
  __m256 lo[4], hi[4];
};

// One activation row's part of one chunk: x (the row's 32 values of the chunk) against the
// eight rows' weights, `pair_weights(p)` giving pair p's weights(h, q). Each half (k 0-15,
// k 16-31) of a pair is an FMA chain of kChain products (4 or 2; two chains of 2 are added).
// One row is latency-bound: a chunk's dependency path (load, convert, chain, scale) keeps the
// next chunk's conversions waiting, and chains of 2 shorten it. A tile of rows is
// throughput-bound, and there chains of 4 save the adds. A single chain of 8 per pair was slower
// than two of 4 (docs/results/2026-11-30-kernel-comment-figures.md has the measurements).
template <bool kBlock16, int kChain, typename PairWeights>
inline PairPartials chunk_pair_partials(PairWeights&& pair_weights, const float* x) {
  static_assert(kChain == 2 || kChain == 4, "a half is 4 products");
  PairPartials t;
  for (int p = 0; p < 4; ++p) {
    const auto pair = pair_weights(p);
    __m256 half[2];
    for (int h = 0; h < 2; ++h) {
      __m256 chain[4 / kChain];
      for (int j = 0; j < 4 / kChain; ++j) {
        for (int i = 0; i < kChain; ++i) {
          const int q = kChain * j + i;
          const __m256 xq =
              _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x + 16 * h + 4 * q));
          const __m256 w = pair.weights(h, q);
          chain[j] = i == 0 ? _mm256_mul_ps(w, xq) : _mm256_fmadd_ps(w, xq, chain[j]);
        }
      }
      half[h] = kChain == 4 ? chain[0] : _mm256_add_ps(chain[0], chain[4 / kChain - 1]);
    }
    if constexpr (kBlock16) {
      t.lo[p] = half[0];
      t.hi[p] = half[1];
    } else {
      t.lo[p] = _mm256_add_ps(half[0], half[1]);  // one block: both halves share its scale
    }
  }
  return t;
}

template <bool kBlock16, int kChain, typename PairWeights>
inline ChunkSums chunk_sums(PairWeights&& pair_weights, const float* x) {
  const PairPartials t = chunk_pair_partials<kBlock16, kChain>(pair_weights, x);
  ChunkSums sums;
  sums.lo = reduce_pairs(t.lo);
  sums.hi = kBlock16 ? reduce_pairs(t.hi) : _mm256_setzero_ps();
  return sums;
}

// Pair p of a stored tile, with the PairCodes interface.
struct TilePair {
  const ChunkTile* tile;
  int p;
  __m256 weights(int h, int q) const { return _mm256_load_ps(tile->at(p, h, q)); }
};

// The walk over a group's chunks shared by both paths: per chunk, the prefetches and the
// block's zero points, then `chunk_body(c, codes, block_a, zeros_a, zeros_b)`.
template <qmoe_dtype kScale, bool kZeros, bool kBlock16, typename ChunkBody>
inline void for_each_chunk(const GemmGroupArgs& a, ChunkBody&& chunk_body) {
  const uint32_t block_shift =
      kBlock16 ? 0 : static_cast<uint32_t>(__builtin_ctz(a.block_size / kChunkCodes));
  const uint8_t* codes = a.codes;
  for (uint32_t c = 0; c < a.chunks; ++c, codes += kChunkBytes) {
    prefetch_int4_chunk(codes, a.prefetch_l2_bytes);
    const uint32_t block_a = kBlock16 ? 2 * c : c >> block_shift;
    // The scale stream's lines ahead (lib/cpu/common/int4_prefetch.h says which and why).
    prefetch_int4_scales(a.scales, sizeof_scale<kScale>(), block_a, a.scale_block_stride);
    __m256i zeros_a, zeros_b;
    chunk_zero_points<kZeros, kBlock16>(a, block_a, &zeros_a, &zeros_b);
    chunk_body(c, codes, block_a, zeros_a, zeros_b);
  }
}

// acc + sums * the scales of the chunk's block(s), permuted into the sums' row order.
template <qmoe_dtype kScale, bool kBlock16>
inline __m256 add_scaled(const GemmGroupArgs& a, uint32_t block_a, ChunkSums sums, __m256 acc) {
  const __m256i to_reduced = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256 scale_a = _mm256_permutevar8x32_ps(
      load_scales<kScale>(a.scales, block_a * a.scale_block_stride), to_reduced);
  acc = _mm256_fmadd_ps(sums.lo, scale_a, acc);
  if constexpr (kBlock16) {
    const __m256 scale_b = _mm256_permutevar8x32_ps(
        load_scales<kScale>(a.scales, (block_a + 1) * a.scale_block_stride), to_reduced);
    acc = _mm256_fmadd_ps(sums.hi, scale_b, acc);
  }
  return acc;
}

// The eight row sums of activation row x, in reduced order: each pair converted in registers
// and consumed at once (storing the tile costs 32 stores a chunk, which one row cannot
// amortize). The chunk's pair partials are scaled and accumulated per pair, unreduced
// ([2p: 4 partials | 2p+1: 4 partials] against [s_2p x4 | s_2p+1 x4]), and reduced once per
// group: per chunk four permutes and four FMAs instead of the reduction tree, a permute, a
// multiply and an FMA, and no reduction on the chunk's dependency path.
template <qmoe_dtype kScale, bool kZeros, bool kBlock16, bool kTopNibble>
__m256 single_row_sums(const GemmGroupArgs& a, const float* x) {
  __m256 acc[4];
  for (int p = 0; p < 4; ++p) acc[p] = _mm256_setzero_ps();
  const auto pair_scales = [](__m256 scales, int p) {
    return _mm256_permutevar8x32_ps(scales, _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1,
                                                              2 * p + 1, 2 * p + 1, 2 * p + 1));
  };
  for_each_chunk<kScale, kZeros, kBlock16>(
      a, [&](uint32_t c, const uint8_t* codes, uint32_t block_a, __m256i zeros_a, __m256i zeros_b) {
        const PairPartials t = chunk_pair_partials<kBlock16, 2>(
            [&](int p) { return load_pair<kTopNibble>(codes, p, zeros_a, zeros_b); },
            x + c * kChunkCodes);
        const __m256 scale_a = load_scales<kScale>(a.scales, block_a * a.scale_block_stride);
        for (int p = 0; p < 4; ++p)
          acc[p] = _mm256_fmadd_ps(t.lo[p], pair_scales(scale_a, p), acc[p]);
        if constexpr (kBlock16) {
          const __m256 scale_b =
              load_scales<kScale>(a.scales, (block_a + 1) * a.scale_block_stride);
          for (int p = 0; p < 4; ++p) {
            acc[p] = _mm256_fmadd_ps(t.hi[p], pair_scales(scale_b, p), acc[p]);
          }
        }
      });
  return reduce_pairs(acc);
}

// Row sums of activation row m -> y. Without a zero-point plane they were computed in the
// top-nibble form, 2^28 times too large: brought back here, once; or, if any lane is inf or
// NaN, the row is recomputed in the zero-point form, whose result is the reference one (also
// inf or NaN when X holds them; see PairCodes).
template <qmoe_dtype kScale, bool kZeros, bool kBlock16>
void finish_row(const GemmGroupArgs& a, uint32_t m, __m256 acc) {
  if constexpr (!kZeros) {
    const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), acc);
    const __m256 finite = _mm256_cmp_ps(magnitude, _mm256_set1_ps(HUGE_VALF), _CMP_LT_OQ);
    if (__builtin_expect(_mm256_movemask_ps(finite) != 0xFF, 0)) {
      acc = single_row_sums<kScale, kZeros, kBlock16, false>(a, a.x + m * a.ldx);
    } else {
      acc = _mm256_mul_ps(acc, _mm256_set1_ps(kTopNibbleUnscale));
    }
  }
  store_group_row(a, acc, a.y + m * a.ldy);
}

template <qmoe_dtype kScale, bool kZeros, bool kBlock16>
void exact_single_row(const GemmGroupArgs& a, uint32_t m) {
  finish_row<kScale, kZeros, kBlock16>(
      a, m, single_row_sums<kScale, kZeros, kBlock16, !kZeros>(a, a.x + m * a.ldx));
}

// Activation rows [m0, m0 + kM): each chunk converted once into a tile, then read by each row.
template <qmoe_dtype kScale, bool kZeros, bool kBlock16, int kM>
void exact_tile(const GemmGroupArgs& a, uint32_t m0) {
  constexpr bool kTopNibble = !kZeros;
  __m256 acc[kM];
  for (int i = 0; i < kM; ++i) acc[i] = _mm256_setzero_ps();
  ChunkTile tile;
  for_each_chunk<kScale, kZeros, kBlock16>(a, [&](uint32_t c, const uint8_t* codes,
                                                  uint32_t block_a, __m256i zeros_a,
                                                  __m256i zeros_b) {
    tile.convert<kTopNibble>(codes, zeros_a, zeros_b);
    for (int i = 0; i < kM; ++i) {
      const float* x = a.x + (m0 + i) * a.ldx + c * kChunkCodes;
      const ChunkSums sums = chunk_sums<kBlock16, 4>([&](int p) { return TilePair{&tile, p}; }, x);
      acc[i] = add_scaled<kScale, kBlock16>(a, block_a, sums, acc[i]);
    }
  });
  for (int i = 0; i < kM; ++i) finish_row<kScale, kZeros, kBlock16>(a, m0 + i, acc[i]);
}

template <qmoe_dtype kScale, bool kZeros, bool kBlock16>
void exact_group(const GemmGroupArgs& a) {
  uint32_t m0 = 0;
  for (; m0 + 4 <= a.m; m0 += 4) exact_tile<kScale, kZeros, kBlock16, 4>(a, m0);
  switch (a.m - m0) {
    case 3:
      exact_tile<kScale, kZeros, kBlock16, 3>(a, m0);
      break;
    case 2:
      exact_tile<kScale, kZeros, kBlock16, 2>(a, m0);
      break;
    case 1:
      exact_single_row<kScale, kZeros, kBlock16>(a, m0);
      break;
    default:
      break;
  }
}

}  // namespace

void gemm_int4_exact_8x32(const GemmGroupArgs& a) {
  dispatch_int4_group(a, [&a](auto scale, auto zeros, auto block16) {
    exact_group<decltype(scale)::value, decltype(zeros)::value, decltype(block16)::value>(a);
  });
}

}  // namespace qmoe::avx2
