// AVX-512 INT3 dequant-GEMM, exact level: FP32 activations and accumulation, one 8-row group per
// call. The scheme of the INT4 AVX-512 exact kernel (gemm_int4_exact_8x32_avx512.cc), on the
// INT3 tile:
//
// Dequantization by table lookup: for each row and block a table lut_r[c] = (c - z_r) * s_r,
// its 8 entries repeated to 16 because vpermps reads the low 4 bits of each index lane. Rows 0-5
// keep whole codes: one vpmovzxbd of the row's 16 bytes (lib/formats/int3_layout.h) puts byte j
// in dword lane j, holding code j in bits 0-2 and code 16 + j in bits 3-5; vpermps through the
// table gives the 16 weights of codes 0-15 (bit 3 of the index is code 16 + j's, which the
// repeated table ignores) and, after a 3-bit shift, of codes 16-31: four instructions per 32
// weights, as for INT4. Rows 6-7 assemble each index from the dwords of vectors 0 or 1 (bits
// 6-7) and 2 (bit 6 or 7): two shifts and one vpternlogd per 16 weights more.
// (c - z) * s is exact for FP16 and BF16 scales and rounded once for FP32 ones.
//
// A table entry overflows for |s| above about FLT_MAX / 7 although the row's result may be
// finite (the scalar tier sums x * (c - z) per block first and scales after): a group with any
// |s| >= 2^124 (Inf included; 7 * 2^124 < FLT_MAX) is computed by the scalar kernel instead.
//
// The accumulators are per row and 16 lanes wide (lane j of row r sums k = j mod 16), so the
// horizontal reduction happens once per group; tiles of two activation rows keep 16
// accumulators and 4 activation vectors in registers.
#include "lib/cpu/avx512/immintrin_avx512.h"

#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::avx512 {
namespace {

#include "lib/cpu/avx512/exact_rows_avx512.inc"
#include "lib/cpu/avx512/table_exact_walk_avx512.inc"

// Dword lane j = byte j of lane `lane` (0-5: vector lane / 2, half lane % 2) of a tile.
inline __m512i lane_dwords(const uint8_t* tile, uint32_t lane) {
  return _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + lane * kInt3LaneBytes)));
}

// INT3's side of the tile walk: lane L of each vector holds rows L, 2 + L and 4 + L whole, then
// row 6 + L from their bits 6-7 (vectors 0 and 1) and bits 6 and 7 (vector 2): index =
// low2 | (high & 4), one vpternlogd.
struct Int3TableCodes {
  static constexpr uint32_t kTileBytes = kInt3TileBytes;
  static constexpr uint32_t kCodes = 8;
  static constexpr uint32_t kDefaultZero = kInt3DefaultZeroPoint;
  static constexpr void (*scalar_kernel)(const GemmGroupArgs&) = &scalar::gemm_int3_exact_8x32;

  template <typename RowFn>
  static void rows(const uint8_t* tile, RowFn&& f) {
    const __m512i four = _mm512_set1_epi32(4);
    for (uint32_t lane = 0; lane < 2; ++lane) {
      const __m512i v0 = lane_dwords(tile, lane);
      const __m512i v1 = lane_dwords(tile, 2 + lane);
      const __m512i v2 = lane_dwords(tile, 4 + lane);
      f(lane, v0, _mm512_srli_epi32(v0, 3));
      f(2 + lane, v1, _mm512_srli_epi32(v1, 3));
      f(4 + lane, v2, _mm512_srli_epi32(v2, 3));
      // 0xF8: a | (b & c).
      const __m512i split_lo =
          _mm512_ternarylogic_epi32(_mm512_srli_epi32(v0, 6), _mm512_srli_epi32(v2, 4), four, 0xF8);
      const __m512i split_hi =
          _mm512_ternarylogic_epi32(_mm512_srli_epi32(v1, 6), _mm512_srli_epi32(v2, 5), four, 0xF8);
      f(kInt3WholeRows + lane, split_lo, split_hi);
    }
  }
};

}  // namespace

void gemm_int3_exact_8x32(const GemmGroupArgs& a) {
  // The INT4 kernels' dispatch of the run-time variants (scale dtype, zero points, block 16)
  // to template arguments: it names nothing of INT4's layout.
  dispatch_int4_group(a, [&a](auto scale, auto zeros, auto block16) {
    table_exact_group<Int3TableCodes, decltype(scale)::value, decltype(zeros)::value,
                      decltype(block16)::value>(a);
  });
}

}  // namespace qmoe::avx512
