// A MoE layer whose experts are MXFP4 (gpt-oss's format and activation: interleaved gate and up,
// alpha 1.702, beta 1, limit 7), and one with NVFP4 experts, through qmoe_moe_forward on every
// tier and level: against an FP64 layer computed from the weights' decoded values
// (tests/gemm/fp4_reference.h), with guard words around Y, and bitwise the same on 1 and 3
// threads. The executor takes any format through the GEMM driver; this checks that an E2M1
// format really runs there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/fp4_reference.h"
#include "tests/moe/moe_call.h"
#include "tests/moe/moe_fp4_reference.h"

namespace qmoe::testing {
namespace {

constexpr float kPoison = -12345.678f;

class MoeFp4 : public IsaTest {};

TEST_P(MoeFp4, MatchesFp64ReferenceAndThreadCount) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (qmoe_weight_format format : {QMOE_WEIGHT_FORMAT_MXFP4, QMOE_WEIGHT_FORMAT_NVFP4}) {
    const uint32_t experts = 6, hidden = 96, inter = 64, k = 3;
    std::unique_ptr<Fp4Experts> e = make_fp4_experts(format, experts, hidden, inter, rng);
    ASSERT_NE(e->set, nullptr);
    for (uint32_t m : {1u, 4u, 7u}) {
      std::vector<float> x = random_activations(m, hidden, rng);
      std::vector<int32_t> ids(size_t{m} * k);
      std::vector<float> weights(size_t{m} * k);
      for (uint32_t t = 0; t < m; ++t) {
        std::vector<int32_t> order(experts);
        for (uint32_t i = 0; i < experts; ++i) order[i] = static_cast<int32_t>(i);
        std::shuffle(order.begin(), order.end(), rng);
        for (uint32_t j = 0; j < k; ++j) {
          ids[t * k + j] = order[j];
          weights[t * k + j] = 0.2f + 0.1f * static_cast<float>(j);
        }
      }
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        const std::string where = std::string(isa_name(GetParam())) + " " +
                                  fp4_format_name(format) +
                                  (level == QMOE_ACCURACY_EXACT ? " exact" : " fast") +
                                  " m=" + std::to_string(m) + " seed=" + std::to_string(seed);
        std::vector<double> y_ref, tol;
        reference_fp4_moe(*e, x, m, ids, weights, k, level, &y_ref, &tol);
        std::vector<float> ys[2];
        int t = 0;
        for (uint32_t threads : {1u, 3u}) {
          ContextPtr ctx = make_context(GetParam(), threads);
          const size_t ldy = hidden + 3;
          std::vector<float> y(size_t{m} * ldy + 8, kPoison);
          ASSERT_EQ(moe_forward(ctx.get(), e->set.get(), level, m, x.data(), hidden, ids.data(),
                                weights.data(), k, y.data(), ldy, nullptr),
                    QMOE_STATUS_OK)
              << where << ": " << qmoe_last_error_message();
          int reported = 0;
          for (size_t i = 0; i < y.size(); ++i) {
            const bool inside = i < size_t{m} * ldy && i % ldy < hidden;
            if (!inside) {
              if (std::memcmp(&y[i], &kPoison, 4) != 0 && reported++ < 3) {
                ADD_FAILURE() << where << ": guard word " << i << " changed";
              }
              continue;
            }
            const size_t o = i / ldy * hidden + i % ldy;
            if (!(std::fabs(y[i] - y_ref[o]) <= tol[o] + 1e-30) && reported++ < 3) {
              ADD_FAILURE() << where << ": y[" << o << "] = " << y[i] << ", FP64 " << y_ref[o]
                            << ", tol " << tol[o];
            }
          }
          ys[t++] = y;
        }
        EXPECT_EQ(std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * sizeof(float)), 0)
            << where << ": 1 and 3 threads differ";
      }
    }
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(MoeFp4);

}  // namespace
}  // namespace qmoe::testing
