// AVX-512 (F, BW, VL) row conversions between FP32 and FP16/BF16. Bit-identical to the scalar
// reference on every input, NaNs included (docs/formats.md, "Floating-point row conversions").
//
// FP16 uses the AVX512F forms of vcvtph2ps (exact, ignores MXCSR.DAZ) and vcvtps2ph with the
// rounding in the immediate (nearest even; MXCSR.RC and FTZ ignored; a denormal FP32 input that
// DAZ flushes would round to the same signed zero anyway). BF16 is integer-only.
//
// Loops: 64 (FP16) or 32 (BF16) values per iteration, then 16 at a time, then one masked
// vector for the remainder (masked-off lanes are neither read, so they cannot fault, nor
// written). Nothing outside [src, src+n) is read or [dst, dst+n) written.
#include "lib/cpu/avx512/immintrin_avx512.h"

#include "lib/cpu/kernels.h"

namespace qmoe::avx512 {
namespace {

constexpr int kF16Round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

inline __mmask16 tail_mask(size_t remaining) {
  return static_cast<__mmask16>((1u << remaining) - 1u);  // remaining in 1..15
}

inline void f16x16_to_f32(const uint16_t* src, float* dst) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  _mm512_storeu_ps(dst, _mm512_cvtph_ps(h));
}

inline void f32x16_to_f16(const float* src, uint16_t* dst) {
  const __m256i h = _mm512_cvt_roundps_ph(_mm512_loadu_ps(src), kF16Round);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), h);
}

// BF16 bits (zero-extended to 32-bit lanes) -> FP32 bits: shift into the high half; NaN gets
// the quiet bit.
inline __m512i bf16_lanes_to_f32(__m256i b) {
  const __m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16);
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_or_epi32(x, nan, x, _mm512_set1_epi32(0x00400000));
}

// FP32 bits -> BF16 bits in the low half of each 32-bit lane (upper half zero): round to
// nearest even, x + 0x7FFF + lsb(x >> 16), which also rounds the largest finites to Inf; NaN ->
// (x >> 16) | 0x0040.
inline __m512i f32_to_bf16_lanes(__m512i x) {
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_or_epi32(rounded, nan, hi, _mm512_set1_epi32(0x0040));
}

inline void f32x32_to_bf16(const float* src, uint16_t* dst) {
  const __m512i a = f32_to_bf16_lanes(_mm512_loadu_si512(src));
  const __m512i b = f32_to_bf16_lanes(_mm512_loadu_si512(src + 16));
  // Lanes hold values <= 0xFFFF, so the unsigned-saturating pack is exact; it interleaves per
  // 128-bit lane ([a0-3 b0-3 | a4-7 b4-7 | ...]), which the qword permute puts back in order.
  const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
  const __m512i packed = _mm512_permutexvar_epi64(order, _mm512_packus_epi32(a, b));
  _mm512_storeu_si512(dst, packed);
}

}  // namespace

void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    f16x16_to_f32(src + i, dst + i);
    f16x16_to_f32(src + i + 16, dst + i + 16);
    f16x16_to_f32(src + i + 32, dst + i + 32);
    f16x16_to_f32(src + i + 48, dst + i + 48);
  }
  for (; i + 16 <= n; i += 16) f16x16_to_f32(src + i, dst + i);
  if (i == n) return;
  const __mmask16 m = tail_mask(n - i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
  _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(h));
}

void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    f32x16_to_f16(src + i, dst + i);
    f32x16_to_f16(src + i + 16, dst + i + 16);
    f32x16_to_f16(src + i + 32, dst + i + 32);
    f32x16_to_f16(src + i + 48, dst + i + 48);
  }
  for (; i + 16 <= n; i += 16) f32x16_to_f16(src + i, dst + i);
  if (i == n) return;
  const __mmask16 m = tail_mask(n - i);
  const __m256i h = _mm512_cvt_roundps_ph(_mm512_maskz_loadu_ps(m, src + i), kF16Round);
  _mm256_mask_storeu_epi16(dst + i, m, h);
}

void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 16));
    _mm512_storeu_si512(dst + i, bf16_lanes_to_f32(b0));
    _mm512_storeu_si512(dst + i + 16, bf16_lanes_to_f32(b1));
  }
  for (; i + 16 <= n; i += 16) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, bf16_lanes_to_f32(b));
  }
  if (i == n) return;
  const __mmask16 m = tail_mask(n - i);
  const __m256i b = _mm256_maskz_loadu_epi16(m, src + i);
  _mm512_mask_storeu_epi32(dst + i, m, bf16_lanes_to_f32(b));
}

void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) f32x32_to_bf16(src + i, dst + i);
  for (; i + 16 <= n; i += 16) {
    const __m512i r = f32_to_bf16_lanes(_mm512_loadu_si512(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
  if (i == n) return;
  const __mmask16 m = tail_mask(n - i);
  const __m512i r = f32_to_bf16_lanes(_mm512_maskz_loadu_epi32(m, src + i));
  _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(r));
}

}  // namespace qmoe::avx512
