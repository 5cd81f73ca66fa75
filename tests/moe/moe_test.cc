// The expert FFN and the MoE layer through the C ABI, per tier and accuracy level: against an
// FP64 reference with the bound of tests/moe/moe_reference.h, for both SwiGLU fusions, gpt-oss and
// Qwen3 activation parameters, block sizes 16 and 32, M = 1, 3, 4 and top-2/3; thread-count
// independence (bitwise), the run-mask subset mode, accumulation, in-place residual, caller
// workspaces, poisoned guard words around Y, and that fusion and activation parameters reach
// the computation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/int4_reference.h"
#include "tests/moe/moe_call.h"
#include "tests/moe/moe_reference.h"
#include "tests/threaded_runs.h"

namespace qmoe::testing {
namespace {

constexpr float kPoison = -12345.678f;
constexpr size_t kGuard = 16;

struct SetDeleter {
  void operator()(qmoe_expert_set* s) const { qmoe_expert_set_destroy(s); }
};
using SetPtr = std::unique_ptr<qmoe_expert_set, SetDeleter>;

SetPtr make_set(const MoeModel& model) {
  qmoe_expert_set* raw = nullptr;
  EXPECT_EQ(qmoe_expert_set_create(&model.desc, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  return SetPtr(raw);
}

const char* level_name(qmoe_accuracy a) {
  return a == QMOE_ACCURACY_EXACT ? "exact" : "fast";
}

// X with a spread of magnitudes; `gain` scales it so FC1 outputs cross gpt-oss's limit of 7.
std::vector<float> moe_activations(uint32_t m, uint32_t hidden, float gain, std::mt19937_64& rng) {
  std::vector<float> x = random_activations(m, hidden, rng);
  for (float& v : x) v *= gain;
  return x;
}

// Y inside a poisoned buffer with guard words before, after and between rows (ldy > H).
struct GuardedY {
  uint32_t m, hidden;
  size_t ldy;
  std::vector<float> buffer;
  GuardedY(uint32_t rows, uint32_t h, const std::vector<float>* init = nullptr)
      : m(rows), hidden(h), ldy(h + 3), buffer(2 * kGuard + rows * (h + 3), kPoison) {
    if (init != nullptr) {
      for (uint32_t t = 0; t < m; ++t) {
        std::memcpy(data() + t * ldy, init->data() + size_t{t} * hidden, hidden * sizeof(float));
      }
    }
  }
  float* data() { return buffer.data() + kGuard; }
  std::vector<float> rows() const {
    std::vector<float> out(size_t{m} * hidden);
    for (uint32_t t = 0; t < m; ++t) {
      std::memcpy(out.data() + size_t{t} * hidden, buffer.data() + kGuard + t * ldy,
                  hidden * sizeof(float));
    }
    return out;
  }
  // Every word outside the m x hidden outputs still holds the poison.
  int guards_changed() const {
    int changed = 0;
    for (size_t i = 0; i < buffer.size(); ++i) {
      const bool inside =
          i >= kGuard && i < kGuard + size_t{m} * ldy && (i - kGuard) % ldy < hidden;
      if (!inside && std::memcmp(&buffer[i], &kPoison, sizeof(float)) != 0) ++changed;
    }
    return changed;
  }
};

// Compares against the reference; reports the first few failures with the seed and indices.
void expect_within(const std::vector<float>& got, const MoeReference& ref,
                   const std::string& where) {
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref.y[i]);
    if (!(err <= ref.tol[i]) && reported++ < 3) {
      ADD_FAILURE() << where << ": y[" << i << "] = " << got[i] << ", FP64 reference " << ref.y[i]
                    << ", |err| " << err << " > tol " << ref.tol[i];
    }
  }
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Shape {
  uint32_t experts, hidden, intermediate, block, k, m;
};

MoeOptions options_for(const Shape& s, qmoe_swiglu_fusion fusion, bool gpt_oss) {
  MoeOptions o;
  o.experts = s.experts;
  o.hidden = s.hidden;
  o.intermediate = s.intermediate;
  o.fusion = fusion;
  if (gpt_oss) {
    use_gpt_oss_swiglu(&o);
  } else {
    use_qwen3_swiglu(&o);
  }
  // ONNX Runtime's plane order ([N, K/block], FP16 scales) for FC1 and gpt-oss-like biases;
  // the canonical fast path ([K/block, N]) for FC2, zero points in one of them.
  o.fc1.block_size = s.block;
  o.fc1.scale_order = ScaleOrder::kRowMajor;
  o.fc1.bias = gpt_oss;
  o.fc2.block_size = s.block;
  o.fc2.scale_dtype = QMOE_DTYPE_BF16;
  o.fc2.zero_points = !gpt_oss;
  o.fc2.bias = gpt_oss;
  return o;
}

class MoeLayer : public IsaTest {
 protected:
  // The tier's contexts in every thread configuration (tests/threaded_runs.h), made on first use.
  ThreadedRuns& runs() {
    if (runs_ == nullptr) runs_ = std::make_unique<ThreadedRuns>(GetParam());
    return *runs_;
  }

  // One forward against the reference, with guard words; returns Y.
  std::vector<float> run_checked(qmoe_context* ctx, const MoeModel& model, qmoe_expert_set* set,
                                 qmoe_accuracy level, const std::vector<float>& x, uint32_t m,
                                 const std::vector<int32_t>& ids, const std::vector<float>& w,
                                 uint32_t k, const uint8_t* mask, const std::vector<float>* y0,
                                 const std::string& where) {
    const MoeReference ref = reference_moe(model, level, x, m, ids, w, k, mask,
                                           y0 != nullptr ? *y0 : std::vector<float>{});
    return run_against(ctx, model, set, level, x, m, ids, w, k, mask, y0, ref, where);
  }
  // The same against a reference computed once for several runs.
  std::vector<float> run_against(qmoe_context* ctx, const MoeModel& model, qmoe_expert_set* set,
                                 qmoe_accuracy level, const std::vector<float>& x, uint32_t m,
                                 const std::vector<int32_t>& ids, const std::vector<float>& w,
                                 uint32_t k, const uint8_t* mask, const std::vector<float>* y0,
                                 const MoeReference& ref, const std::string& where) {
    const uint32_t hidden = model.options.hidden;
    GuardedY y(m, hidden, y0);
    MoeCallOptions opt;
    opt.run_mask = mask;
    opt.accumulate = y0 != nullptr;
    EXPECT_EQ(moe_forward(ctx, set, level, m, x.data(), hidden, ids.data(), w.data(), k, y.data(),
                          y.ldy, &opt),
              QMOE_STATUS_OK)
        << where << ": " << qmoe_last_error_message();
    EXPECT_EQ(y.guards_changed(), 0) << where;
    const std::vector<float> got = y.rows();
    expect_within(got, ref, where);
    return got;
  }

 private:
  std::unique_ptr<ThreadedRuns> runs_;
};

TEST_P(MoeLayer, MatchesFp64Reference) {
  const uint64_t seed = fresh_seed();
  const Shape shapes[] = {
      {6, 64, 32, 32, 2, 1}, {8, 96, 64, 32, 3, 3}, {7, 80, 48, 16, 2, 4}, {8, 64, 64, 16, 3, 4}};
  size_t clamped = 0;
  int variant = 0;
  for (const Shape& shape : shapes) {
    for (qmoe_swiglu_fusion fusion : {QMOE_SWIGLU_INTERLEAVED, QMOE_SWIGLU_CONCATENATED}) {
      for (bool gpt_oss : {true, false}) {
        const uint64_t case_seed = seed + ++variant;
        std::mt19937_64 rng(case_seed);
        const MoeOptions o = options_for(shape, fusion, gpt_oss);
        const auto model = make_moe_model(o, rng);
        SetPtr set = make_set(*model);
        const std::vector<float> x = moe_activations(shape.m, shape.hidden, 6.0f, rng);
        std::vector<int32_t> ids;
        std::vector<float> w;
        random_routing(shape.m, shape.experts, shape.k, rng, &ids, &w);
        for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
          const std::string where = std::string(isa_name(GetParam())) + "/" + level_name(level) +
                                    " " + o.describe() + " m=" + std::to_string(shape.m) +
                                    " k=" + std::to_string(shape.k) +
                                    " seed=" + std::to_string(case_seed);
          // Every thread configuration meets the reference and gives the one-thread bits.
          const MoeReference ref =
              reference_moe(*model, level, x, shape.m, ids, w, shape.k, nullptr, {});
          std::vector<float> first;
          for (const ThreadedRun& run : runs().runs()) {
            const std::vector<float> got =
                run_against(run.ctx, *model, set.get(), level, x, shape.m, ids, w, shape.k, nullptr,
                            nullptr, ref, where + " on " + run.label);
            if (first.empty()) first = got;
            const long i = first_bit_difference(first.data(), got.data(), got.size());
            EXPECT_LT(i, 0) << where << ": y[" << i << "] on " << run.label
                            << " differs from one thread's";
          }
        }
        if (gpt_oss) {
          clamped +=
              reference_moe(*model, QMOE_ACCURACY_EXACT, x, shape.m, ids, w, shape.k, nullptr, {})
                  .clamped;
        }
      }
    }
  }
  EXPECT_GT(clamped, 0u) << "the gpt-oss cases never reached the clamp limit";
  EXPECT_GT(runs().pool().split_calls(), 0u) << "no phase was split over threads";
}

// Routing from logits (softmax, top-k, renormalisation) feeding the layer, against the FP64
// reference with the routing computed in the test from the logits (tests/moe/moe_reference.h),
// not by qmoe_moe_route_topk; qmoe_moe_route_topk's ids must be the test's and its weights
// within their bound; and the logits entry point equals routing then forward, bit for bit, in
// every thread configuration.
TEST_P(MoeLayer, ForwardLogitsEqualsRouteThenForward) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  MoeOptions o = options_for({8, 96, 64, 32, 3, 4}, QMOE_SWIGLU_INTERLEAVED, true);
  const auto model = make_moe_model(o, rng);
  SetPtr set = make_set(*model);
  constexpr uint32_t k = 3;
  for (uint32_t m : {1u, 4u}) {
    const std::vector<float> x = moe_activations(m, o.hidden, 4.0f, rng);
    std::normal_distribution<float> logit(0.0f, 2.0f);
    std::vector<float> logits(size_t{m} * o.experts);
    for (float& l : logits) l = logit(rng);
    if (m == 4) {
      logits[1 * o.experts + 5] = -INFINITY;                         // a masked expert
      logits[2 * o.experts + 1] = logits[2 * o.experts + 6] = 9.0f;  // a tie at the top
    }
    for (int renormalize : {1, 0}) {
      const Fp64Routing routing = reference_route_topk(logits, m, o.experts, k, renormalize);
      std::vector<int32_t> ids(size_t{m} * k);
      std::vector<float> w(size_t{m} * k);
      ASSERT_EQ(
          qmoe_moe_route_topk(logits.data(), m, o.experts, k, renormalize, ids.data(), w.data()),
          QMOE_STATUS_OK);
      EXPECT_EQ(ids, routing.ids) << "renormalize=" << renormalize << " seed=" << seed;
      for (size_t i = 0; i < w.size(); ++i) {
        EXPECT_NEAR(w[i], routing.weights[i], routing.weight_error[i])
            << "slot " << i << " renormalize=" << renormalize << " seed=" << seed;
      }
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        const std::string where = std::string(isa_name(GetParam())) + "/" + level_name(level) +
                                  " m=" + std::to_string(m) +
                                  " renormalize=" + std::to_string(renormalize) +
                                  " seed=" + std::to_string(seed);
        const MoeReference ref = reference_moe_routed(*model, level, x, m, routing, k, {});
        for (const ThreadedRun& run : runs().runs()) {
          GuardedY routed(m, o.hidden), y(m, o.hidden);
          ASSERT_EQ(moe_forward(run.ctx, set.get(), level, m, x.data(), o.hidden, ids.data(),
                                w.data(), k, routed.data(), routed.ldy, nullptr),
                    QMOE_STATUS_OK)
              << qmoe_last_error_message();
          ASSERT_EQ(moe_forward_logits(run.ctx, set.get(), level, m, x.data(), o.hidden,
                                       logits.data(), k, renormalize, y.data(), y.ldy, nullptr),
                    QMOE_STATUS_OK)
              << qmoe_last_error_message();
          EXPECT_EQ(y.guards_changed(), 0) << where << " on " << run.label;
          expect_within(y.rows(), ref, where + " on " + run.label);
          EXPECT_TRUE(bitwise_equal(y.rows(), routed.rows())) << where << " on " << run.label;
        }
      }
    }
  }
}

