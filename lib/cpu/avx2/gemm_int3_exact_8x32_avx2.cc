// AVX2 INT3 dequant-GEMM, exact level: FP32 activations and accumulation, one 8-row group per
// call. The scheme of the INT4 AVX2 exact kernel (gemm_int4_exact_8x32_avx2.cc has the
// measurements behind it) on the INT3 tile:
//
// Conversion. The tile is unpacked once per chunk into the pair form (int3_unpack_ymm.inc):
// per pair p of rows, the codes of k 0-15 (`lo`) and 16-31 (`hi`) as bytes, row 2p in the low
// 128-bit lane and 2p + 1 in the high one. vpshufb with selector q moves bytes 4q..4q+3 of each
// lane into int32 lanes, giving [2p: k 4q..4q+3 | 2p+1: the same k], which multiply against
// x[4q..4q+3] broadcast to both lanes. Two forms:
// - Shifted (default zero point 4): the bytes hold code - 4 (-4..3) and land in the top byte of
//   each dword, which then reads as (code - 4) * 2^24: per 4 weights a vpshufb, a vcvtdq2ps and
//   an FMA (the subtraction is one vpsubb per 32 codes). Every product and sum of a row is
//   exactly 2^24 times the zero-point form's while nothing overflows, so finish_row scales the
//   result by 2^-24 once; an activation large enough to overflow (|x| above about 2^100) leaves
//   inf or NaN in the row's accumulator, and the row is recomputed in the zero-point form.
// - Zero-point form: the codes land in the low byte and vpsubd takes z as int32 (exact for any
//   zero-point byte).
//
// Reduction. Each pair's products for a chunk collect in one vector per half [2p: 4 partials |
// 2p+1: 4 partials]; an in-lane unpack tree (reduce_pairs) turns the four pairs into the eight
// row sums in the order [0 2 4 6 | 1 3 5 7], returned to natural order once per group. M = 1
// converts in registers and keeps an accumulator per pair (the tree runs once per group); M > 1
// converts each chunk once into a 1 KiB tile read by up to four activation rows.
#include <immintrin.h>

#include <cmath>

#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::avx2 {
namespace {

#include "lib/cpu/avx2/exact_pairs_avx2.inc"
#include "lib/cpu/common/int3_unpack_ymm.inc"
#include "lib/cpu/common/int4_scales_ymm.inc"

constexpr float kShiftedUnscale = 0x1p-24f;

// One chunk's codes in pair form, and the zero points of its block(s) (bytes 0-7 of zeros_a
// for k 0-15, zeros_b for k 16-31; unused in the shifted form).
template <bool kShifted>
struct ChunkCodes {
  __m256i lo[4], hi[4];
  __m256i zeros_a, zeros_b;

  void load(const uint8_t* tile, __m256i za, __m256i zb) {
    int3_split_pairs(tile, lo, hi);
    if constexpr (kShifted) {
      const __m256i four = _mm256_set1_epi8(static_cast<char>(kInt3DefaultZeroPoint));
      for (int p = 0; p < 4; ++p) {
        lo[p] = _mm256_sub_epi8(lo[p], four);
        hi[p] = _mm256_sub_epi8(hi[p], four);
      }
    }
    zeros_a = za;
    zeros_b = zb;
  }

  // The weights of k 16h + 4q .. 16h + 4q + 3 of pair p, [2p | 2p + 1]: code - z, or
  // (code - 4) * 2^24.
  __m256 weights(int p, int h, int q) const {
    const __m256i bytes = h == 0 ? lo[p] : hi[p];
    if constexpr (kShifted) {
      return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(bytes, byte_to_dword_selector(q, 3)));
    } else {
      const __m256i codes = _mm256_shuffle_epi8(bytes, byte_to_dword_selector(q, 0));
      return _mm256_cvtepi32_ps(
          _mm256_sub_epi32(codes, pair_zero_dwords(h == 0 ? zeros_a : zeros_b, p)));
    }
  }
};

// A chunk's weights converted once: vector (p, h, q) at 8 * ((2p + h) * 4 + q). 1 KiB, read by
// every activation row of a tile.
struct ChunkTile {
  alignas(32) float w[4 * 2 * 4 * 8];

