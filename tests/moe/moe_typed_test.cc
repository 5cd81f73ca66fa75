// qmoe_moe_forward with X and Y in FP32, FP16 or BF16 (params.dtype). Per tier, level and
// dtype, with and without accumulate, on 1 and 3 threads, the typed forward must give exactly
// the bits of the FP32 forward wrapped in the library's conversions (X and the initial Y
// widened, Y rounded once), write only the M x H outputs (poisoned 16-bit buffers with guard
// elements and row gaps), work in place, and fit the workspace qmoe_moe_workspace_size reports;
// routing from 16-bit logits must be qmoe_moe_route_topk on the widened logits followed by it.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/activation_dtype_util.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/moe/moe_call.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

constexpr unsigned char kPoisonByte = 0xA5;
constexpr size_t kGuard = 16;  // elements before and after Y

struct SetDeleter {
  void operator()(qmoe_expert_set* s) const { qmoe_expert_set_destroy(s); }
};
using SetPtr = std::unique_ptr<qmoe_expert_set, SetDeleter>;

struct Layer {
  std::unique_ptr<MoeModel> model;
  SetPtr set;
};

// A small layer: H = 64 (FP32 exact rows would be read in place) or 80 (never in place).
Layer make_layer(uint32_t hidden, uint32_t block, std::mt19937_64& rng) {
  MoeOptions o;
  o.experts = 6;
  o.hidden = hidden;
  o.intermediate = block == 16 ? 48 : 64;  // I = 48: FC2 rows end in half a chunk
  use_gpt_oss_swiglu(&o);
  o.fc1.block_size = o.fc2.block_size = block;
  o.fc2.scale_dtype = QMOE_DTYPE_BF16;
  Layer layer;
  layer.model = make_moe_model(o, rng);
  qmoe_expert_set* raw = nullptr;
  EXPECT_EQ(qmoe_expert_set_create(&layer.model->desc, &raw), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  layer.set.reset(raw);
  return layer;
}

class MoeTyped : public IsaTest {};

TEST_P(MoeTyped, MatchesTheConversionsAroundTheFp32Forward) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  for (const auto& [hidden, block, m] : {std::tuple{64u, 32u, 1u}, std::tuple{80u, 16u, 4u}}) {
    const Layer layer = make_layer(hidden, block, rng);
    const uint32_t k = 2;
    std::vector<int32_t> ids;
    std::vector<float> weights;
    random_routing(m, layer.model->options.experts, k, rng, &ids, &weights);
    const size_t ldx = hidden + 2, ldy = hidden + 3;  // in elements; the gaps are never read
    const std::vector<float> x_values = random_activations(m, static_cast<uint32_t>(ldx), rng);
    const std::vector<float> y0_values = random_activations(m, static_cast<uint32_t>(ldy), rng);
    for (uint32_t threads : {1u, 3u}) {
      ContextPtr ctx = make_context(GetParam(), threads);
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        for (qmoe_dtype d : dtypes) {
          for (int accumulate : {0, 1}) {
            const std::string where =
                std::string(isa_name(GetParam())) + " " +
                (level == QMOE_ACCURACY_EXACT ? "exact" : "fast") + " " + dtype_name(d) +
                " H=" + std::to_string(hidden) + " m=" + std::to_string(m) +
                " threads=" + std::to_string(threads) + (accumulate ? " accumulate" : "") +
                " seed=" + std::to_string(seed);
            MoeCallOptions opt;
            opt.accumulate = accumulate;
            const std::vector<unsigned char> x = narrow(ctx.get(), d, x_values.data(), m * ldx);
            const std::vector<unsigned char> y0 = narrow(ctx.get(), d, y0_values.data(), m * ldy);

            // Reference: the FP32 forward on the widened X (and initial Y), then Y rounded.
            const std::vector<float> x32 = widen(ctx.get(), d, x);
            std::vector<float> y32 = widen(ctx.get(), d, y0);
            ASSERT_EQ(moe_forward(ctx.get(), layer.set.get(), level, m, x32.data(), ldx, ids.data(),
                                  weights.data(), k, y32.data(), ldy, &opt),
                      QMOE_STATUS_OK)
                << where << ": " << qmoe_last_error_message();
            const std::vector<unsigned char> want = narrow(ctx.get(), d, y32.data(), y32.size());

            const size_t es = element_size(d);
            std::vector<unsigned char> buffer((kGuard + m * ldy + kGuard) * es, kPoisonByte);
            unsigned char* y = buffer.data() + kGuard * es;
            for (uint32_t t = 0; t < m && accumulate; ++t) {
              std::memcpy(y + t * ldy * es, y0.data() + t * ldy * es, hidden * es);
            }
            ASSERT_EQ(moe_forward_typed(ctx.get(), layer.set.get(), level, m, d, x.data(), ldx,
                                        ids.data(), weights.data(), k, y, ldy, &opt),
                      QMOE_STATUS_OK)
                << where << ": " << qmoe_last_error_message();
            int reported = 0;
            for (size_t e = 0; e < buffer.size() / es; ++e) {
              const bool inside =
                  e >= kGuard && e < kGuard + m * ldy && (e - kGuard) % ldy < hidden;
              const unsigned char* got = buffer.data() + e * es;
              bool ok = true;
              if (inside) {
                ok = std::memcmp(got, want.data() + (e - kGuard) * es, es) == 0;
              } else {
                for (size_t b = 0; b < es; ++b) ok = ok && got[b] == kPoisonByte;
              }
              if (!ok && reported++ < 3) {
                ADD_FAILURE() << where << ": element " << e
                              << (inside ? " differs from the conversions" : " outside Y changed");
              }
            }

            // In place (y == x, ldy == ldx): the same bits as Y apart from X.
            if (d == QMOE_DTYPE_F32) continue;
            std::vector<unsigned char> xy = x;
            std::vector<unsigned char> apart =
                accumulate ? x : std::vector<unsigned char>(x.size());
            ASSERT_EQ(moe_forward_typed(ctx.get(), layer.set.get(), level, m, d, x.data(), ldx,
                                        ids.data(), weights.data(), k, apart.data(), ldx, &opt),
                      QMOE_STATUS_OK);
            ASSERT_EQ(moe_forward_typed(ctx.get(), layer.set.get(), level, m, d, xy.data(), ldx,
                                        ids.data(), weights.data(), k, xy.data(), ldx, &opt),
                      QMOE_STATUS_OK)
                << where << ": " << qmoe_last_error_message();
            for (uint32_t t = 0; t < m; ++t) {
              EXPECT_EQ(
                  std::memcmp(xy.data() + t * ldx * es, apart.data() + t * ldx * es, hidden * es),
                  0)
                  << where << " in place, token " << t;
            }
          }
        }
      }
    }
  }
}