// The sum over experts is in a fixed order: 1, 2 and 3 threads (and a caller's parallel-for
// that runs tasks in reverse) give the same bits, on shapes large enough to split experts.
void reverse_parallel_for(void*, qmoe_parallel_task_fn task, void* state, size_t range) {
  for (size_t i = range; i-- > 0;) task(state, i);
}

TEST_P(MoeLayer, ThreadCountDoesNotChangeTheResult) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (qmoe_swiglu_fusion fusion : {QMOE_SWIGLU_INTERLEAVED, QMOE_SWIGLU_CONCATENATED}) {
    const MoeOptions o = options_for({8, 256, 160, 32, 3, 4}, fusion, true);
    const auto model = make_moe_model(o, rng);
    SetPtr set = make_set(*model);
    for (uint32_t m : {1u, 4u}) {
      const std::vector<float> x = moe_activations(m, o.hidden, 3.0f, rng);
      std::vector<int32_t> ids;
      std::vector<float> w;
      random_routing(m, o.experts, 3, rng, &ids, &w);
      // At M = 4: experts 0, 1 and 3 have non-consecutive tokens (gathered rows), expert 6
      // tokens 2 and 3 (rows read in place), the others one token each.
      if (m == 4) ids = {0, 1, 2, 3, 4, 5, 0, 6, 7, 1, 3, 6};
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        std::vector<std::vector<float>> results;
        for (uint32_t threads : {1u, 2u, 3u}) {
          ContextPtr ctx = make_context(GetParam(), threads);
          GuardedY y(m, o.hidden);
          ASSERT_EQ(moe_forward(ctx.get(), set.get(), level, m, x.data(), o.hidden, ids.data(),
                                w.data(), 3, y.data(), y.ldy, nullptr),
                    QMOE_STATUS_OK)
              << qmoe_last_error_message();
          results.push_back(y.rows());
        }
        qmoe_context_options co;
        qmoe_context_options_init(&co);
        co.max_isa = static_cast<qmoe_isa>(GetParam());
        co.num_threads = 5;
        co.parallel_for = reverse_parallel_for;
        qmoe_context* raw = nullptr;
        ASSERT_EQ(qmoe_context_create(&co, &raw), QMOE_STATUS_OK);
        ContextPtr reverse(raw);
        GuardedY y(m, o.hidden);
        ASSERT_EQ(moe_forward(reverse.get(), set.get(), level, m, x.data(), o.hidden, ids.data(),
                              w.data(), 3, y.data(), y.ldy, nullptr),
                  QMOE_STATUS_OK);
        results.push_back(y.rows());
        // And the test's own pool, whose workers run tasks concurrently.
        GuardedY pooled(m, o.hidden);
        ASSERT_EQ(moe_forward(runs().runs().back().ctx, set.get(), level, m, x.data(), o.hidden,
                              ids.data(), w.data(), 3, pooled.data(), pooled.ldy, nullptr),
                  QMOE_STATUS_OK);
        results.push_back(pooled.rows());
        for (size_t i = 1; i < results.size(); ++i) {
          EXPECT_TRUE(bitwise_equal(results[0], results[i]))
              << level_name(level) << " m=" << m << " run " << i << " seed=" << seed;
        }
      }
    }
  }
}

