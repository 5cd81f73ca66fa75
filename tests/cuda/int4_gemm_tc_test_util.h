// Helpers shared by the tensor-core GEMM's device tests and host emulation tests: element
// decoding, the documented tolerance, the X the kernel multiplies.
#ifndef QMOE_TESTS_CUDA_INT4_GEMM_TC_TEST_UTIL_H_
#define QMOE_TESTS_CUDA_INT4_GEMM_TC_TEST_UTIL_H_

#include <fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {

// One element of a y_dtype buffer, widened to double.
inline double element_value(qmoe_dtype d, const unsigned char* p) {
  uint16_t h;
  switch (d) {
    case QMOE_DTYPE_F16:
      std::memcpy(&h, p, 2);
      return fp16_ieee_to_fp32_value(h);
    case QMOE_DTYPE_BF16: {
      std::memcpy(&h, p, 2);
      const uint32_t bits = uint32_t{h} << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case QMOE_DTYPE_F32:
      break;
  }
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// The tolerance for y of dtype `yd` against a reference `ref` that the accumulation may miss by
// `acc`: the accumulation error, then rounding to the output type (half an ulp of |y|, taken
// generously as 2^-8 |y| for BF16 and 2^-11 |y| plus FP16's smallest subnormal step for FP16).
inline double output_tolerance(qmoe_dtype yd, double ref, double acc) {
  switch (yd) {
    case QMOE_DTYPE_BF16:
      return acc + 0x1p-8 * (std::fabs(ref) + acc);
    case QMOE_DTYPE_F16:
      return acc + 0x1p-11 * (std::fabs(ref) + acc) + 0x1p-24;
    case QMOE_DTYPE_F32:
      break;
  }
  return acc;
}

inline ContextPtr default_context() {
  qmoe_context* raw = nullptr;
  EXPECT_EQ(qmoe_context_create(nullptr, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  return ContextPtr(raw);
}

// The FP32 values of rows [0, m) x [0, k) of a strided buffer, densely.
inline std::vector<float> dense_rows(const std::vector<float>& strided, uint32_t m, uint32_t k,
                                     size_t ld) {
  std::vector<float> out(size_t{m} * k);
  for (uint32_t i = 0; i < m; ++i) {
    std::memcpy(out.data() + size_t{i} * k, strided.data() + i * ld, k * sizeof(float));
  }
  return out;
}

// x = hi + lo with hi, lo the BF16 roundings the kernel makes (hi = rn(x), lo = rn(x - hi)); the
// sum is exact in FP32.
inline std::vector<float> split_bf16_sum(qmoe_context* ctx, const std::vector<float>& x) {
  std::vector<uint16_t> bits(x.size());
  EXPECT_EQ(qmoe_convert_f32_to_bf16(ctx, x.data(), bits.data(), x.size()), QMOE_STATUS_OK);
  std::vector<float> hi(x.size()), rest(x.size()), lo(x.size());
  EXPECT_EQ(qmoe_convert_bf16_to_f32(ctx, bits.data(), hi.data(), x.size()), QMOE_STATUS_OK);
  for (size_t i = 0; i < x.size(); ++i) rest[i] = x[i] - hi[i];
  EXPECT_EQ(qmoe_convert_f32_to_bf16(ctx, rest.data(), bits.data(), x.size()), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_convert_bf16_to_f32(ctx, bits.data(), lo.data(), x.size()), QMOE_STATUS_OK);
  std::vector<float> sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = hi[i] + lo[i];
  return sum;
}

// v (finite, exactly a float) rounded to BF16, to nearest even, written here from the format's
// definition rather than taken from the library.
inline double round_to_bf16(double v) {
  const float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  float r;
  std::memcpy(&r, &bits, 4);
  return r;
}

// The FP64 Y = X W~^T + bias on the fast level's scaled weights (lib/cuda/int4_gemm_tc.cuh):
// each weight (code - zero point) * scale rounded once to BF16, as the kernels round it; y and
// abs_sum (sum_k |x w~|) only.
inline Reference scaled_weight_reference(const Int4Matrix& w, const std::vector<float>& x,
                                         uint32_t m) {
  const uint32_t n_total = w.options.n, k_total = w.options.k;
  Reference ref;
  ref.y.assign(size_t{m} * n_total, 0.0);
  ref.abs_sum.assign(size_t{m} * n_total, 0.0);
  std::vector<double> row(k_total);
  for (uint32_t n = 0; n < n_total; ++n) {
    for (uint32_t k = 0; k < k_total; ++k) row[k] = round_to_bf16(w.weight(n, k));
    for (uint32_t i = 0; i < m; ++i) {
      const float* xr = x.data() + size_t{i} * k_total;
      double y = 0.0, abs_sum = 0.0;
      for (uint32_t k = 0; k < k_total; ++k) {
        y += double{xr[k]} * row[k];
        abs_sum += std::fabs(double{xr[k]} * row[k]);
      }
      ref.y[size_t{i} * n_total + n] = y + w.bias_values[n];
      ref.abs_sum[size_t{i} * n_total + n] = abs_sum;
    }
  }
  return ref;
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_CUDA_INT4_GEMM_TC_TEST_UTIL_H_
