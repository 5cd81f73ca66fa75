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

namespace qmoe::testing {
namespace {

constexpr float kPoison = -12345.678f;

struct SetDeleter {
  void operator()(qmoe_expert_set* s) const { qmoe_expert_set_destroy(s); }
};

struct Fp4Experts {
  uint32_t experts, hidden, inter;
  float alpha = 1.702f, beta = 1.0f, limit = 7.0f;
  std::vector<Fp4Matrix> fc1, fc2;
  std::vector<const qmoe_quant_matrix*> fc1_desc, fc2_desc;
  std::unique_ptr<qmoe_expert_set, SetDeleter> set;
};

std::unique_ptr<Fp4Experts> make_experts(qmoe_weight_format format, uint32_t experts,
                                         uint32_t hidden, uint32_t inter, std::mt19937_64& rng) {
  auto e = std::make_unique<Fp4Experts>();
  e->experts = experts;
  e->hidden = hidden;
  e->inter = inter;
  for (uint32_t i = 0; i < experts; ++i) {
    Fp4Options o1{format, 2 * inter, hidden, ScaleOrder::kGrouped, true};  // gpt-oss has biases
    Fp4Options o2{format, hidden, inter, ScaleOrder::kRowMajor, true};
    if (format == QMOE_WEIGHT_FORMAT_NVFP4) o1.global_scale = o2.global_scale = 0.25f;
    e->fc1.push_back(make_fp4_matrix(o1, rng));
    e->fc2.push_back(make_fp4_matrix(o2, rng));
  }
  for (uint32_t i = 0; i < experts; ++i) {
    e->fc1_desc.push_back(&e->fc1[i].desc);
    e->fc2_desc.push_back(&e->fc2[i].desc);
  }
  qmoe_expert_set_desc desc;
  qmoe_expert_set_desc_init(&desc);
  desc.num_experts = experts;
  desc.hidden = hidden;
  desc.intermediate = inter;
  desc.swiglu_fusion = QMOE_SWIGLU_INTERLEAVED;
  desc.fc1 = e->fc1_desc.data();
  desc.fc2 = e->fc2_desc.data();
  desc.swiglu_alpha = e->alpha;
  desc.swiglu_beta = e->beta;
  desc.swiglu_limit = e->limit;
  qmoe_expert_set* raw = nullptr;
  EXPECT_EQ(qmoe_expert_set_create(&desc, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  e->set.reset(raw);
  return e;
}

// The library's int8 activations of one row (docs/formats.md: per 32 k, q = round-half-even(x *
// 127 / max|x|), a chunk below 2^-119 flushed), dequantized in FP64.
std::vector<double> dequantized_q8(const double* x, uint32_t k) {
  std::vector<double> out(k);
  for (uint32_t c = 0; c < k; c += 32) {
    const uint32_t len = std::min<uint32_t>(32, k - c);
    float amax = 0;
    for (uint32_t i = 0; i < len; ++i)
      amax = std::max(amax, std::fabs(static_cast<float>(x[c + i])));
    const bool flush = amax < 0x1p-119f;
    const float inv = flush ? 0.0f : 127.0f / amax, step = flush ? 0.0f : amax / 127.0f;
    for (uint32_t i = 0; i < len; ++i) {
      const float q =
          std::clamp(std::nearbyint(static_cast<float>(x[c + i]) * inv), -127.0f, 127.0f);
      out[c + i] = static_cast<double>(q) * step;
    }
  }
  return out;
}

// FP64 layer and a per-output tolerance. Exact level: X as it is; FC1's outputs g and u off by at
// most 1e-4 of sum |x w| (gm, um: ten times the FP32 bound); SwiGLU passes that on as |da| <=
// 1.1 |u + beta| |dg| + |s| |du| (|ds/dg| <= 1.1, the clamps 1-Lipschitz); FC2 adds 1e-4 of
// sum |a W2| and carries sum |W2| |da|. Fast level: X replaced by the library's int8 rows (the
// same values), and FC2's input off by at most half its quantization step (max|a| / 127 / 2 per
// 32) on top of da.
void reference(const Fp4Experts& e, const std::vector<float>& x, uint32_t m,
               const std::vector<int32_t>& ids, const std::vector<float>& weights, uint32_t k,
               qmoe_accuracy level, std::vector<double>* y, std::vector<double>* tol) {
  const bool fast = level == QMOE_ACCURACY_FAST;
  constexpr double kRelative = 1e-4;
  y->assign(size_t{m} * e.hidden, 0.0);
  tol->assign(size_t{m} * e.hidden, 0.0);
  for (uint32_t t = 0; t < m; ++t) {
    std::vector<double> xin(x.begin() + size_t{t} * e.hidden, x.begin() + size_t{t + 1} * e.hidden);
    if (fast) xin = dequantized_q8(xin.data(), e.hidden);
    for (uint32_t j = 0; j < k; ++j) {
      const Fp4Matrix& w1 = e.fc1[ids[t * k + j]];
      const Fp4Matrix& w2 = e.fc2[ids[t * k + j]];
      const double w = weights[t * k + j];
      std::vector<double> a(e.inter), da(e.inter);
      for (uint32_t i = 0; i < e.inter; ++i) {
        double g = w1.bias_values[2 * i], u = w1.bias_values[2 * i + 1], gm = 0, um = 0;
        for (uint32_t kk = 0; kk < e.hidden; ++kk) {
          g += xin[kk] * w1.weight(2 * i, kk);
          u += xin[kk] * w1.weight(2 * i + 1, kk);
          gm += std::fabs(xin[kk] * w1.weight(2 * i, kk));
          um += std::fabs(xin[kk] * w1.weight(2 * i + 1, kk));
        }
        g = std::min(g, double{e.limit});
        u = std::clamp(u, -double{e.limit}, double{e.limit});
        const double s = g / (1.0 + std::exp(-e.alpha * g));
        a[i] = s * (u + e.beta);
        da[i] = kRelative * (1.1 * gm * std::fabs(u + e.beta) + std::fabs(s) * um) +
                kRelative * std::fabs(a[i]);
      }
      if (fast) {
        for (uint32_t c = 0; c < e.inter; c += 32) {
          double amax = 0;
          for (uint32_t i = c; i < c + 32; ++i) amax = std::max(amax, std::fabs(a[i]) + da[i]);
          for (uint32_t i = c; i < c + 32; ++i) da[i] += amax / 127.0 / 2.0;
        }
      }
      for (uint32_t n = 0; n < e.hidden; ++n) {
        double out = w2.bias_values[n], err = 0;
        for (uint32_t i = 0; i < e.inter; ++i) {
          out += a[i] * w2.weight(n, i);
          err += (kRelative * std::fabs(a[i]) + da[i]) * std::fabs(w2.weight(n, i));
        }
        (*y)[size_t{t} * e.hidden + n] += w * out;
        (*tol)[size_t{t} * e.hidden + n] +=
            std::fabs(w) * (err + kRelative * std::fabs(out)) + 1e-6 * std::fabs(w * out);
      }
    }
  }
}

class MoeFp4 : public IsaTest {};

TEST_P(MoeFp4, MatchesFp64ReferenceAndThreadCount) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (qmoe_weight_format format : {QMOE_WEIGHT_FORMAT_MXFP4, QMOE_WEIGHT_FORMAT_NVFP4}) {
    const uint32_t experts = 6, hidden = 96, inter = 64, k = 3;
    std::unique_ptr<Fp4Experts> e = make_experts(format, experts, hidden, inter, rng);
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
        reference(*e, x, m, ids, weights, k, level, &y_ref, &tol);
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
