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

/// The fast level's activation error per 32 k of x[0, k) (docs/formats.md): half a step,
/// max|x| / 127 / 2, or max|x| itself in a chunk flushed to zero (max|x| below 2^-119).
inline std::vector<double> q8_half_steps(const float* x, size_t k) {
  std::vector<double> half_step((k + 31) / 32);
  for (size_t c = 0; c < half_step.size(); ++c) {
    double amax = 0;
    for (size_t i = c * 32; i < k && i < c * 32 + 32; ++i) {
      amax = std::fmax(amax, std::fabs(static_cast<double>(x[i])));
    }
    half_step[c] = amax < 0x1p-119 ? amax : amax / 127.0 / 2.0;
  }
  return half_step;
}

/// One output's FP64 sums against activation row x[0, k) and weights weight(k): the product y,
/// the sum of |x w| (the exact level's bound scales with it), and the fast level's activation
/// error sum half_step * |w| (half_step from q8_half_steps).
struct ReferenceRowSums {
  double y = 0, abs_sum = 0, quant = 0;
};
template <typename Weight>
ReferenceRowSums reference_row_sums(const float* x, const std::vector<double>& half_step, size_t k,
                                    Weight&& weight) {
  ReferenceRowSums s;
  for (size_t i = 0; i < k; ++i) {
    const double w = weight(i);
    s.y += x[i] * w;
    s.abs_sum += std::fabs(x[i] * w);
    s.quant += half_step[i / 32] * std::fabs(w);
  }
  return s;
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_GEMM_Q8_REFERENCE_H_