// Offload's cold subset: marking every expert is bitwise the full layer; a subset S and its
// complement add up to the full layer; each matches the reference restricted to its experts;
// a token none of whose experts is marked gets 0.
TEST_P(MoeLayer, RunMaskSubsetIsThePartialSum) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const MoeOptions o = options_for({8, 96, 64, 32, 3, 4}, QMOE_SWIGLU_INTERLEAVED, false);
  const auto model = make_moe_model(o, rng);
  SetPtr set = make_set(*model);
  ContextPtr ctx = make_context(GetParam(), 3);
  const uint32_t m = 4, k = 3;
  const std::vector<float> x = moe_activations(m, o.hidden, 2.0f, rng);
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 3, 5};  // token 2 uses 6, 7, 0
  std::vector<float> w = {0.5f, 0.3f, 0.2f, 0.6f, 0.3f, 0.1f, 0.4f, 0.4f, 0.2f, 0.7f, 0.2f, 0.1f};
  const std::vector<uint8_t> all(o.experts, 1), none(o.experts, 0);
  const std::vector<uint8_t> cold = {1, 0, 1, 0, 0, 0, 0, 0};  // tokens 1 and 3: none cold
  std::vector<uint8_t> hot(o.experts);
  for (uint32_t e = 0; e < o.experts; ++e) hot[e] = !cold[e];
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    const std::string where = std::string(level_name(level)) + " seed=" + std::to_string(seed);
    const auto full = run_checked(ctx.get(), *model, set.get(), level, x, m, ids, w, k, nullptr,
                                  nullptr, where + " full");
    const auto marked = run_checked(ctx.get(), *model, set.get(), level, x, m, ids, w, k,
                                    all.data(), nullptr, where + " all marked");
    EXPECT_TRUE(bitwise_equal(full, marked)) << where;
    const auto part = run_checked(ctx.get(), *model, set.get(), level, x, m, ids, w, k, cold.data(),
                                  nullptr, where + " cold");
    for (uint32_t n = 0; n < o.hidden; ++n) {
      EXPECT_EQ(part[1 * o.hidden + n], 0.0f) << where;
      EXPECT_EQ(part[3 * o.hidden + n], 0.0f) << where;
    }
    const auto rest = run_checked(ctx.get(), *model, set.get(), level, x, m, ids, w, k, hot.data(),
                                  nullptr, where + " hot");
    for (size_t i = 0; i < full.size(); ++i) {
      const double sum = static_cast<double>(part[i]) + rest[i];
      EXPECT_NEAR(sum, full[i], 1e-5 * (std::fabs(part[i]) + std::fabs(rest[i])) + 1e-30)
          << where << " index " << i;
    }
    const auto nothing = run_checked(ctx.get(), *model, set.get(), level, x, m, ids, w, k,
                                     none.data(), nullptr, where + " none");
    for (float v : nothing) EXPECT_EQ(v, 0.0f) << where;
    // The caller adds the cold part to its own hot part: accumulate onto the hot result.
    const auto joined = run_checked(ctx.get(), *model, set.get(), level, x, m, ids, w, k,
                                    cold.data(), &rest, where + " cold onto hot");
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_NEAR(joined[i], full[i], 1e-5 * (std::fabs(part[i]) + std::fabs(rest[i])) + 1e-30)
          << where << " index " << i;
    }
  }
}

