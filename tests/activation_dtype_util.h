// Test helpers for activations in FP32, FP16 or BF16 (qmoe_gemm_typed, qmoe_moe_forward):
// raw element buffers, converted with the ABI's own conversions, so a typed call can be
// compared bit for bit with the FP32 call wrapped in those conversions.
#ifndef QMOE_TESTS_ACTIVATION_DTYPE_UTIL_H_
#define QMOE_TESTS_ACTIVATION_DTYPE_UTIL_H_

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "qmoe/qmoe.h"

namespace qmoe::testing {

inline size_t element_size(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? 4 : 2;
}

inline const char* dtype_name(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? "f32" : d == QMOE_DTYPE_F16 ? "f16" : "bf16";
}

/// FP32 values -> elements of `d` (raw bytes), through the ABI's conversions on `ctx`.
inline std::vector<unsigned char> narrow(qmoe_context* ctx, qmoe_dtype d, const float* src,
                                         size_t n) {
  std::vector<unsigned char> out(n * element_size(d));
  if (d == QMOE_DTYPE_F32) {
    std::memcpy(out.data(), src, n * sizeof(float));
  } else {
    auto* dst = reinterpret_cast<uint16_t*>(out.data());
    const qmoe_status s = d == QMOE_DTYPE_F16 ? qmoe_convert_f32_to_f16(ctx, src, dst, n)
                                              : qmoe_convert_f32_to_bf16(ctx, src, dst, n);
    EXPECT_EQ(s, QMOE_STATUS_OK);
  }
  return out;
}

/// Elements of `d` -> FP32 values.
inline std::vector<float> widen(qmoe_context* ctx, qmoe_dtype d,
                                const std::vector<unsigned char>& src) {
  const size_t n = src.size() / element_size(d);
  std::vector<float> out(n);
  if (d == QMOE_DTYPE_F32) {
    std::memcpy(out.data(), src.data(), n * sizeof(float));
  } else {
    const auto* bits = reinterpret_cast<const uint16_t*>(src.data());
    const qmoe_status s = d == QMOE_DTYPE_F16 ? qmoe_convert_f16_to_f32(ctx, bits, out.data(), n)
                                              : qmoe_convert_bf16_to_f32(ctx, bits, out.data(), n);
    EXPECT_EQ(s, QMOE_STATUS_OK);
  }
  return out;
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_ACTIVATION_DTYPE_UTIL_H_
