// How a kernel's output compares with an exact value once stored as its dtype: half an ulp of
// the dtype's round to nearest, and overflow to the infinity of the value's sign
// (docs/formats.md). Header-only and free of CUDA headers, for the device tests and for the
// emulation tests that compile kernel sources on the host alike.
#ifndef QMOE_TESTS_CUDA_OUTPUT_ROUNDING_H_
#define QMOE_TESTS_CUDA_OUTPUT_ROUNDING_H_

#include <algorithm>
#include <cmath>

#include "qmoe/qmoe.h"

namespace qmoe::testing {

/// Half an ulp of the dtype at |v| (0 for FP32): the rounding a 16-bit output adds.
inline double dtype_half_ulp(qmoe_dtype d, double v) {
  if (d == QMOE_DTYPE_F32) return 0.0;
  const int mantissa = d == QMOE_DTYPE_F16 ? 10 : 7;
  const double a = std::fabs(v);
  if (a == 0.0) return d == QMOE_DTYPE_F16 ? std::ldexp(1.0, -25) : 0.0;
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  double ulp = std::ldexp(1.0, e - 1 - mantissa);
  if (d == QMOE_DTYPE_F16) ulp = std::max(ulp, std::ldexp(1.0, -24));
  return ulp / 2;
}

/// Whether `got`, an output stored as dtype d, can be `want` +- `tol` (an exact value and its
/// error bound) after d's round to nearest: within tol plus d's rounding at the larger
/// magnitude (1.01 half ulps), or, where want +- tol reaches d's overflow threshold (FP16
/// 65520, BF16 2^128 - 2^119, FP32 2^128 - 2^103), the infinity of want's sign. NaN never
/// matches.
inline bool output_matches(qmoe_dtype d, double got, double want, double tol) {
  if (std::isinf(got)) {
    const double threshold = d == QMOE_DTYPE_F16    ? 65520.0
                             : d == QMOE_DTYPE_BF16 ? std::ldexp(1.0, 128) - std::ldexp(1.0, 119)
                                                    : std::ldexp(1.0, 128) - std::ldexp(1.0, 103);
    return (got > 0) == (want > 0) && std::fabs(want) + tol >= threshold;
  }
  const double round_out = 1.01 * dtype_half_ulp(d, std::max(std::fabs(want), std::fabs(got)));
  return std::fabs(got - want) <= tol + round_out;
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_CUDA_OUTPUT_ROUNDING_H_
