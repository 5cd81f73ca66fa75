// Scalar int8 activation quantizer of the fast level: the reference every SIMD ISA matches bit
// for bit on finite input.
#include <cstddef>
#include <cstdint>

#include "lib/cpu/kernels.h"
#include "lib/gemm/group_args.h"

namespace qmoe::scalar {

// x[0, k) -> q[0, chunks * 32), scale[chunks], sum_q[chunks]; symmetric per 32 k:
// scale = max|x| / 127, q = round-half-even(x * (127 / max|x|)); a chunk whose max|x| is below
// kQ8FlushBelow (zero included) gives q = 0 and scale 0 (lib/formats/int4_layout.h says why).
void quantize_activations_q8(const float* x, size_t k, int8_t* q, float* scale, float* sum_q) {
  const size_t chunks = (k + kChunkCodes - 1) / kChunkCodes;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t k0 = c * kChunkCodes;
    const size_t len = k - k0 < kChunkCodes ? k - k0 : kChunkCodes;
    float amax = 0.0f;
    for (size_t j = 0; j < len; ++j) {
      const float v = x[k0 + j] < 0 ? -x[k0 + j] : x[k0 + j];
      amax = v > amax ? v : amax;
    }
    const bool flush = amax < kQ8FlushBelow;
    const float s = flush ? 0.0f : amax / 127.0f;
    const float inv = flush ? 0.0f : 127.0f / amax;
    int32_t sum = 0;
    for (size_t j = 0; j < kChunkCodes; ++j) {
      int32_t v = 0;
      if (j < len) {
        // Round half to even (the default MXCSR mode, as the SIMD tiers), clamp, and map a
        // NaN to 0 before the cast so no input makes the conversion undefined.
        float t = __builtin_nearbyintf(x[k0 + j] * inv);
        t = t > 127.0f ? 127.0f : t;
        t = t < -127.0f ? -127.0f : t;
        v = t == t ? static_cast<int32_t>(t) : 0;
      }
      q[k0 + j] = static_cast<int8_t>(v);
      sum += v;
    }
    scale[c] = s;
    sum_q[c] = static_cast<float>(sum);
  }
}

}  // namespace qmoe::scalar