// Routing from logits in the activation dtype is qmoe_moe_route_topk on the widened logits
// followed by the forward with those routes, bit for bit, for every dtype, level and accumulate
// mode.
TEST_P(MoeTyped, ForwardLogitsTypedIsRouteThenForwardTyped) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const Layer layer = make_layer(80, 16, rng);
  const uint32_t m = 3, k = 2, hidden = 80, experts = layer.model->options.experts;
  ContextPtr ctx = make_context(GetParam(), 2);
  const std::vector<float> x_values = random_activations(m, hidden, rng);
  const std::vector<float> y0_values = random_activations(m, hidden, rng);
  std::vector<float> logit_values(m * experts);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& v : logit_values) v = normal(rng);
  for (qmoe_dtype d : {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16}) {
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      for (int accumulate : {0, 1}) {
        const std::string where =
            std::string(dtype_name(d)) + " " + (level == QMOE_ACCURACY_EXACT ? "exact" : "fast") +
            (accumulate ? " accumulate" : "") + " seed=" + std::to_string(seed);
        MoeCallOptions opt;
        opt.accumulate = accumulate;
        const std::vector<unsigned char> x = narrow(ctx.get(), d, x_values.data(), m * hidden);
        const std::vector<unsigned char> logits =
            narrow(ctx.get(), d, logit_values.data(), m * experts);
        const std::vector<float> logits32 = widen(ctx.get(), d, logits);
        std::vector<int32_t> ids(m * k);
        std::vector<float> weights(m * k);
        ASSERT_EQ(
            qmoe_moe_route_topk(logits32.data(), m, experts, k, 1, ids.data(), weights.data()),
            QMOE_STATUS_OK);
        std::vector<unsigned char> want = narrow(ctx.get(), d, y0_values.data(), m * hidden);
        std::vector<unsigned char> got = want;
        ASSERT_EQ(moe_forward_typed(ctx.get(), layer.set.get(), level, m, d, x.data(), hidden,
                                    ids.data(), weights.data(), k, want.data(), hidden, &opt),
                  QMOE_STATUS_OK)
            << where << ": " << qmoe_last_error_message();
        ASSERT_EQ(moe_forward_logits_typed(ctx.get(), layer.set.get(), level, m, d, x.data(),
                                           hidden, logits.data(), k, 1, got.data(), hidden, &opt),
                  QMOE_STATUS_OK)
            << where << ": " << qmoe_last_error_message();
        EXPECT_EQ(got, want) << where;
        if (d != QMOE_DTYPE_F32) continue;
        std::vector<float> plain(y0_values.begin(), y0_values.end());
        ASSERT_EQ(moe_forward_logits(ctx.get(), layer.set.get(), level, m, x_values.data(), hidden,
                                     logit_values.data(), k, 1, plain.data(), hidden, &opt),
                  QMOE_STATUS_OK);
        EXPECT_EQ(std::memcmp(plain.data(), got.data(), got.size()), 0) << where;
      }
    }
  }
}

