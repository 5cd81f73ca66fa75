// F16C oracle (compiled with -mavx -mf16c only). Callers check oracle_f16c_available() first;
// that check lives in convert_oracle_libfp16.cc, which is compiled without ISA flags.
#include "tests/cpu/oracles/convert_oracles.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstring>

namespace qmoe::testing {

void oracle_f16c_f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  if (i < n) {
    uint16_t in[8] = {};
    float out[8];
    std::memcpy(in, src + i, (n - i) * sizeof(uint16_t));
    _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in))));
    std::memcpy(dst + i, out, (n - i) * sizeof(float));
  }
}

void oracle_f16c_f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  // imm8 = 0: bits 1:0 = 00 (nearest even), bit 2 = 0 (do not use MXCSR.RC).
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), 0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  if (i < n) {
    float in[8] = {};
    uint16_t out[8];
    std::memcpy(in, src + i, (n - i) * sizeof(float));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(_mm256_loadu_ps(in), 0));
    std::memcpy(dst + i, out, (n - i) * sizeof(uint16_t));
  }
}

}  // namespace qmoe::testing

#else  // not x86-64: oracle_f16c_available() is false and these are never called.

#include <cstdlib>

namespace qmoe::testing {
void oracle_f16c_f16_to_f32(const uint16_t*, float*, size_t) {
  std::abort();
}
void oracle_f16c_f32_to_f16(const float*, uint16_t*, size_t) {
  std::abort();
}
}  // namespace qmoe::testing

#endif