// accumulate: y += result (checked against the reference with y0), and in place: y == x gives
// the residual x + MoE(x) (with accumulate) or MoE(x) (without).
TEST_P(MoeLayer, AccumulateAndInPlace) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const MoeOptions o = options_for({6, 64, 32, 32, 2, 3}, QMOE_SWIGLU_CONCATENATED, true);
  const auto model = make_moe_model(o, rng);
  SetPtr set = make_set(*model);
  ContextPtr ctx = make_context(GetParam(), 2);
  const uint32_t m = 3, k = 2;
  const std::vector<float> x = moe_activations(m, o.hidden, 4.0f, rng);
  const std::vector<float> y0 = moe_activations(m, o.hidden, 1.0f, rng);
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(m, o.experts, k, rng, &ids, &w);
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    const std::string where = std::string(level_name(level)) + " seed=" + std::to_string(seed);
    run_checked(ctx.get(), *model, set.get(), level, x, m, ids, w, k, nullptr, &y0,
                where + " accumulate");
    const auto plain =
        run_checked(ctx.get(), *model, set.get(), level, x, m, ids, w, k, nullptr, nullptr, where);
    for (int accumulate : {0, 1}) {
      std::vector<float> xy = x;
      MoeCallOptions opt;
      opt.accumulate = accumulate;
      ASSERT_EQ(moe_forward(ctx.get(), set.get(), level, m, xy.data(), o.hidden, ids.data(),
                            w.data(), k, xy.data(), o.hidden, &opt),
                QMOE_STATUS_OK)
          << qmoe_last_error_message();
      if (accumulate) {
        // X + MoE(X), summed from X onwards: against the FP64 reference with Y0 = X. (Not
        // against x + plain within a bound on |x| + |plain|: the experts' terms can cancel, and
        // the partial sums then exceed both.)
        expect_within(xy, reference_moe(*model, level, x, m, ids, w, k, nullptr, x),
                      where + " in place, accumulate");
      } else {
        for (size_t i = 0; i < xy.size(); ++i) {
          EXPECT_EQ(xy[i], plain[i]) << where << " in place, index " << i;  // bitwise
        }
      }
    }
  }
}