  template <bool kShifted>
  void convert(const ChunkCodes<kShifted>& codes) {
    for (int p = 0; p < 4; ++p) {
      for (int h = 0; h < 2; ++h) {
        for (int q = 0; q < 4; ++q) _mm256_store_ps(at(p, h, q), codes.weights(p, h, q));
      }
    }
  }
  float* at(int p, int h, int q) { return w + 8 * ((2 * p + h) * 4 + q); }
  const float* at(int p, int h, int q) const { return w + 8 * ((2 * p + h) * 4 + q); }
  __m256 weights(int p, int h, int q) const { return _mm256_load_ps(at(p, h, q)); }
};

// The unreduced partials of one chunk for one activation row x (its 32 values): per pair, lo[p]
// (k 0-31, or k 0-15 for block 16) and hi[p] (k 16-31, block 16 only). Each half is an FMA
// chain of kChain products (2 or 4; two chains of 2 are added): one row is latency-bound and
// takes chains of 2, a tile of rows is throughput-bound and takes chains of 4 (as the INT4
// kernel, whose file has the measurements).
struct PairPartials {
  __m256 lo[4], hi[4];
};
template <bool kBlock16, int kChain, typename Weights>
inline PairPartials chunk_pair_partials(const Weights& w, const float* x) {
  PairPartials t;
  for (int p = 0; p < 4; ++p) {
    __m256 half[2];
    for (int h = 0; h < 2; ++h) {
      __m256 chain[4 / kChain];
      for (int j = 0; j < 4 / kChain; ++j) {
        for (int i = 0; i < kChain; ++i) {
          const int q = kChain * j + i;
          const __m256 xq =
              _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x + 16 * h + 4 * q));
          const __m256 wq = w.weights(p, h, q);
          chain[j] = i == 0 ? _mm256_mul_ps(wq, xq) : _mm256_fmadd_ps(wq, xq, chain[j]);
        }
      }
      half[h] = kChain == 4 ? chain[0] : _mm256_add_ps(chain[0], chain[4 / kChain - 1]);
    }
    if constexpr (kBlock16) {
      t.lo[p] = half[0];
      t.hi[p] = half[1];
    } else {
      t.lo[p] = _mm256_add_ps(half[0], half[1]);
    }
  }
  return t;
}

// The walk over a group's chunks: per chunk the prefetches, the block's zero points and the
// unpacked codes, then chunk_body(c, codes, block_a).
template <qmoe_dtype kScale, bool kZeros, bool kBlock16, bool kShifted, typename ChunkBody>
inline void for_each_chunk(const GemmGroupArgs& a, ChunkBody&& chunk_body) {
  const uint32_t block_shift =
      kBlock16 ? 0 : static_cast<uint32_t>(__builtin_ctz(a.block_size / kChunkCodes));
  const __m256i default_zeros = _mm256_set1_epi8(static_cast<char>(kInt3DefaultZeroPoint));
  const uint8_t* tile = a.codes;
  ChunkCodes<kShifted> codes;
  for (uint32_t c = 0; c < a.chunks; ++c, tile += kInt3TileBytes) {
    prefetch_int4_chunk(tile, a.prefetch_l2_bytes);
    const uint32_t block_a = kBlock16 ? 2 * c : c >> block_shift;
    prefetch_int4_scales(a.scales, sizeof_scale<kScale>(), block_a, a.scale_block_stride);
    __m256i zeros_a = default_zeros, zeros_b = default_zeros;
    if constexpr (kZeros) {
      zeros_a = load_zero_bytes(a.zero_points, block_a * a.zero_point_block_stride);
      zeros_b = kBlock16 ? load_zero_bytes(a.zero_points, (block_a + 1) * a.zero_point_block_stride)
                         : zeros_a;
    }
    codes.load(tile, zeros_a, zeros_b);
    chunk_body(c, codes, block_a);
  }
}