// The workspace qmoe_moe_workspace_size reports also fits a 16-bit forward where the FP32 one
// would read X in place (exact level, H % 32 == 0), and the typed forward checks its dtype and
// the byte extent of 16-bit X and Y.
TEST_P(MoeTyped, WorkspaceAndBadInput) {
  std::mt19937_64 rng(fresh_seed());
  const Layer layer = make_layer(64, 32, rng);
  ContextPtr ctx = make_context(GetParam(), 2);
  const uint32_t m = 2, k = 2, hidden = 64;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  random_routing(m, 6, k, rng, &ids, &weights);
  const std::vector<float> values = random_activations(m, hidden, rng);
  const std::vector<unsigned char> x =
      narrow(ctx.get(), QMOE_DTYPE_BF16, values.data(), m * hidden);
  std::vector<uint16_t> y(m * hidden), y_own(m * hidden);

  size_t bytes = 0;
  ASSERT_EQ(qmoe_moe_workspace_size(ctx.get(), layer.set.get(), QMOE_ACCURACY_EXACT, m, k, &bytes),
            QMOE_STATUS_OK);
  std::vector<unsigned char> workspace(bytes);
  MoeCallOptions opt;
  opt.workspace = workspace.data();
  opt.workspace_bytes = workspace.size();
  ASSERT_EQ(
      moe_forward_typed(ctx.get(), layer.set.get(), QMOE_ACCURACY_EXACT, m, QMOE_DTYPE_BF16,
                        x.data(), hidden, ids.data(), weights.data(), k, y.data(), hidden, &opt),
      QMOE_STATUS_OK)
      << qmoe_last_error_message();
  ASSERT_EQ(moe_forward_typed(ctx.get(), layer.set.get(), QMOE_ACCURACY_EXACT, m, QMOE_DTYPE_BF16,
                              x.data(), hidden, ids.data(), weights.data(), k, y_own.data(), hidden,
                              nullptr),
            QMOE_STATUS_OK);
  EXPECT_EQ(y, y_own);  // the caller's workspace and the context's give the same bits
  // With BF16 router logits too (widened into the same workspace).
  std::vector<float> logit_values(m * 6);
  for (size_t i = 0; i < logit_values.size(); ++i)
    logit_values[i] = 0.25f * static_cast<float>(i % 7);
  const std::vector<unsigned char> logits =
      narrow(ctx.get(), QMOE_DTYPE_BF16, logit_values.data(), logit_values.size());
  ASSERT_EQ(
      moe_forward_logits_typed(ctx.get(), layer.set.get(), QMOE_ACCURACY_EXACT, m, QMOE_DTYPE_BF16,
                               x.data(), hidden, logits.data(), k, 1, y.data(), hidden, &opt),
      QMOE_STATUS_OK)
      << qmoe_last_error_message();
  EXPECT_EQ(
      moe_forward_logits_typed(ctx.get(), layer.set.get(), QMOE_ACCURACY_EXACT, m, QMOE_DTYPE_BF16,
                               x.data(), hidden, nullptr, k, 1, y.data(), hidden, nullptr),
      QMOE_STATUS_INVALID_ARGUMENT);
  // Logits whose last BF16 element is Y's first: an overlap, counted in 2-byte elements.
  std::vector<uint16_t> logits_then_y(m * 6 + m * hidden, 0x3F80);
  EXPECT_EQ(moe_forward_logits_typed(ctx.get(), layer.set.get(), QMOE_ACCURACY_EXACT, m,
                                     QMOE_DTYPE_BF16, x.data(), hidden, logits_then_y.data(), k, 1,
                                     logits_then_y.data() + m * 6 - 1, hidden, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("logits and y overlap"), std::string::npos);

  std::vector<uint16_t> untouched(m * hidden, 0xA5A5);
  EXPECT_EQ(moe_forward_typed(ctx.get(), layer.set.get(), QMOE_ACCURACY_FAST, m,
                              static_cast<qmoe_dtype>(0), x.data(), hidden, ids.data(),
                              weights.data(), k, untouched.data(), hidden, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("dtype 0"), std::string::npos)
      << qmoe_last_error_message();
  for (uint16_t v : untouched) EXPECT_EQ(v, 0xA5A5);

  // X and Y in one 16-bit buffer: Y from X's last element overlaps, Y just past it does not.
  std::vector<uint16_t> both(2 * m * hidden, 0x3F80);
  const size_t x_elements = m * hidden;
  EXPECT_EQ(moe_forward_typed(ctx.get(), layer.set.get(), QMOE_ACCURACY_FAST, m, QMOE_DTYPE_F16,
                              both.data(), hidden, ids.data(), weights.data(), k,
                              both.data() + x_elements - 1, hidden, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("overlap"), std::string::npos);
  EXPECT_EQ(moe_forward_typed(ctx.get(), layer.set.get(), QMOE_ACCURACY_FAST, m, QMOE_DTYPE_F16,
                              both.data(), hidden, ids.data(), weights.data(), k,
                              both.data() + x_elements, hidden, nullptr),
            QMOE_STATUS_OK)
      << qmoe_last_error_message();
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(MoeTyped);

}  // namespace
}  // namespace qmoe::testing