// Zero-weight slots are skipped (their expert does not run for that token), and an expert
// listed twice for one token contributes twice. Running a zero-weighted expert and multiplying
// its output by 0 would give the same zeros for finite weights, so the second half gives the
// zero-weighted experts NaN FC2 scales: skipped, they change nothing; run, they make NaN.
TEST_P(MoeLayer, ZeroWeightsAndRepeatedExperts) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const MoeOptions o = options_for({6, 64, 32, 32, 3, 2}, QMOE_SWIGLU_INTERLEAVED, false);
  const auto model = make_moe_model(o, rng);
  SetPtr set = make_set(*model);
  ContextPtr ctx = make_context(GetParam(), 2);
  const std::vector<float> x = moe_activations(2, o.hidden, 2.0f, rng);
  const std::vector<int32_t> ids = {4, 4, 1, 2, 5, 0};
  const std::vector<float> w = {0.25f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f};
  std::vector<std::vector<float>> finite;
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    const auto y =
        run_checked(ctx.get(), *model, set.get(), level, x, 2, ids, w, 3, nullptr, nullptr,
                    std::string(level_name(level)) + " seed=" + std::to_string(seed));
    for (uint32_t n = 0; n < o.hidden; ++n) EXPECT_EQ(y[o.hidden + n], 0.0f);
    finite.push_back(y);
  }

  // Experts 0, 1, 2 and 5 carry only zero weights: every FC2 scale of theirs becomes a NaN, in
  // place (the set reads the model's planes where they are).
  for (int e : {0, 1, 2, 5}) {
    Int4Matrix& fc2 = model->fc2[e];
    const size_t element = fc2.desc.scale_dtype == QMOE_DTYPE_F32 ? 4 : 2;
    // Quiet NaN in each dtype: FP32 0x7FC00000, FP16 0x7E00, BF16 0x7FC0.
    const uint32_t nan = fc2.desc.scale_dtype == QMOE_DTYPE_F32   ? 0x7FC00000u
                         : fc2.desc.scale_dtype == QMOE_DTYPE_F16 ? 0x7E00u
                                                                  : 0x7FC0u;
    for (size_t i = 0; i + element <= fc2.scales.size(); i += element) {
      std::memcpy(fc2.scales.data() + i, &nan, element);
    }
  }
  const qmoe_accuracy levels[] = {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST};
  for (int l = 0; l < 2; ++l) {
    std::vector<float> y(size_t{2} * o.hidden, -1.0f);
    ASSERT_EQ(moe_forward(ctx.get(), set.get(), levels[l], 2, x.data(), o.hidden, ids.data(),
                          w.data(), 3, y.data(), o.hidden, nullptr),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(std::memcmp(&y[i], &finite[l][i], sizeof(float)), 0)
          << level_name(levels[l]) << " y[" << i << "] = " << y[i] << " with NaN scales on the "
          << "zero-weighted experts, " << finite[l][i] << " without: a zero-weighted expert ran";
    }
  }
}

