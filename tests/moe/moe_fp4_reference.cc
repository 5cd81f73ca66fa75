#include "tests/moe/moe_fp4_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace qmoe::testing {
namespace {

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

}  // namespace

std::unique_ptr<Fp4Experts> make_fp4_experts(qmoe_weight_format format, uint32_t experts,
                                             uint32_t hidden, uint32_t inter,
                                             std::mt19937_64& rng) {
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

// FP64 layer and a per-output tolerance. Exact level: X as it is; FC1's outputs g and u off by at
// most 1e-4 of sum |x w| (gm, um: ten times the FP32 bound); SwiGLU passes that on as |da| <=
// 1.1 |u + beta| |dg| + |s| |du| (|ds/dg| <= 1.1, the clamps 1-Lipschitz); FC2 adds 1e-4 of
// sum |a W2| and carries sum |W2| |da|. Fast level: X replaced by the library's int8 rows (the
// same values), and FC2's input off by at most half its quantization step (max|a| / 127 / 2 per
// 32) on top of da.
void reference_fp4_moe(const Fp4Experts& e, const std::vector<float>& x, uint32_t m,
                       const std::vector<int32_t>& ids, const std::vector<float>& weights,
                       uint32_t k, qmoe_accuracy level, std::vector<double>* y,
                       std::vector<double>* tol) {
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

}  // namespace qmoe::testing
