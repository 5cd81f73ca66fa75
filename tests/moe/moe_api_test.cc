// MoE routing on hand-computed logits, and bad input to every MoE entry point: a status, a
// message, nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/destroy_race.h"
#include "tests/moe/moe_call.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

constexpr float kPoison = -12345.678f;

bool poisoned(const std::vector<float>& v) {
  for (float f : v) {
    if (std::memcmp(&f, &kPoison, sizeof f) != 0) return false;
  }
  return true;
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(const std::vector<float>& logits, uint32_t m, uint32_t experts, uint32_t k,
             int renormalize) {
  Routed r{std::vector<int32_t>(size_t{m} * k, -7), std::vector<float>(size_t{m} * k, kPoison)};
  EXPECT_EQ(qmoe_moe_route_topk(logits.data(), m, experts, k, renormalize, r.ids.data(),
                                r.weights.data()),
            QMOE_STATUS_OK)
      << qmoe_last_error_message();
  return r;
}

TEST(MoeRouting, HandComputedLogits) {
  const float inf = std::numeric_limits<float>::infinity();
  // Row 0: experts 1 and 3 tie at the top (lower id first). Row 1: 2 and 4 tie, expert 0 is
  // masked with -infinity.
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f,  -1.0f,  //
                                     -inf, 0.0f, 0.5f, -1.0f, 0.5f};
  Routed r = route(logits, 2, 5, 3, 1);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3, 2, 2, 4, 1}));
  // Renormalised: exp(l - max) / sum over the three selected.
  const double row0 = 2.0 + std::exp(-1.0), row1 = 2.0 + std::exp(-0.5);
  const double want_renorm[] = {1 / row0, 1 / row0, std::exp(-1.0) / row0,
                                1 / row1, 1 / row1, std::exp(-0.5) / row1};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(r.weights[i], want_renorm[i], 2e-7) << i;
  EXPECT_NEAR(r.weights[0] + r.weights[1] + r.weights[2], 1.0, 3e-7);
  // Not renormalised: the softmax over all five experts.
  r = route(logits, 2, 5, 3, 0);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3, 2, 2, 4, 1}));
  const double all0 = 2.0 + std::exp(-1.0) + std::exp(-2.0) + std::exp(-4.0);
  const double all1 = 2.0 + std::exp(-0.5) + std::exp(-1.5);
  const double want_softmax[] = {1 / all0, 1 / all0, std::exp(-1.0) / all0,
                                 1 / all1, 1 / all1, std::exp(-0.5) / all1};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(r.weights[i], want_softmax[i], 2e-7) << i;

  // All equal: the lowest ids, equal weights; k = E orders every expert.
  r = route({5.0f, 5.0f, 5.0f, 5.0f}, 1, 4, 2, 1);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(r.weights, (std::vector<float>{0.5f, 0.5f}));
  r = route({0.1f, -0.2f, 0.3f}, 1, 3, 3, 0);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0, 1}));
  EXPECT_NEAR(r.weights[0] + r.weights[1] + r.weights[2], 1.0, 3e-7);
  // Top-1 renormalised is weight 1 exactly; a large spread keeps weights positive and ordered.
  r = route({-30.0f, 40.0f, 39.0f}, 1, 3, 1, 1);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1}));
  EXPECT_EQ(r.weights, (std::vector<float>{1.0f}));
}

