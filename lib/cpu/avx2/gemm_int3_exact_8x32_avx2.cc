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

  // Pair p with the pair walk's interface (weights(h, q)).
  struct Pair {
    const ChunkCodes* codes;
    int p;
    __m256 weights(int h, int q) const { return codes->weights(p, h, q); }
  };
  Pair pair(int p) const { return Pair{this, p}; }

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

// INT3's codes for the pair walk (exact_pair_walk_avx2.inc): each 96-byte tile unpacked once.
struct Int3PairCodes {
  static constexpr uint32_t kTileBytes = kInt3TileBytes;
  static constexpr uint32_t kDefaultZero = kInt3DefaultZeroPoint;
  static constexpr float kUnscale = kShiftedUnscale;
  template <bool kShifted>
  using Chunk = ChunkCodes<kShifted>;
};

#include "lib/cpu/avx2/exact_pair_walk_avx2.inc"

}  // namespace

void gemm_int3_exact_8x32(const GemmGroupArgs& a) {
  // The INT4 kernels' dispatch of the run-time variants (scale dtype, zero points, block 16)
  // to template arguments: it names nothing of INT4's layout.
  dispatch_int4_group(a, [&a](auto scale, auto zeros, auto block16) {
    exact_group<Int3PairCodes, decltype(scale)::value, decltype(zeros)::value,
                decltype(block16)::value>(a);
  });
}

}  // namespace qmoe::avx2
