// AVX2 + F16C row conversions between FP32 and FP16/BF16. Bit-identical to the scalar reference
// on every input, NaNs included (docs/formats.md, "Floating-point row conversions").
//
// FP16 uses F16C: vcvtph2ps is exact and ignores MXCSR.DAZ (Intel SDM), vcvtps2ph takes its
// rounding from the immediate (imm8[2] = 0, RC = nearest even) and ignores MXCSR.FTZ; a denormal
// FP32 input flushed by DAZ would round to the same signed zero anyway. BF16 uses integer AVX2
// only, so nothing depends on MXCSR.
//
// Loops: 32 values per iteration (4 FP32 vectors), then 8 at a time; a remainder is handled
// by redoing the last full vector of the row (it overlaps elements already written with the same
// values; src and dst never overlap), and rows shorter than one vector go through a stack buffer
// with the same vector code. Nothing outside [src, src+n) is read or [dst, dst+n) written.
#include <immintrin.h>

#include <cstring>

#include "lib/cpu/kernels.h"

namespace qmoe::avx2 {
namespace {

constexpr int kF16Round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

inline void f16x8_to_f32(const uint16_t* src, float* dst) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  _mm256_storeu_ps(dst, _mm256_cvtph_ps(h));
}

inline void f32x8_to_f16(const float* src, uint16_t* dst) {
  const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src), kF16Round);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), h);
}

// BF16 -> FP32 for 16 values. The NaN fix is done on the 16-bit patterns (|b| > 0x7F80 is NaN;
// bit 0x0040 becomes the FP32 quiet bit 0x00400000), then widening is an interleave with zero:
// after the 64-bit permute [q0 q2 | q1 q3], unpacklo yields values 0..7 and unpackhi 8..15.
inline void bf16x16_to_f32(const uint16_t* src, float* dst) {
  __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  const __m256i abs = _mm256_and_si256(b, _mm256_set1_epi16(0x7FFF));
  const __m256i nan = _mm256_cmpgt_epi16(abs, _mm256_set1_epi16(0x7F80));
  b = _mm256_or_si256(b, _mm256_and_si256(nan, _mm256_set1_epi16(0x0040)));
  b = _mm256_permute4x64_epi64(b, _MM_SHUFFLE(3, 1, 2, 0));
  const __m256i zero = _mm256_setzero_si256();
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_unpacklo_epi16(zero, b));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 8), _mm256_unpackhi_epi16(zero, b));
}

// FP32 bits -> BF16 bits in the low half of each 32-bit lane (upper half zero): round to
// nearest even, x + 0x7FFF + lsb(x >> 16), which also rounds the largest finites to Inf; NaN ->
// (x >> 16) | 0x0040.
inline __m256i f32x8_to_bf16_lanes(__m256i x) {
  const __m256i hi = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

inline void f32x16_to_bf16(const float* src, uint16_t* dst) {
  const __m256i a = f32x8_to_bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  const __m256i b =
      f32x8_to_bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 8)));
  // Lanes hold values <= 0xFFFF, so the unsigned-saturating pack is exact; it interleaves the
  // 128-bit halves ([a0-3 b0-3 | a4-7 b4-7]), which the 64-bit permute puts back in order.
  const __m256i packed =
      _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), _MM_SHUFFLE(3, 1, 2, 0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), packed);
}

inline void f32x8_to_bf16(const float* src, uint16_t* dst) {
  const __m256i r = f32x8_to_bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), packed);
}

inline void bf16x8_to_f32(const uint16_t* src, float* dst) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  const __m128i abs = _mm_and_si128(b, _mm_set1_epi16(0x7FFF));
  const __m128i nan = _mm_cmpgt_epi16(abs, _mm_set1_epi16(0x7F80));
  b = _mm_or_si128(b, _mm_and_si128(nan, _mm_set1_epi16(0x0040)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

// Rows shorter than 8: copy through zero-filled stack buffers and run the 8-wide code.
template <typename Src, typename Dst, void (*Kernel8)(const Src*, Dst*)>
void short_row(const Src* src, Dst* dst, size_t n) {
  alignas(32) Src in[8] = {};
  alignas(32) Dst out[8];
  std::memcpy(in, src, n * sizeof(Src));
  Kernel8(in, out);
  std::memcpy(dst, out, n * sizeof(Dst));
}

}  // namespace

void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    f16x8_to_f32(src + i, dst + i);
    f16x8_to_f32(src + i + 8, dst + i + 8);
    f16x8_to_f32(src + i + 16, dst + i + 16);
    f16x8_to_f32(src + i + 24, dst + i + 24);
  }
  for (; i + 8 <= n; i += 8) f16x8_to_f32(src + i, dst + i);
  if (i == n) return;
  if (n >= 8) {
    f16x8_to_f32(src + n - 8, dst + n - 8);
  } else {
    short_row<uint16_t, float, f16x8_to_f32>(src, dst, n);
  }
}

void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    f32x8_to_f16(src + i, dst + i);
    f32x8_to_f16(src + i + 8, dst + i + 8);
    f32x8_to_f16(src + i + 16, dst + i + 16);
    f32x8_to_f16(src + i + 24, dst + i + 24);
  }
  for (; i + 8 <= n; i += 8) f32x8_to_f16(src + i, dst + i);
  if (i == n) return;
  if (n >= 8) {
    f32x8_to_f16(src + n - 8, dst + n - 8);
  } else {
    short_row<float, uint16_t, f32x8_to_f16>(src, dst, n);
  }
}

void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    bf16x16_to_f32(src + i, dst + i);
    bf16x16_to_f32(src + i + 16, dst + i + 16);
  }
  for (; i + 8 <= n; i += 8) bf16x8_to_f32(src + i, dst + i);
  if (i == n) return;
  if (n >= 8) {
    bf16x8_to_f32(src + n - 8, dst + n - 8);
  } else {
    short_row<uint16_t, float, bf16x8_to_f32>(src, dst, n);
  }
}

void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    f32x16_to_bf16(src + i, dst + i);
    f32x16_to_bf16(src + i + 16, dst + i + 16);
  }
  for (; i + 8 <= n; i += 8) f32x8_to_bf16(src + i, dst + i);
  if (i == n) return;
  if (n >= 8) {
    f32x8_to_bf16(src + n - 8, dst + n - 8);
  } else {
    short_row<float, uint16_t, f32x8_to_bf16>(src, dst, n);
  }
}

}  // namespace qmoe::avx2
