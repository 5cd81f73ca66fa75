// One qmoe_gemm call into a poisoned Y, checked word by word: the GEMM tests of every format
// (INT4, INT3, MXFP4/NVFP4) run their cases through it, each with its own reference and bound.
#ifndef QMOE_TESTS_GEMM_POISONED_GEMM_H_
#define QMOE_TESTS_GEMM_POISONED_GEMM_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"

namespace qmoe::testing {

/// What Y holds where the call must not write.
inline constexpr float kGemmPoison = -12345.678f;
/// Poisoned words before and after Y.
inline constexpr size_t kGemmGuard = 16;

/// Y = X W^T over columns [n_begin, n_end) into a poisoned Y with row stride n + 5 between
/// guard words. Checks that the call succeeds, that every written value is within `bound(o)` of
/// `reference(o)` (o = row * n + col; the FP64 reference and the level's bound) and that every
/// other word still holds the poison; returns the outputs (n per row, the poison outside the
/// columns). Reports at most three mismatches per call, each with `where`.
template <typename Reference, typename Bound>
std::vector<float> gemm_into_poisoned_y(qmoe_context* ctx, const qmoe_quant_matrix& w,
                                        qmoe_accuracy level, const std::vector<float>& x,
                                        uint32_t m, uint32_t n_begin, uint32_t n_end,
                                        Reference&& reference, Bound&& bound,
                                        const std::string& where) {
  const uint32_t n = w.n, k = w.k;
  const size_t ldy = size_t{n} + 5;
  std::vector<float> buffer(kGemmGuard + size_t{m} * ldy + kGemmGuard, kGemmPoison);
  const qmoe_status status =
      qmoe_gemm(ctx, &w, level, m, x.data(), k, buffer.data() + kGemmGuard, ldy, n_begin, n_end);
  EXPECT_EQ(status, QMOE_STATUS_OK) << where << ": " << qmoe_last_error_message();
  std::vector<float> out(size_t{m} * n, kGemmPoison);
  int reported = 0;
  for (size_t i = 0; i < buffer.size(); ++i) {
    const bool inside = i >= kGemmGuard && i < kGemmGuard + size_t{m} * ldy;
    const size_t row = inside ? (i - kGemmGuard) / ldy : 0;
    const size_t col = inside ? (i - kGemmGuard) % ldy : 0;
    if (!inside || col < n_begin || col >= n_end) {
      if (std::memcmp(&buffer[i], &kGemmPoison, sizeof(float)) != 0 && reported++ < 3) {
        ADD_FAILURE() << where << ": word " << i << " outside the output columns changed to "
                      << buffer[i];
      }
      continue;
    }
    const size_t o = row * n + col;
    out[o] = buffer[i];
    const double want = reference(o), tol = bound(o) + 1e-30;
    const double err = std::fabs(static_cast<double>(buffer[i]) - want);
    if (!(err <= tol) && reported++ < 3) {
      ADD_FAILURE() << where << ": Y[" << row << "," << col << "] = " << buffer[i]
                    << ", FP64 reference " << want << ", |err| " << err << " > tol " << tol;
    }
  }
  return out;
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_GEMM_POISONED_GEMM_H_
