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

template <qmoe_dtype kScale, bool kZeros, bool kBlock16, int kM>
void exact_tile(const GemmGroupArgs& a, uint32_t m0) {
  // Chunks per block is 1, 2 or 4 (block 32, 64, 128): a shift, not a division per chunk.
  const uint32_t block_shift =
      kBlock16 ? 0 : static_cast<uint32_t>(__builtin_ctz(a.block_size / kChunkCodes));

  __m512 acc[kM][kGroupRows];
  for (int i = 0; i < kM; ++i) {
    for (uint32_t r = 0; r < kGroupRows; ++r) acc[i][r] = _mm512_setzero_ps();
  }
  // Tables of the block of codes 0-15 and of codes 16-31 (the same block unless block 16).
  __m512 lut_a[kGroupRows], lut_b[kGroupRows];
  const __m512* const lut_hi = kBlock16 ? lut_b : lut_a;
  uint32_t table_block = ~0u;
  bool huge_scales = false;

  const uint8_t* codes = a.codes;
  const float* x = a.x + m0 * a.ldx;
  const size_t ldx = a.ldx;
  for (uint32_t c = 0; c < a.chunks; ++c, codes += kChunkBytes, x += kChunkCodes) {
    prefetch_int4_chunk(codes, a.prefetch_l2_bytes);
    const uint32_t block_a = kBlock16 ? 2 * c : c >> block_shift;
    if (block_a != table_block) {
      // The scale stream's lines ahead (lib/cpu/common/int4_prefetch.h says which and why).
      prefetch_int4_scales(a.scales, sizeof_scale<kScale>(), block_a, a.scale_block_stride);
      huge_scales |= build_tables<kScale, kZeros, 16, kInt4DefaultZeroPoint>(a, block_a, lut_a);
      if constexpr (kBlock16)
        huge_scales |=
            build_tables<kScale, kZeros, 16, kInt4DefaultZeroPoint>(a, block_a + 1, lut_b);
      table_block = block_a;
    }

    __m512 x_lo[kM], x_hi[kM];
    for (int i = 0; i < kM; ++i) {
      x_lo[i] = _mm512_loadu_ps(x + i * ldx);
      x_hi[i] = _mm512_loadu_ps(x + i * ldx + 16);
    }
    for (uint32_t r = 0; r < kGroupRows; ++r) {
      // Dword lane j = byte j of the row: code j in bits 0-3, code 16 + j in bits 4-7.
      const __m512i index = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + r * kChunkRowBytes)));
      const __m512 w_lo = _mm512_permutexvar_ps(index, lut_a[r]);
      const __m512 w_hi = _mm512_permutexvar_ps(_mm512_srli_epi32(index, 4), lut_hi[r]);
      for (int i = 0; i < kM; ++i) {
        acc[i][r] = _mm512_fmadd_ps(w_lo, x_lo[i], acc[i][r]);
        acc[i][r] = _mm512_fmadd_ps(w_hi, x_hi[i], acc[i][r]);
      }
    }
  }

  // huge_scales: see the top of the file.
  store_exact_tile<kM>(a, m0, acc, huge_scales, &scalar::gemm_int4_exact_8x32);
}

template <qmoe_dtype kScale, bool kZeros, bool kBlock16>
void exact_group(const GemmGroupArgs& a) {
  uint32_t m0 = 0;
  for (; m0 + 2 <= a.m; m0 += 2) exact_tile<kScale, kZeros, kBlock16, 2>(a, m0);
  if (m0 < a.m) exact_tile<kScale, kZeros, kBlock16, 1>(a, m0);
}

}  // namespace

void gemm_int4_exact_8x32(const GemmGroupArgs& a) {
  dispatch_int4_group(a, [&a](auto scale, auto zeros, auto block16) {
    exact_group<decltype(scale)::value, decltype(zeros)::value, decltype(block16)::value>(a);
  });
}

}  // namespace qmoe::avx512
