// The fast level's activation quantization, written from docs/formats.md ("Accuracy levels")
// and nothing else: per 32 consecutive k (the last chunk may be shorter), m = max|x|; a chunk
// with m below 2^-119 is flushed (q = 0, s = 0); otherwise s = m / 127 and r = 127 / m, each
// rounded to FP32, and q_k = round_half_even(x_k * r), the product rounded to FP32 first,
// clamped to [-127, 127]. The rounding to an integer is done here by hand (floor and compare),
// not by the FPU's rounding mode, so the test's quantizer shares no code path with the
// library's. Tests compare every tier's quantizer with it bit for bit, and the MoE reference
// feeds its q to FC1 (tests/moe/moe_reference.cc).
#ifndef QMOE_TESTS_GEMM_Q8_REFERENCE_H_
#define QMOE_TESTS_GEMM_Q8_REFERENCE_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace qmoe::testing {

struct Q8Reference {
  std::vector<int8_t> q;       // ceil(k / 32) * 32 values, 0 past k
  std::vector<float> scale;    // per chunk
  std::vector<int32_t> sum_q;  // per chunk
};

/// round_half_even of a finite double, by floor and comparison.
inline double round_half_even_by_hand(double t) {
  const double f = std::floor(t);
  const double frac = t - f;  // exact: t and f are within 1 of each other
  if (frac > 0.5) return f + 1.0;
  if (frac < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}

/// x[0, k) quantized as docs/formats.md states it; x must be finite.
inline Q8Reference reference_quantize_q8(const float* x, size_t k) {
  constexpr size_t kChunk = 32;
  const float flush_below = std::ldexp(1.0f, -119);
  const size_t chunks = (k + kChunk - 1) / kChunk;
  Q8Reference out;
  out.q.assign(chunks * kChunk, 0);
  out.scale.assign(chunks, 0.0f);
  out.sum_q.assign(chunks, 0);
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * kChunk, end = begin + kChunk < k ? begin + kChunk : k;
    float m = 0.0f;
    for (size_t i = begin; i < end; ++i) m = std::fabs(x[i]) > m ? std::fabs(x[i]) : m;
    if (m < flush_below) continue;  // q = 0, s = 0
    const float s = m / 127.0f;
    const float r = 127.0f / m;
    out.scale[c] = s;
    for (size_t i = begin; i < end; ++i) {
      const float product = x[i] * r;  // FP32, as the docs say
      double q = round_half_even_by_hand(static_cast<double>(product));
      q = q > 127.0 ? 127.0 : q < -127.0 ? -127.0 : q;
      out.q[i] = static_cast<int8_t>(q);
      out.sum_q[c] += static_cast<int32_t>(q);
    }
  }
  return out;
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_GEMM_Q8_REFERENCE_H_
