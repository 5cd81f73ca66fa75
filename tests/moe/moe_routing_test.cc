// qmoe_moe_route_topk against routing computed in the test in FP64 from the same logits
// (tests/moe/moe_reference.h): random rows of every size class, masked experts and ties, both
// normalisations. The second guard of the renormalisation beside MoeRouting.HandComputedLogits
// (and of the layer's own routing: MoeLayer.ForwardLogitsEqualsRouteThenForward).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

TEST(MoeRouting, MatchesFp64SoftmaxTopK) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const struct {
    uint32_t experts, k;
  } shapes[] = {{1, 1}, {4, 4}, {8, 2}, {16, 4}, {64, 8}, {128, 8}, {128, 1}, {256, 16}};
  for (const auto& shape : shapes) {
    const uint32_t m = 9;
    std::vector<float> logits(size_t{m} * shape.experts);
    std::normal_distribution<float> spread(0.0f, 1.0f + static_cast<float>(rng() % 8));
    for (float& l : logits) l = spread(rng);
    // Row 1: ties (quantised logits); row 2: masked experts; row 3: one large outlier.
    for (uint32_t e = 0; e < shape.experts; ++e) {
      float& tie = logits[size_t{1} * shape.experts + e];
      tie = std::round(tie);
      if (e % 3 == 1 && e + 1 < shape.experts) logits[size_t{2} * shape.experts + e] = -INFINITY;
    }
    logits[size_t{3} * shape.experts + shape.experts / 2] = 60.0f;
    for (int renormalize : {1, 0}) {
      const std::string where =
          "E=" + std::to_string(shape.experts) + " k=" + std::to_string(shape.k) +
          " renormalize=" + std::to_string(renormalize) + " seed=" + std::to_string(seed);
      const Fp64Routing want = reference_route_topk(logits, m, shape.experts, shape.k, renormalize);
      std::vector<int32_t> ids(size_t{m} * shape.k, -7);
      std::vector<float> w(size_t{m} * shape.k, -1.0f);
      ASSERT_EQ(qmoe_moe_route_topk(logits.data(), m, shape.experts, shape.k, renormalize,
                                    ids.data(), w.data()),
                QMOE_STATUS_OK)
          << where << ": " << qmoe_last_error_message();
      ASSERT_EQ(ids, want.ids) << where;
      for (uint32_t t = 0; t < m; ++t) {
        double sum = 0, want_sum = 0;
        for (uint32_t j = 0; j < shape.k; ++j) {
          const size_t i = size_t{t} * shape.k + j;
          EXPECT_NEAR(w[i], want.weights[i], want.weight_error[i])
              << where << ": token " << t << " slot " << j;
          sum += w[i];
          want_sum += want.weights[i];
        }
        if (renormalize) {
          // The selected weights are a distribution of their own.
          EXPECT_NEAR(want_sum, 1.0, 1e-12) << where;
          EXPECT_NEAR(sum, 1.0, 4e-6 * shape.k) << where << ": token " << t;
        } else if (shape.k < shape.experts) {
          // Plain softmax probabilities: the unselected experts keep the rest.
          EXPECT_LE(want_sum, 1.0 + 1e-12) << where;
          EXPECT_LE(sum, 1.0 + 4e-6 * shape.k) << where;
        }
      }
    }
  }
}

}  // namespace
}  // namespace qmoe::testing
