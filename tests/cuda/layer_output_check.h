// The check of a MoE layer's outputs that the GPU layer tests share: against the FP64 layer
// reference (tests/moe/moe_reference.h) and, where given, the CPU library's layer. Header-only
// and free of CUDA headers, for the device tests and for the emulation tests that compile kernel
// sources on the host alike.
#ifndef QMOE_TESTS_CUDA_LAYER_OUTPUT_CHECK_H_
#define QMOE_TESTS_CUDA_LAYER_OUTPUT_CHECK_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/cuda/output_rounding.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {

/// Checks a layer's outputs y(t, n), rows [0, m) x columns [0, hidden) stored in `dtype`,
/// against the FP64 reference: within slack * ref.tol plus the dtype's rounding at the larger
/// magnitude (1.01 half ulps). Where the device routes from logits itself (its softmax weights
/// a few ulps from the CPU's, which the reference takes) the slack is 2, otherwise 1. Where `cpu`
/// (the CPU layer's outputs, [m][hidden]) is not empty, also against it: both are within their
/// bounds of the reference, so within (1 + slack) ref.tol plus `cpu_half_ulps` half ulps of each
/// other. Failures are counted in *bad, the first five reported with `what`.
template <class Y>
void check_layer_values(qmoe_dtype dtype, uint32_t m, uint32_t hidden, const Y& y,
                        const MoeReference& ref, const std::vector<float>& cpu, double slack,
                        double cpu_half_ulps, const std::string& what, size_t* bad) {
  for (uint32_t t = 0; t < m; ++t) {
    for (uint32_t n = 0; n < hidden; ++n) {
      const size_t at = size_t{t} * hidden + n;
      const double got = y(t, n);
      const double half_ulp = dtype_half_ulp(dtype, std::max(std::fabs(ref.y[at]), std::fabs(got)));
      const double tol = slack * ref.tol[at] + 1.01 * half_ulp;
      if (!(std::fabs(got - ref.y[at]) <= tol) && (*bad)++ < 5) {
        ADD_FAILURE() << "y[" << t << "," << n << "] = " << got << ", reference " << ref.y[at]
                      << " +- " << tol << "; " << what;
      }
      if (cpu.empty()) continue;
      const double tol_cpu = (1 + slack) * ref.tol[at] + cpu_half_ulps * half_ulp;
      if (!(std::fabs(got - cpu[at]) <= tol_cpu) && (*bad)++ < 5) {
        ADD_FAILURE() << "y[" << t << "," << n << "] = " << got << ", CPU layer " << cpu[at]
                      << " +- " << tol_cpu << "; " << what;
      }
    }
  }
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_CUDA_LAYER_OUTPUT_CHECK_H_