// The eight row sums of activation row x in reduced order, converted in registers: the chunk's
// pair partials are scaled and accumulated per pair, unreduced ([2p: 4 | 2p+1: 4] against
// [s_2p x4 | s_2p+1 x4]), and reduced once per group.
template <qmoe_dtype kScale, bool kZeros, bool kBlock16, bool kShifted>
__m256 single_row_sums(const GemmGroupArgs& a, const float* x) {
  __m256 acc[4];
  for (int p = 0; p < 4; ++p) acc[p] = _mm256_setzero_ps();
  const auto pair_scales = [](__m256 scales, int p) {
    return _mm256_permutevar8x32_ps(scales, _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1,
                                                              2 * p + 1, 2 * p + 1, 2 * p + 1));
  };
  for_each_chunk<kScale, kZeros, kBlock16, kShifted>(
      a, [&](uint32_t c, const ChunkCodes<kShifted>& codes, uint32_t block_a) {
        const PairPartials t = chunk_pair_partials<kBlock16, 2>(codes, x + c * kChunkCodes);
        const __m256 scale_a = load_scales<kScale>(a.scales, block_a * a.scale_block_stride);
        for (int p = 0; p < 4; ++p) {
          acc[p] = _mm256_fmadd_ps(t.lo[p], pair_scales(scale_a, p), acc[p]);
        }
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
// shifted form, 2^24 times too large: brought back here; or, if any lane is inf or NaN, the row
// is recomputed in the zero-point form, whose result is the reference one (also inf or NaN when
// X holds them).
template <qmoe_dtype kScale, bool kZeros, bool kBlock16>
void finish_row(const GemmGroupArgs& a, uint32_t m, __m256 acc) {
  if constexpr (!kZeros) {
    const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), acc);
    const __m256 finite = _mm256_cmp_ps(magnitude, _mm256_set1_ps(HUGE_VALF), _CMP_LT_OQ);
    if (__builtin_expect(_mm256_movemask_ps(finite) != 0xFF, 0)) {
      acc = single_row_sums<kScale, kZeros, kBlock16, false>(a, a.x + m * a.ldx);
    } else {
      acc = _mm256_mul_ps(acc, _mm256_set1_ps(kShiftedUnscale));
    }
  }
  store_group_row(a, acc, a.y + m * a.ldy);
}

// Activation rows [m0, m0 + kM): each chunk converted once into a tile, then read by each row.
template <qmoe_dtype kScale, bool kZeros, bool kBlock16, int kM>
void exact_tile(const GemmGroupArgs& a, uint32_t m0) {
  constexpr bool kShifted = !kZeros;
  const __m256i to_reduced = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  __m256 acc[kM];
  for (int i = 0; i < kM; ++i) acc[i] = _mm256_setzero_ps();
  ChunkTile tile;
  for_each_chunk<kScale, kZeros, kBlock16, kShifted>(
      a, [&](uint32_t c, const ChunkCodes<kShifted>& codes, uint32_t block_a) {
        tile.convert(codes);
        const __m256 scale_a = _mm256_permutevar8x32_ps(
            load_scales<kScale>(a.scales, block_a * a.scale_block_stride), to_reduced);
        __m256 scale_b = scale_a;
        if constexpr (kBlock16) {
          scale_b = _mm256_permutevar8x32_ps(
              load_scales<kScale>(a.scales, (block_a + 1) * a.scale_block_stride), to_reduced);
        }
        for (int i = 0; i < kM; ++i) {
          const float* x = a.x + (m0 + i) * a.ldx + c * kChunkCodes;
          const PairPartials t = chunk_pair_partials<kBlock16, 4>(tile, x);
          acc[i] = _mm256_fmadd_ps(reduce_pairs(t.lo), scale_a, acc[i]);
          if constexpr (kBlock16) acc[i] = _mm256_fmadd_ps(reduce_pairs(t.hi), scale_b, acc[i]);
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
      finish_row<kScale, kZeros, kBlock16>(
          a, m0, single_row_sums<kScale, kZeros, kBlock16, !kZeros>(a, a.x + m0 * a.ldx));
      break;
    default:
      break;
  }
}

}  // namespace

void gemm_int3_exact_8x32(const GemmGroupArgs& a) {
  // The INT4 kernels' dispatch of the run-time variants (scale dtype, zero points, block 16)
  // to template arguments: it names nothing of INT4's layout.
  dispatch_int4_group(a, [&a](auto scale, auto zeros, auto block16) {
    exact_group<decltype(scale)::value, decltype(zeros)::value, decltype(block16)::value>(a);
  });
}

}  // namespace qmoe::avx2