// A caller workspace (misaligned on purpose) gives the same bits as the library's scratch.
TEST_P(MoeLayer, CallerWorkspace) {
  std::mt19937_64 rng(fresh_seed());
  const MoeOptions o = options_for({7, 80, 48, 16, 2, 4}, QMOE_SWIGLU_CONCATENATED, true);
  const auto model = make_moe_model(o, rng);
  SetPtr set = make_set(*model);
  ContextPtr ctx = make_context(GetParam(), 3);
  const uint32_t m = 4, k = 2;
  const std::vector<float> x = moe_activations(m, o.hidden, 4.0f, rng);
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(m, o.experts, k, rng, &ids, &w);
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    size_t bytes = 0;
    ASSERT_EQ(qmoe_moe_workspace_size(ctx.get(), set.get(), level, m, k, &bytes), QMOE_STATUS_OK);
    std::vector<unsigned char> workspace(bytes + 3, 0xA5);
    std::vector<float> own(size_t{m} * o.hidden), given(size_t{m} * o.hidden);
    ASSERT_EQ(moe_forward(ctx.get(), set.get(), level, m, x.data(), o.hidden, ids.data(), w.data(),
                          k, own.data(), o.hidden, nullptr),
              QMOE_STATUS_OK);
    MoeCallOptions opt;
    opt.workspace = workspace.data() + 3;
    opt.workspace_bytes = bytes;
    ASSERT_EQ(moe_forward(ctx.get(), set.get(), level, m, x.data(), o.hidden, ids.data(), w.data(),
                          k, given.data(), o.hidden, &opt),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    EXPECT_TRUE(bitwise_equal(own, given)) << level_name(level);
    opt.workspace_bytes = bytes - 1;
    EXPECT_EQ(moe_forward(ctx.get(), set.get(), level, m, x.data(), o.hidden, ids.data(), w.data(),
                          k, given.data(), o.hidden, &opt),
              QMOE_STATUS_INVALID_ARGUMENT);
  }
}