TEST(MoeRouting, BadInputGetsAStatus) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits = {0.5f, 1.0f, -1.0f, 2.0f};
  std::vector<int32_t> ids(2, -7);
  std::vector<float> w(2, kPoison);
  auto call = [&](const float* l, uint32_t m, uint32_t e, uint32_t k, int32_t* i, float* ww) {
    return qmoe_moe_route_topk(l, m, e, k, 1, i, ww);
  };
  EXPECT_EQ(call(logits.data(), 0, 4, 2, ids.data(), w.data()), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(logits.data(), 1, 0, 2, ids.data(), w.data()), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(logits.data(), 1, 4, 0, ids.data(), w.data()), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(logits.data(), 1, 4, 5, ids.data(), w.data()), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("k = 5"), std::string::npos);
  EXPECT_EQ(call(nullptr, 1, 4, 2, ids.data(), w.data()), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(logits.data(), 1, 4, 2, nullptr, w.data()), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(logits.data(), 1, 4, 2, ids.data(), nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(logits.data(), 1, 4, 2, ids.data(), logits.data() + 1),
            QMOE_STATUS_INVALID_ARGUMENT);  // weights overlap logits
  for (float bad : {std::nanf(""), inf}) {
    logits[2] = bad;
    EXPECT_EQ(call(logits.data(), 1, 4, 2, ids.data(), w.data()), QMOE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(qmoe_last_error_message()).find("logits[0, 2]"), std::string::npos);
  }
  logits = {-inf, -inf, -inf, -inf};
  EXPECT_EQ(call(logits.data(), 1, 4, 2, ids.data(), w.data()), QMOE_STATUS_INVALID_ARGUMENT);
  // More experts than int32_t ids can name: refused before a logit is read (an id above
  // INT32_MAX once came back negative with OK).
  EXPECT_EQ(call(logits.data(), 1, 0x80000000u, 1, ids.data(), w.data()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("int32_t"), std::string::npos);
  EXPECT_EQ(ids, (std::vector<int32_t>{-7, -7}));
  EXPECT_TRUE(poisoned(w));
}

struct SetDeleter {
  void operator()(qmoe_expert_set* s) const { qmoe_expert_set_destroy(s); }
};
using SetPtr = std::unique_ptr<qmoe_expert_set, SetDeleter>;

class MoeApi : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(11);
    MoeOptions o;
    o.experts = 4;
    o.hidden = 64;
    o.intermediate = 32;
    model_ = make_moe_model(o, rng);
    qmoe_context_options co;
    qmoe_context_options_init(&co);
    co.num_threads = 2;
    ASSERT_EQ(qmoe_context_create(&co, &ctx_), QMOE_STATUS_OK);
  }
  void TearDown() override { qmoe_context_destroy(ctx_); }

  qmoe_status create(const qmoe_expert_set_desc& d) {
    qmoe_expert_set* set = reinterpret_cast<qmoe_expert_set*>(&model_);  // must become NULL
    const qmoe_status s = qmoe_expert_set_create(&d, &set);
    if (s == QMOE_STATUS_OK) {
      qmoe_expert_set_destroy(set);
    } else {
      EXPECT_EQ(set, nullptr);
      EXPECT_STRNE(qmoe_last_error_message(), "");
    }
    return s;
  }

  std::unique_ptr<MoeModel> model_;
  qmoe_context* ctx_ = nullptr;
};

