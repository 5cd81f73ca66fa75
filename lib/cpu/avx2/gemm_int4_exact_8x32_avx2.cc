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
// M = 1 (single_row_sums) converts in registers and consumes at once, and keeps one
// accumulator per pair: the partials multiply [s_2p x4 | s_2p+1 x4] and the tree runs once per
// group. M > 1 (exact_tile) stores a chunk's converted weights once (1 KiB, in the same pair
// layout) and reuses them for up to four activation rows; each row's chunk is reduced by the
// tree and multiplies the block's scales permuted into the reduced order (per-pair accumulators
// for four rows would not fit the registers). docs/results/2026-11-30-int4-gemm-limits.md has
// the measurements. Both paths are the pair walk the INT3 kernel shares
// (exact_pair_walk_avx2.inc); this file supplies INT4's codes (PairCodes, Int4PairCodes).
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

// INT4's codes for the pair walk (exact_pair_walk_avx2.inc): a chunk is 128 bytes in place,
// each pair loaded and converted when the walk asks for it.
struct Int4PairCodes {
  static constexpr uint32_t kTileBytes = kChunkBytes;
  static constexpr uint32_t kDefaultZero = kInt4DefaultZeroPoint;
  static constexpr float kUnscale = kTopNibbleUnscale;

  template <bool kTopNibble>
  struct Chunk {
    const uint8_t* codes;
    __m256i zeros_a, zeros_b;
    void load(const uint8_t* chunk, __m256i za, __m256i zb) {
      codes = chunk;
      zeros_a = za;
      zeros_b = zb;
    }
    PairCodes<kTopNibble> pair(int p) const {
      return load_pair<kTopNibble>(codes, p, zeros_a, zeros_b);
    }
  };
};

#include "lib/cpu/avx2/exact_pair_walk_avx2.inc"

}  // namespace

void gemm_int4_exact_8x32(const GemmGroupArgs& a) {
  dispatch_int4_group(a, [&a](auto scale, auto zeros, auto block16) {
    exact_group<Int4PairCodes, decltype(scale)::value, decltype(zeros)::value,
                decltype(block16)::value>(a);
  });
}

}  // namespace qmoe::avx2
