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

// Dword lane j = byte j of lane `lane` (0-5: vector lane / 2, half lane % 2) of a tile.
inline __m512i lane_dwords(const uint8_t* tile, uint32_t lane) {
  return _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + lane * kInt3LaneBytes)));
}

template <qmoe_dtype kScale, bool kZeros, bool kBlock16, int kM>
void exact_tile(const GemmGroupArgs& a, uint32_t m0) {
  // Chunks per block is 1, 2 or 4 (block 32, 64, 128): a shift, not a division per chunk.
  const uint32_t block_shift =
      kBlock16 ? 0 : static_cast<uint32_t>(__builtin_ctz(a.block_size / kChunkCodes));
  const __m512i four = _mm512_set1_epi32(4);

  __m512 acc[kM][kGroupRows];
  for (int i = 0; i < kM; ++i) {
    for (uint32_t r = 0; r < kGroupRows; ++r) acc[i][r] = _mm512_setzero_ps();
  }
  // Tables of the block of codes 0-15 and of codes 16-31 (the same block unless block 16).
  __m512 lut_a[kGroupRows], lut_b[kGroupRows];
  const __m512* const lut_hi = kBlock16 ? lut_b : lut_a;
  uint32_t table_block = ~0u;
  bool huge_scales = false;

  const uint8_t* tile = a.codes;
  const float* x = a.x + m0 * a.ldx;
  const size_t ldx = a.ldx;
  for (uint32_t c = 0; c < a.chunks; ++c, tile += kInt3TileBytes, x += kChunkCodes) {
    prefetch_int4_chunk(tile, a.prefetch_l2_bytes);
    const uint32_t block_a = kBlock16 ? 2 * c : c >> block_shift;
    if (block_a != table_block) {
      // The scale stream's lines ahead (lib/cpu/common/int4_prefetch.h says which and why).
      prefetch_int4_scales(a.scales, sizeof_scale<kScale>(), block_a, a.scale_block_stride);
      huge_scales |= build_tables<kScale, kZeros, 8, kInt3DefaultZeroPoint>(a, block_a, lut_a);
      if constexpr (kBlock16)
        huge_scales |=
            build_tables<kScale, kZeros, 8, kInt3DefaultZeroPoint>(a, block_a + 1, lut_b);
      table_block = block_a;
    }

    __m512 x_lo[kM], x_hi[kM];
    for (int i = 0; i < kM; ++i) {
      x_lo[i] = _mm512_loadu_ps(x + i * ldx);
      x_hi[i] = _mm512_loadu_ps(x + i * ldx + 16);
    }
    const auto accumulate = [&](uint32_t r, __m512i index_lo, __m512i index_hi) {
      const __m512 w_lo = _mm512_permutexvar_ps(index_lo, lut_a[r]);
      const __m512 w_hi = _mm512_permutexvar_ps(index_hi, lut_hi[r]);
      for (int i = 0; i < kM; ++i) {
        acc[i][r] = _mm512_fmadd_ps(w_lo, x_lo[i], acc[i][r]);
        acc[i][r] = _mm512_fmadd_ps(w_hi, x_hi[i], acc[i][r]);
      }
    };
    // Lane L of each vector: rows L, 2 + L and 4 + L whole, then row 6 + L from their bits 6-7
    // (vectors 0 and 1) and bits 6 and 7 (vector 2): index = low2 | (high & 4), one vpternlogd.
    for (uint32_t lane = 0; lane < 2; ++lane) {
      const __m512i v0 = lane_dwords(tile, lane);
      const __m512i v1 = lane_dwords(tile, 2 + lane);
      const __m512i v2 = lane_dwords(tile, 4 + lane);
      accumulate(lane, v0, _mm512_srli_epi32(v0, 3));
      accumulate(2 + lane, v1, _mm512_srli_epi32(v1, 3));
      accumulate(4 + lane, v2, _mm512_srli_epi32(v2, 3));
      // 0xF8: a | (b & c).
      const __m512i split_lo =
          _mm512_ternarylogic_epi32(_mm512_srli_epi32(v0, 6), _mm512_srli_epi32(v2, 4), four, 0xF8);
      const __m512i split_hi =
          _mm512_ternarylogic_epi32(_mm512_srli_epi32(v1, 6), _mm512_srli_epi32(v2, 5), four, 0xF8);
      accumulate(kInt3WholeRows + lane, split_lo, split_hi);
    }
  }

  // huge_scales: see the top of the file.
  store_exact_tile<kM>(a, m0, acc, huge_scales, &scalar::gemm_int3_exact_8x32);
}

template <qmoe_dtype kScale, bool kZeros, bool kBlock16>
void exact_group(const GemmGroupArgs& a) {
  uint32_t m0 = 0;
  for (; m0 + 2 <= a.m; m0 += 2) exact_tile<kScale, kZeros, kBlock16, 2>(a, m0);
  if (m0 < a.m) exact_tile<kScale, kZeros, kBlock16, 1>(a, m0);
}

}  // namespace

void gemm_int3_exact_8x32(const GemmGroupArgs& a) {
  // The INT4 kernels' dispatch of the run-time variants (scale dtype, zero points, block 16)
  // to template arguments: it names nothing of INT4's layout.
  dispatch_int4_group(a, [&a](auto scale, auto zeros, auto block16) {
    exact_group<decltype(scale)::value, decltype(zeros)::value, decltype(block16)::value>(a);
  });
}

}  // namespace qmoe::avx512