// The fusion and the activation parameters reach the computation: a set built with the other
// fusion, or other alpha/beta/limit, misses the reference by far more than its bound.
TEST_P(MoeLayer, FusionAndActivationParametersAreHonoured) {
  std::mt19937_64 rng(3);  // fixed: random data could land near the reference by chance
  const MoeOptions o = options_for({6, 64, 32, 32, 2, 3}, QMOE_SWIGLU_INTERLEAVED, true);
  const auto model = make_moe_model(o, rng);
  ContextPtr ctx = make_context(GetParam(), 1);
  const uint32_t m = 3, k = 2;
  const std::vector<float> x = moe_activations(m, o.hidden, 6.0f, rng);
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(m, o.experts, k, rng, &ids, &w);
  const MoeReference ref = reference_moe(*model, QMOE_ACCURACY_EXACT, x, m, ids, w, k, nullptr, {});
  ASSERT_GT(ref.clamped, 0u);
  const auto misses = [&](const qmoe_expert_set_desc& desc) {
    qmoe_expert_set* raw = nullptr;
    EXPECT_EQ(qmoe_expert_set_create(&desc, &raw), QMOE_STATUS_OK);
    SetPtr set(raw);
    std::vector<float> y(size_t{m} * o.hidden);
    EXPECT_EQ(moe_forward(ctx.get(), set.get(), QMOE_ACCURACY_EXACT, m, x.data(), o.hidden,
                          ids.data(), w.data(), k, y.data(), o.hidden, nullptr),
              QMOE_STATUS_OK);
    int count = 0;
    for (size_t i = 0; i < y.size(); ++i) count += std::fabs(y[i] - ref.y[i]) > 10 * ref.tol[i];
    return count;
  };
  EXPECT_EQ(misses(model->desc), 0);
  const int outputs = static_cast<int>(size_t{m} * o.hidden);
  qmoe_expert_set_desc d = model->desc;
  d.swiglu_fusion = QMOE_SWIGLU_CONCATENATED;
  EXPECT_GT(misses(d), outputs / 2) << "fusion";
  d = model->desc;
  d.swiglu_alpha = 1.0f;
  EXPECT_GT(misses(d), outputs / 2) << "alpha";
  d = model->desc;
  d.swiglu_beta = 0.0f;
  EXPECT_GT(misses(d), outputs / 2) << "beta";
  d = model->desc;
  d.swiglu_limit = INFINITY;
  EXPECT_GT(misses(d), 0) << "limit";
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(MoeLayer);

}  // namespace
}  // namespace qmoe::testing
