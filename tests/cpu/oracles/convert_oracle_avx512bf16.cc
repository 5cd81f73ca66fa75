// AVX512-BF16 oracle (compiled with -mavx512f -mavx512bf16 only). Callers check
// oracle_avx512bf16_available() first; that check lives in convert_oracle_libfp16.cc, which is
// compiled without ISA flags (a function built here could use AVX-512 in its prologue).
#include "tests/cpu/oracles/convert_oracles.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstring>

namespace qmoe::testing {
namespace {

void cvt16(const float* src, uint16_t* dst) {
  const __m256bh r = _mm512_cvtneps_pbh(_mm512_loadu_ps(src));
  std::memcpy(dst, &r, sizeof(r));
}

}  // namespace

void oracle_avx512bf16_f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) cvt16(src + i, dst + i);
  if (i < n) {
    float in[16] = {};
    uint16_t out[16];
    std::memcpy(in, src + i, (n - i) * sizeof(float));
    cvt16(in, out);
    std::memcpy(dst + i, out, (n - i) * sizeof(uint16_t));
  }
}

}  // namespace qmoe::testing

#else  // not x86-64: oracle_avx512bf16_available() is false and this is never called.

#include <cstdlib>

namespace qmoe::testing {
void oracle_avx512bf16_f32_to_bf16(const float*, uint16_t*, size_t) {
  std::abort();
}
}  // namespace qmoe::testing

#endif