TEST_F(MoeApi, ExpertSetCreateRejectsBadDescriptions) {
  const qmoe_expert_set_desc good = model_->desc;
  EXPECT_EQ(create(good), QMOE_STATUS_OK);
  auto with = [&](auto&& edit) {
    qmoe_expert_set_desc d = good;
    edit(d);
    return create(d);
  };
  EXPECT_EQ(qmoe_expert_set_create(&good, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  qmoe_expert_set* out = nullptr;
  EXPECT_EQ(qmoe_expert_set_create(nullptr, &out), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.struct_size = 8; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.struct_size = 1u << 20; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.num_experts = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.hidden = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.intermediate = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.swiglu_fusion = static_cast<qmoe_swiglu_fusion>(0); }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.swiglu_fusion = static_cast<qmoe_swiglu_fusion>(3); }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.swiglu_alpha = std::nanf(""); }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.swiglu_beta = INFINITY; }), QMOE_STATUS_INVALID_ARGUMENT);
  for (float limit : {0.0f, -1.0f, std::nanf(""), -INFINITY}) {
    EXPECT_EQ(with([&](auto& d) { d.swiglu_limit = limit; }), QMOE_STATUS_INVALID_ARGUMENT)
        << limit;
  }
  EXPECT_NE(std::string(qmoe_last_error_message()).find("swiglu_limit"), std::string::npos);
  EXPECT_EQ(with([](auto& d) { d.fc1 = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.fc2 = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  // More experts than descriptions is the caller's error; fewer is fine. A hidden or
  // intermediate size that the matrices do not have is a shape mismatch naming the expert.
  EXPECT_EQ(with([](auto& d) { d.num_experts = 3; }), QMOE_STATUS_OK);
  EXPECT_EQ(with([](auto& d) { d.hidden = 32; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("expert 0 fc1"), std::string::npos);
  EXPECT_EQ(with([](auto& d) { d.intermediate = 64; }), QMOE_STATUS_INVALID_ARGUMENT);

  // One bad expert among good ones: its index and projection are named.
  std::vector<const qmoe_quant_matrix*> fc2 = model_->fc2_desc;
  fc2[2] = nullptr;
  EXPECT_EQ(with([&](auto& d) { d.fc2 = fc2.data(); }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("expert 2 fc2"), std::string::npos);
  fc2[2] = model_->fc1_desc[2];  // [2I, H] where [H, I] is expected
  EXPECT_EQ(with([&](auto& d) { d.fc2 = fc2.data(); }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("expected [64, 32]"), std::string::npos);
  qmoe_quant_matrix unknown = model_->fc2[3].desc;
  unknown.format = static_cast<qmoe_weight_format>(9);
  fc2 = model_->fc2_desc;
  fc2[3] = &unknown;
  EXPECT_EQ(with([&](auto& d) { d.fc2 = fc2.data(); }), QMOE_STATUS_UNSUPPORTED_FORMAT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("expert 3 fc2"), std::string::npos);
  qmoe_quant_matrix no_codes = model_->fc1[1].desc;
  no_codes.codes = nullptr;
  std::vector<const qmoe_quant_matrix*> fc1 = model_->fc1_desc;
  fc1[1] = &no_codes;
  EXPECT_EQ(with([&](auto& d) { d.fc1 = fc1.data(); }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("expert 1 fc1"), std::string::npos);

  // A caller compiled before alpha, beta and limit existed gets their defaults.
  EXPECT_EQ(with([](auto& d) { d.struct_size = offsetof(qmoe_expert_set_desc, swiglu_alpha); }),
            QMOE_STATUS_OK);
}

TEST_F(MoeApi, DestroyedSetIsRejected) {
  EXPECT_EQ(qmoe_expert_set_destroy(nullptr), QMOE_STATUS_OK);
  qmoe_expert_set* set = nullptr;
  ASSERT_EQ(qmoe_expert_set_create(&model_->desc, &set), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_expert_set_destroy(set), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_expert_set_destroy(set), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("destroyed"), std::string::npos);
  std::vector<float> x(64, 1.0f), y(64, kPoison);
  const int32_t ids[2] = {0, 1};
  const float w[2] = {0.5f, 0.5f};
  EXPECT_EQ(moe_forward(ctx_, set, QMOE_ACCURACY_EXACT, 1, x.data(), 64, ids, w, 2, y.data(), 64,
                        nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_TRUE(poisoned(y));
}

// Two threads destroying the same set at once: one frees it, the other is told it was
// destroyed (it once freed it a second time).
TEST_F(MoeApi, RacingDestroysFreeTheSetOnce) {
  constexpr int kRounds = 20000;
  const qmoe_test::DestroyRaceCounts counts = qmoe_test::race_destroys<qmoe_expert_set>(
      kRounds,
      [this] {
        qmoe_expert_set* set = nullptr;
        return qmoe_expert_set_create(&model_->desc, &set) == QMOE_STATUS_OK ? set : nullptr;
      },
      [](qmoe_expert_set* set) { return qmoe_expert_set_destroy(set); },
      QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(counts.ok, kRounds);
  EXPECT_EQ(counts.rejected, kRounds);
  EXPECT_EQ(counts.other, 0);
}

// One token that lists the same expert twice runs it twice: at M = 1 its two routes read the
// token's row from the gathered rows, which M = 1 otherwise never needs (this crashed once).
TEST_F(MoeApi, OneTokenListingAnExpertTwiceRunsItTwice) {
  qmoe_expert_set* raw = nullptr;
  ASSERT_EQ(qmoe_expert_set_create(&model_->desc, &raw), QMOE_STATUS_OK);
  SetPtr set(raw);
  const uint32_t h = 64;
  std::vector<float> x(h);
  for (uint32_t i = 0; i < h; ++i) x[i] = std::cos(0.21f * i);
  const std::vector<int32_t> ids = {2, 2};
  const std::vector<float> weights = {0.25f, 0.5f};
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    std::vector<float> y(h, kPoison);
    ASSERT_EQ(moe_forward(ctx_, set.get(), level, 1, x.data(), h, ids.data(), weights.data(), 2,
                          y.data(), h, nullptr),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    const MoeReference ref = reference_moe(*model_, level, x, 1, ids, weights, 2, nullptr, {});
    for (uint32_t i = 0; i < h; ++i) {
      EXPECT_LE(std::fabs(y[i] - ref.y[i]), ref.tol[i]) << "level " << level << " i " << i;
    }
  }
}

// Without a workspace the forward borrows the context's scratch; calls that overlap on one
// context (a caller's threads, no pool serialising them) must each get their own scratch and the
// same bits as a call alone.
TEST_F(MoeApi, ConcurrentForwardsOnOneContextAgreeWithACallAlone) {
  qmoe_context_options co;
  qmoe_context_options_init(&co);
  co.num_threads = 1;  // no pool: nothing serialises the callers
  qmoe_context* shared = nullptr;
  ASSERT_EQ(qmoe_context_create(&co, &shared), QMOE_STATUS_OK);
  qmoe_expert_set* raw = nullptr;
  ASSERT_EQ(qmoe_expert_set_create(&model_->desc, &raw), QMOE_STATUS_OK);
  SetPtr set(raw);
  constexpr uint32_t kThreads = 4, kCalls = 40, kM = 3, kH = 64;
  std::vector<std::vector<float>> x(kThreads), expected(kThreads);
  const int32_t ids[kM * 2] = {0, 1, 2, 3, 1, 2};
  const float w[kM * 2] = {0.5f, 0.5f, 0.25f, 0.75f, 1.0f, -0.5f};
  for (uint32_t t = 0; t < kThreads; ++t) {
    x[t].resize(kM * kH);
    for (uint32_t i = 0; i < kM * kH; ++i) x[t][i] = std::sin(0.37f * i + t);
    expected[t].assign(kM * kH, kPoison);
    ASSERT_EQ(moe_forward(shared, set.get(), QMOE_ACCURACY_FAST, kM, x[t].data(), kH, ids, w, 2,
                          expected[t].data(), kH, nullptr),
              QMOE_STATUS_OK);
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> callers;
  for (uint32_t t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      std::vector<float> y(kM * kH);
      for (uint32_t call = 0; call < kCalls; ++call) {
        std::fill(y.begin(), y.end(), kPoison);
        if (moe_forward(shared, set.get(), QMOE_ACCURACY_FAST, kM, x[t].data(), kH, ids, w, 2,
                        y.data(), kH, nullptr) != QMOE_STATUS_OK ||
            std::memcmp(y.data(), expected[t].data(), y.size() * sizeof(float)) != 0) {
          ++mismatches;
        }
      }
    });
  }
  for (std::thread& c : callers) c.join();
  EXPECT_EQ(mismatches.load(), 0);
  qmoe_context_destroy(shared);
}

TEST_F(MoeApi, ForwardRejectsBadInputAndWritesNothing) {
  qmoe_expert_set* raw = nullptr;
  ASSERT_EQ(qmoe_expert_set_create(&model_->desc, &raw), QMOE_STATUS_OK);
  SetPtr set(raw);
  const uint32_t m = 2, k = 2, h = 64;
  std::vector<float> x(m * h, 0.5f), y(m * h, kPoison), w = {0.5f, 0.5f, 0.25f, 0.75f};
  std::vector<int32_t> ids = {0, 1, 2, 3};
  struct Call {
    qmoe_context* ctx;
    const qmoe_expert_set* set;
    qmoe_accuracy level = QMOE_ACCURACY_FAST;
    uint32_t m = 2;
    const float* x;
    size_t ldx = 64;
    const int32_t* ids;
    const float* w;
    uint32_t k = 2;
    float* y;
    size_t ldy = 64;
    const MoeCallOptions* options = nullptr;
  };
  const Call good{ctx_, set.get(),  QMOE_ACCURACY_FAST, m, x.data(),
                  h,    ids.data(), w.data(),           k, y.data()};
  auto forward = [](const Call& c) {
    return moe_forward(c.ctx, c.set, c.level, c.m, c.x, c.ldx, c.ids, c.w, c.k, c.y, c.ldy,
                       c.options);
  };
  auto with = [&](auto&& edit) {
    Call c = good;
    edit(c);
    return forward(c);
  };
  EXPECT_EQ(with([](Call& c) { c.ctx = nullptr; }), QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_EQ(with([](Call& c) { c.set = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([&](Call& c) { c.set = reinterpret_cast<const qmoe_expert_set*>(x.data()); }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.level = static_cast<qmoe_accuracy>(0); }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.level = static_cast<qmoe_accuracy>(3); }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.m = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.k = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.k = 5; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.x = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.y = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.ids = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.w = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.ldx = 63; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.ldy = 63; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](Call& c) { c.ldx = SIZE_MAX / 2; }), QMOE_STATUS_INVALID_ARGUMENT);
  for (int32_t bad : {-1, 4, INT32_MIN}) {
    std::vector<int32_t> bad_ids = ids;
    bad_ids[3] = bad;
    EXPECT_EQ(with([&](Call& c) { c.ids = bad_ids.data(); }), QMOE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(qmoe_last_error_message()).find("ids[3]"), std::string::npos);
  }
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> bad_w = w;
    bad_w[1] = bad;
    EXPECT_EQ(with([&](Call& c) { c.w = bad_w.data(); }), QMOE_STATUS_INVALID_ARGUMENT);
  }
  // Overlaps: y over part of x, y == x with another stride, weights inside y.
  std::vector<float> big(4 * h, 0.5f);
  EXPECT_EQ(with([&](Call& c) {
              c.x = big.data();
              c.y = big.data() + 1;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([&](Call& c) {
              c.x = big.data();
              c.y = big.data();
              c.ldy = 2 * h;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([&](Call& c) {
              c.y = big.data();
              c.w = big.data() + 3;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  // The workspace too small or overlapping y.
  MoeCallOptions opt;
  size_t bytes = 0;
  ASSERT_EQ(qmoe_moe_workspace_size(ctx_, set.get(), QMOE_ACCURACY_FAST, m, k, &bytes),
            QMOE_STATUS_OK);
  std::vector<unsigned char> workspace(bytes);
  opt.workspace = workspace.data();
  opt.workspace_bytes = bytes - 64;
  EXPECT_EQ(with([&](Call& c) { c.options = &opt; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("qmoe_moe_workspace_size"),
            std::string::npos);
  std::vector<float> huge(bytes, kPoison);
  opt.workspace = huge.data();
  opt.workspace_bytes = bytes;
  EXPECT_EQ(with([&](Call& c) {
              c.options = &opt;
              c.y = huge.data() + 8;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_TRUE(poisoned(y));
  // The run mask inside y, or inside the workspace.
  opt = MoeCallOptions{};
  opt.run_mask = reinterpret_cast<const uint8_t*>(y.data() + 1);
  EXPECT_EQ(with([&](Call& c) { c.options = &opt; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("run_mask"), std::string::npos);
  opt.workspace = workspace.data();
  opt.workspace_bytes = bytes;
  opt.run_mask = workspace.data() + bytes / 2;
  EXPECT_EQ(with([&](Call& c) { c.options = &opt; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_TRUE(poisoned(y));
  // A workspace size that runs past the end of the address space (so that an end computed
  // from it would wrap below x), around x.
  opt = MoeCallOptions{};
  opt.workspace = big.data();
  opt.workspace_bytes = SIZE_MAX - 8;
  EXPECT_EQ(with([&](Call& c) {
              c.options = &opt;
              c.x = big.data() + 2 * h;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  // y, or the workspace, over an expert's weights (its codes, its scales).
  auto* fc2_codes = static_cast<float*>(const_cast<void*>(model_->fc2[3].desc.codes));
  auto* fc1_scales = static_cast<float*>(const_cast<void*>(model_->fc1[0].desc.scales));
  for (float* target : {fc2_codes, fc1_scales}) {
    EXPECT_EQ(with([&](Call& c) {
                c.m = 1;
                c.y = target;
              }),
              QMOE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(qmoe_last_error_message()).find("weights"), std::string::npos);
  }
  // A workspace that starts in an expert's codes. It is larger than those codes, so where the
  // heap put x or y right after them the x/y check may speak first: any overlap message.
  opt.workspace = fc2_codes;
  opt.workspace_bytes = bytes;
  EXPECT_EQ(with([&](Call& c) { c.options = &opt; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("overlap"), std::string::npos);
  EXPECT_TRUE(poisoned(y));
  // Deterministically: expert 3's FC2 codes copied to the start of an arena that also holds
  // the whole workspace, so the workspace can overlap nothing but those codes.
  {
    std::vector<unsigned char> arena(bytes + 4096);
    const size_t codes_bytes = model_->fc2[3].codes.size();
    std::memcpy(arena.data(), model_->fc2[3].codes.data(), codes_bytes);
    qmoe_quant_matrix moved = model_->fc2[3].desc;
    moved.codes = arena.data();
    std::vector<const qmoe_quant_matrix*> fc2_moved = model_->fc2_desc;
    fc2_moved[3] = &moved;
    qmoe_expert_set_desc desc = model_->desc;
    desc.fc2 = fc2_moved.data();
    qmoe_expert_set* raw_moved = nullptr;
    ASSERT_EQ(qmoe_expert_set_create(&desc, &raw_moved), QMOE_STATUS_OK);
    SetPtr moved_set(raw_moved);
    opt = MoeCallOptions{};
    opt.workspace = arena.data();
    opt.workspace_bytes = bytes;
    EXPECT_EQ(with([&](Call& c) {
                c.set = moved_set.get();
                c.options = &opt;
              }),
              QMOE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(qmoe_last_error_message()).find("weights"), std::string::npos);
    EXPECT_TRUE(poisoned(y));
    opt.workspace = arena.data() + 2048;  // past the codes (at most 1 KiB here): accepted
    ASSERT_LE(codes_bytes, 2048u);
    EXPECT_EQ(with([&](Call& c) {
                c.set = moved_set.get();
                c.options = &opt;
              }),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    std::fill(y.begin(), y.end(), kPoison);
  }

  // The params struct itself: NULL, a struct_size no version had, both routings or neither.
  {
    qmoe_moe_params p =
        moe_params(QMOE_ACCURACY_FAST, m, QMOE_DTYPE_F32, x.data(), h, k, y.data(), h, nullptr);
    p.ids = ids.data();
    p.weights = w.data();
    EXPECT_EQ(qmoe_moe_forward(ctx_, set.get(), nullptr), QMOE_STATUS_INVALID_ARGUMENT);
    for (size_t size : {size_t{0}, size_t{8}, sizeof p - 1, size_t{1} << 20}) {
      qmoe_moe_params bad = p;
      bad.struct_size = size;
      EXPECT_EQ(qmoe_moe_forward(ctx_, set.get(), &bad), QMOE_STATUS_INVALID_ARGUMENT) << size;
      EXPECT_NE(std::string(qmoe_last_error_message()).find("struct_size"), std::string::npos);
    }
    std::vector<float> logits(m * 4, 0.5f);
    qmoe_moe_params both = p;
    both.logits = logits.data();
    EXPECT_EQ(qmoe_moe_forward(ctx_, set.get(), &both), QMOE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(qmoe_last_error_message()).find("either"), std::string::npos);
    qmoe_moe_params neither = p;
    neither.ids = nullptr;
    neither.weights = nullptr;
    EXPECT_EQ(qmoe_moe_forward(ctx_, set.get(), &neither), QMOE_STATUS_INVALID_ARGUMENT);
    qmoe_moe_params half = p;
    half.logits = logits.data();
    half.ids = nullptr;
    EXPECT_EQ(qmoe_moe_forward(ctx_, set.get(), &half), QMOE_STATUS_INVALID_ARGUMENT);
    for (int32_t dtype : {0, 4, -1}) {
      qmoe_moe_params bad = p;
      bad.dtype = static_cast<qmoe_dtype>(dtype);
      EXPECT_EQ(qmoe_moe_forward(ctx_, set.get(), &bad), QMOE_STATUS_INVALID_ARGUMENT) << dtype;
    }
    EXPECT_TRUE(poisoned(y));
  }

  // The logits routing: bad logits are reported before anything is written.
  std::vector<float> logits = {0.1f, 0.2f, std::nanf(""), 0.4f, 0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(moe_forward_logits(ctx_, set.get(), QMOE_ACCURACY_EXACT, m, x.data(), h, logits.data(),
                               k, 1, y.data(), h, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(moe_forward_logits(ctx_, set.get(), QMOE_ACCURACY_EXACT, m, x.data(), h, nullptr, k, 1,
                               y.data(), h, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_TRUE(poisoned(y));

  // The size query.
  EXPECT_EQ(qmoe_moe_workspace_size(nullptr, set.get(), QMOE_ACCURACY_FAST, m, k, &bytes),
            QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_EQ(qmoe_moe_workspace_size(ctx_, nullptr, QMOE_ACCURACY_FAST, m, k, &bytes),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_moe_workspace_size(ctx_, set.get(), QMOE_ACCURACY_FAST, m, k, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_moe_workspace_size(ctx_, set.get(), QMOE_ACCURACY_FAST, 0, k, &bytes),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_moe_workspace_size(ctx_, set.get(), QMOE_ACCURACY_FAST, m, 5, &bytes),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_moe_workspace_size(ctx_, set.get(), static_cast<qmoe_accuracy>(9), m, k, &bytes),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_moe_workspace_size(ctx_, set.get(), QMOE_ACCURACY_FAST, UINT32_MAX, 4, &bytes),
            QMOE_STATUS_INVALID_ARGUMENT);

  // And the good call still works (and writes every output: no element keeps the poison, which
  // is itself finite).
  EXPECT_EQ(forward(good), QMOE_STATUS_OK) << qmoe_last_error_message();
  for (float v : y) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_NE(std::memcmp(&v, &kPoison, sizeof(float)), 0) << "an output was not written";
  }
}

TEST(MoeApiValues, EnumValuesAreFixed) {
  EXPECT_EQ(QMOE_SWIGLU_INTERLEAVED, 1);
  EXPECT_EQ(QMOE_SWIGLU_CONCATENATED, 2);
  qmoe_expert_set_desc d;
  qmoe_expert_set_desc_init(&d);
  EXPECT_EQ(d.struct_size, sizeof d);
  EXPECT_EQ(d.swiglu_fusion, QMOE_SWIGLU_INTERLEAVED);
  EXPECT_EQ(d.swiglu_alpha, 1.0f);
  EXPECT_EQ(d.swiglu_beta, 0.0f);
  EXPECT_TRUE(std::isinf(d.swiglu_limit) && d.swiglu_limit > 0);
  qmoe_moe_params p;
  std::memset(&p, 0xAB, sizeof p);
  qmoe_moe_params_init(&p);
  EXPECT_EQ(p.struct_size, sizeof p);
  EXPECT_EQ(p.accuracy, QMOE_ACCURACY_FAST);
  EXPECT_EQ(p.dtype, QMOE_DTYPE_F32);
  EXPECT_EQ(p.m, 0u);
  EXPECT_EQ(p.k, 0u);
  EXPECT_EQ(p.x, nullptr);
  EXPECT_EQ(p.y, nullptr);
  EXPECT_EQ(p.ids, nullptr);
  EXPECT_EQ(p.weights, nullptr);
  EXPECT_EQ(p.logits, nullptr);
  EXPECT_EQ(p.renormalize, 1);
  EXPECT_EQ(p.run_mask, nullptr);
  EXPECT_EQ(p.accumulate, 0);
  EXPECT_EQ(p.workspace, nullptr);
  EXPECT_EQ(p.workspace_bytes, 0u);
  qmoe_moe_params_init(nullptr);  // a no-op
}

}  // namespace
}  // namespace qmoe::testing
