// AVX-512 INT4 dequant-GEMM, exact level: FP32 activations and accumulation, one 8-row group per
// call.
//
// Dequantization by table lookup: for each row and block a 16-entry FP32 table
// lut_r[c] = (c - z_r) * s_r (one or two instructions per row and block). Per chunk and row, one
// vpmovzxbd of the row's 16 code bytes puts byte j in dword lane j; vpermps reads only the low 4
// bits of each index lane, so lut_r indexed by those lanes gives the 16 weights of codes 0-15
// (the low nibbles) and, after a 4-bit dword shift, of codes 16-31: four instructions per 32
// weights, already scaled, with no sign extension, int->float conversion or multiply.
// (c - z) * s is exact for FP16 and BF16 scales (an integer of magnitude <= 15 times an 11- or
// 8-bit significand) and rounded once for FP32 scales.
//
// A table entry is (c - z) * s with |c - z| <= 15, so it overflows to Inf for |s| above about
// FLT_MAX / 15 although the row's true result may be finite (the scalar tier sums x * (c - z)
// per block first and scales after). A group with any |s| >= 2^124 (Inf included; 15 * 2^124 <
// FLT_MAX) is therefore recomputed by the scalar kernel: one compare per block on the path,
// and results that do not depend on the tier for scales no model has.
//
// The accumulators are per row and 16 lanes wide (lane j of row r sums k = j mod 16), so the
// horizontal reduction happens once per group, and every activation row of the tile costs two
// FMAs per row and chunk. Tiles of two activation rows keep 16 accumulators + 4 activation
// vectors in registers; the tables are rebuilt only when the block changes (vpermps can read
// them from the stack at no extra cost).
#include "lib/cpu/avx512/immintrin_avx512.h"

#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int4_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::avx512 {
namespace {

#include "lib/cpu/avx512/exact_rows_avx512.inc"
#include "lib/cpu/avx512/table_exact_walk_avx512.inc"

// INT4's side of the tile walk: a chunk row's 16 bytes, one per dword lane (vpmovzxbd), hold
// code j in bits 0-3 and code 16 + j in bits 4-7.
struct Int4TableCodes {
  static constexpr uint32_t kTileBytes = kChunkBytes;
  static constexpr uint32_t kCodes = 16;
  static constexpr uint32_t kDefaultZero = kInt4DefaultZeroPoint;
  static constexpr void (*scalar_kernel)(const GemmGroupArgs&) = &scalar::gemm_int4_exact_8x32;

  template <typename RowFn>
  static void rows(const uint8_t* chunk, RowFn&& f) {
    for (uint32_t r = 0; r < kGroupRows; ++r) {
      const __m512i index = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + r * kChunkRowBytes)));
      f(r, index, _mm512_srli_epi32(index, 4));
    }
  }
};

}  // namespace

void gemm_int4_exact_8x32(const GemmGroupArgs& a) {
  dispatch_int4_group(a, [&a](auto scale, auto zeros, auto block16) {
    table_exact_group<Int4TableCodes, decltype(scale)::value, decltype(zeros)::value,
                      decltype(block16)::value>(a);
  });
}

}  // namespace qmoe::avx512
