#include "tests/moe/moe_reference.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "tests/gemm/q8_reference.h"

namespace qmoe::testing {
namespace {

// The fast level's activation quantization (tests/gemm/q8_reference.h, written from
// docs/formats.md, not from the library's quantizer), dequantized: out[k] = s_c * q_k.
void dequantized_q8(const float* x, uint32_t k_total, double* out) {
  const Q8Reference q = reference_quantize_q8(x, k_total);
  for (uint32_t k = 0; k < k_total; ++k) {
    out[k] = static_cast<double>(q.scale[k / 32]) * q.q[k];
  }
}

// FC2's fast-level input: a (FP64) quantized per 32 as the library quantizes its FP32 a',
// where |a' - a| <= da. Writes the dequantized values and, per element, a bound on the
// difference to the library's: the scale moves by at most max(da) / 127 (times |q| <= 127),
// and q itself can differ by one only where a * 127 / max|a| lies within the perturbation of
// a rounding boundary (k + 1/2).
void dequantized_q8_bound(const std::vector<double>& a, const std::vector<double>& da,
                          std::vector<double>* out, std::vector<double>* bound) {
  const uint32_t k_total = static_cast<uint32_t>(a.size());
  for (uint32_t c0 = 0; c0 < k_total; c0 += 32) {
    const uint32_t c1 = std::min(k_total, c0 + 32);
    double amax = 0, damax = 0;
    for (uint32_t k = c0; k < c1; ++k) {
      amax = std::max(amax, std::fabs(a[k]));
      damax = std::max(damax, da[k]);
    }
    const double s = amax / 127.0;
    const double scale_shift = damax + 1e-6 * amax;  // |s' - s| * 127, FP32 rounding included
    // Chunks whose max|a| is below 2^-119 quantize to 0 (lib/formats/int4_layout.h, kQ8FlushBelow).
    constexpr double kFlush = 0x1p-119;
    for (uint32_t k = c0; k < c1; ++k) {
      if (amax + damax < kFlush) {  // flushed whatever the perturbation
        (*out)[k] = 0.0;
        (*bound)[k] = amax + damax;
        continue;
      }
      if (amax <= 2 * damax || amax - damax < kFlush) {
        // All perturbation, or on either side of the flush: any q is possible.
        (*out)[k] = a[k];
        (*bound)[k] = 2 * (amax + damax);
        continue;
      }
      const double t = a[k] * 127.0 / amax;
      const double q = std::clamp(std::nearbyint(t), -127.0, 127.0);
      const double margin =
          127.0 * (da[k] + std::fabs(a[k]) * damax / (amax - damax)) / (amax - damax) + 1e-4;
      const double to_boundary = std::fabs(std::fabs(t - std::trunc(t)) - 0.5);
      (*out)[k] = s * q;
      (*bound)[k] = scale_shift + (to_boundary <= margin ? s + damax / 127.0 : 0.0);
    }
  }
}

// A projection's layout (n and k come from the layer's shape): no zero points, no bias.
Int4Options projection_layout(uint32_t block_size, qmoe_dtype scale_dtype, ScaleOrder order) {
  Int4Options p;
  p.block_size = block_size;
  p.scale_dtype = scale_dtype;
  p.scale_order = order;
  return p;
}

}  // namespace

std::string MoeOptions::describe() const {
  std::ostringstream s;
  s << "E=" << experts << " H=" << hidden << " I=" << intermediate
    << (fusion == QMOE_SWIGLU_INTERLEAVED ? " interleaved" : " concatenated") << " alpha=" << alpha
    << " beta=" << beta << " limit=" << limit << " fc1{" << fc1.describe() << "} fc2{"
    << fc2.describe() << "}";
  return s.str();
}

void use_gpt_oss_swiglu(MoeOptions* o) {
  o->alpha = 1.702f;
  o->beta = 1.0f;
  o->limit = 7.0f;
}

void use_qwen3_swiglu(MoeOptions* o) {
  o->alpha = 1.0f;
  o->beta = 0.0f;
  o->limit = INFINITY;
}

MoeOptions moe_shape(uint32_t experts, uint32_t hidden, uint32_t intermediate) {
  MoeOptions o;
  o.experts = experts;
  o.hidden = hidden;
  o.intermediate = intermediate;
  return o;
}

MoeOptions small_layer_a() {
  MoeOptions a = moe_shape(6, 80, 48);
  a.fc1 = projection_layout(16, QMOE_DTYPE_BF16, ScaleOrder::kGrouped);
  a.fc1.zero_points = true;
  a.fc1.bias = true;
  a.fc2 = projection_layout(16, QMOE_DTYPE_F16, ScaleOrder::kRowMajor);
  a.fc2.zero_points = true;
  a.fc2.zero_point_order = ScaleOrder::kBlockMajor;
  return a;
}

MoeOptions small_layer_b() {
  MoeOptions b = moe_shape(6, 96, 64);
  b.fc1 = projection_layout(32, QMOE_DTYPE_F16, ScaleOrder::kRowMajor);
  b.fc2 = projection_layout(64, QMOE_DTYPE_F32, ScaleOrder::kBlockMajor);
  b.fc2.bias = true;
  b.fc2.bias_dtype = QMOE_DTYPE_F16;
  return b;
}

MoeOptions qwen3_layer(uint32_t experts) {
  MoeOptions o = moe_shape(experts, 2048, 768);
  use_qwen3_swiglu(&o);
  o.fc1 = projection_layout(32, QMOE_DTYPE_F16, ScaleOrder::kGrouped);
  o.fc2 = projection_layout(32, QMOE_DTYPE_F16, ScaleOrder::kGrouped);
  return o;
}

MoeOptions graph_replay_layer() {
  MoeOptions o = moe_shape(8, 64, 96);
  o.fc1.scale_order = ScaleOrder::kGrouped;
  o.fc2.block_size = 32;
  o.fc2.zero_points = true;
  use_gpt_oss_swiglu(&o);
  return o;
}

std::unique_ptr<MoeModel> make_moe_model(const MoeOptions& options, std::mt19937_64& rng,
                                         Int4MatrixMaker make_matrix) {
  auto model = std::make_unique<MoeModel>();
  model->options = options;
  Int4Options fc1 = options.fc1, fc2 = options.fc2;
  fc1.n = 2 * options.intermediate;
  fc1.k = options.hidden;
  fc2.n = options.hidden;
  fc2.k = options.intermediate;
  model->fc1.reserve(options.experts);
  model->fc2.reserve(options.experts);
  for (uint32_t e = 0; e < options.experts; ++e) {
    model->fc1.push_back(make_matrix(fc1, rng));
    model->fc2.push_back(make_matrix(fc2, rng));
  }
  for (uint32_t e = 0; e < options.experts; ++e) {
    model->fc1_desc.push_back(&model->fc1[e].desc);
    model->fc2_desc.push_back(&model->fc2[e].desc);
  }
  qmoe_expert_set_desc_init(&model->desc);
  model->desc.num_experts = options.experts;
  model->desc.hidden = options.hidden;
  model->desc.intermediate = options.intermediate;
  model->desc.swiglu_fusion = options.fusion;
  model->desc.swiglu_alpha = options.alpha;
  model->desc.swiglu_beta = options.beta;
  model->desc.swiglu_limit = options.limit;
  model->desc.fc1 = model->fc1_desc.data();
  model->desc.fc2 = model->fc2_desc.data();
  return model;
}

MoeReference reference_moe(const MoeModel& model, qmoe_accuracy accuracy,
                           const std::vector<float>& x, uint32_t m, const std::vector<int32_t>& ids,
                           const std::vector<float>& weights, uint32_t k, const uint8_t* run_mask,
                           const std::vector<float>& y0) {
  std::vector<const Int4Matrix*> fc1, fc2;
  for (uint32_t e = 0; e < model.options.experts; ++e) {
    fc1.push_back(&model.fc1[e]);
    fc2.push_back(&model.fc2[e]);
  }
  return reference_moe_experts(model.options, fc1, fc2, accuracy, x, m, ids, weights, k, run_mask,
                               y0);
}

MoeReference reference_moe_experts(const MoeOptions& o, const std::vector<const Int4Matrix*>& fc1,
                                   const std::vector<const Int4Matrix*>& fc2,
                                   qmoe_accuracy accuracy, const std::vector<float>& x, uint32_t m,
                                   const std::vector<int32_t>& ids,
                                   const std::vector<float>& weights, uint32_t k,
                                   const uint8_t* run_mask, const std::vector<float>& y0) {
  const std::vector<double> exact(weights.begin(), weights.end());
  const std::vector<double> no_error(weights.size(), 0.0);
  return reference_moe_weighted(o, fc1, fc2, accuracy, x, m, ids, exact, no_error, k, run_mask, y0);
}

MoeReference reference_moe_weighted(const MoeOptions& o, const std::vector<const Int4Matrix*>& fc1,
                                    const std::vector<const Int4Matrix*>& fc2,
                                    qmoe_accuracy accuracy, const std::vector<float>& x, uint32_t m,
                                    const std::vector<int32_t>& ids,
                                    const std::vector<double>& weights,
                                    const std::vector<double>& weight_error, uint32_t k,
                                    const uint8_t* run_mask, const std::vector<float>& y0) {
  const uint32_t hidden = o.hidden, inter = o.intermediate;
  const bool fast = accuracy == QMOE_ACCURACY_FAST;
  const bool clamp = std::isfinite(o.limit);
  const double alpha = o.alpha, beta = o.beta, limit = o.limit;
  MoeReference ref;
  ref.y.assign(size_t{m} * hidden, 0.0);
  ref.tol.assign(size_t{m} * hidden, 0.0);
  std::vector<double> xin(hidden), h(2 * inter), eh(2 * inter);
  std::vector<double> a(inter), da(inter), ain(inter), dain(inter), y2(hidden), e2(hidden);
  for (uint32_t t = 0; t < m; ++t) {
    double* y = ref.y.data() + size_t{t} * hidden;
    double* tol = ref.tol.data() + size_t{t} * hidden;
    std::vector<double> magnitude(hidden, 0.0);  // sum_j |w_j y2_j| (+ |y0|)
    if (!y0.empty()) {
      for (uint32_t n = 0; n < hidden; ++n) {
        y[n] = y0[size_t{t} * hidden + n];
        magnitude[n] = std::fabs(y[n]);
      }
    }
    // FC1's input: X itself, or exactly the library's int8 rows at the fast level.
    if (fast) {
      dequantized_q8(x.data() + size_t{t} * hidden, hidden, xin.data());
    } else {
      for (uint32_t n = 0; n < hidden; ++n) xin[n] = x[size_t{t} * hidden + n];
    }
    for (uint32_t j = 0; j < k; ++j) {
      const int32_t e = ids[size_t{t} * k + j];
      const double w = weights[size_t{t} * k + j];
      const double dw = weight_error[size_t{t} * k + j];
      if (w == 0 || (run_mask != nullptr && run_mask[e] == 0)) continue;
      const Int4Matrix& w1 = *fc1[e];
      const Int4Matrix& w2 = *fc2[e];
      for (uint32_t n = 0; n < 2 * inter; ++n) {
        double s = w1.bias_values[n], abs_sum = 0;
        for (uint32_t kk = 0; kk < hidden; ++kk) {
          const double p = xin[kk] * w1.weight(n, kk);
          s += p;
          abs_sum += std::fabs(p);
        }
        h[n] = s;
        eh[n] = 1e-5 * abs_sum;  // FP32 accumulation, both levels
      }
      for (uint32_t i = 0; i < inter; ++i) {
        const uint32_t gi = o.fusion == QMOE_SWIGLU_INTERLEAVED ? 2 * i : i;
        const uint32_t ui = o.fusion == QMOE_SWIGLU_INTERLEAVED ? 2 * i + 1 : inter + i;
        double g = h[gi], u = h[ui];
        const double eg = eh[gi], eu = eh[ui];
        if (clamp) {
          ref.clamped += (g > limit) + (u > limit || u < -limit);
          g = std::min(g, limit);
          u = std::clamp(u, -limit, limit);
        }
        const double s = g / (1.0 + std::exp(-alpha * g));
        a[i] = s * (u + beta);
        da[i] = 1.1 * eg * (std::fabs(u + beta) + eu) + (std::fabs(s) + 1.1 * eg) * eu +
                4e-6 * (std::fabs(s) + 1.1 * eg) * (std::fabs(u) + std::fabs(beta) + eu);
      }
      // FC2's input and its distance to the library's.
      if (fast) {
        dequantized_q8_bound(a, da, &ain, &dain);
      } else {
        ain = a;
        dain = da;
      }
      for (uint32_t n = 0; n < hidden; ++n) {
        double s = w2.bias_values[n], propagated = 0, abs_sum = 0;
        for (uint32_t i = 0; i < inter; ++i) {
          const double wi = w2.weight(n, i);
          s += ain[i] * wi;
          propagated += std::fabs(wi) * dain[i];
          abs_sum += (std::fabs(ain[i]) + dain[i]) * std::fabs(wi);
        }
        y2[n] = s;
        e2[n] = propagated + 1e-5 * abs_sum;
      }
      // The library's weight is within dw of w (routing from logits in FP32), its expert
      // output within e2 of y2.
      for (uint32_t n = 0; n < hidden; ++n) {
        y[n] += w * y2[n];
        tol[n] += std::fabs(w) * e2[n] + dw * (std::fabs(y2[n]) + e2[n]);
        magnitude[n] += (std::fabs(w) + dw) * (std::fabs(y2[n]) + e2[n]);
      }
    }
    for (uint32_t n = 0; n < hidden; ++n) tol[n] += 1e-6 * magnitude[n] + 1e-30;
  }
  return ref;
}

Fp64Routing reference_route_topk(const std::vector<float>& logits, uint32_t m, uint32_t experts,
                                 uint32_t k, bool renormalize) {
  Fp64Routing r;
  r.ids.resize(size_t{m} * k);
  r.weights.resize(size_t{m} * k);
  r.weight_error.resize(size_t{m} * k);
  std::vector<int32_t> order(experts);
  for (uint32_t t = 0; t < m; ++t) {
    const float* row = logits.data() + size_t{t} * experts;
    std::iota(order.begin(), order.end(), 0);
    // Descending logit, lower id first among equal logits (docs/abi.md).
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    const double max = row[order[0]];
    // The sum: over the k selected, or over every expert.
    const uint32_t terms = renormalize ? k : experts;
    double sum = 0, lowest = max;
    for (uint32_t i = 0; i < terms; ++i) {
      const double l = row[order[i]];
      sum += std::exp(l - max);
      if (std::isfinite(l)) lowest = std::min(lowest, l);
    }
    // The library's FP32 weight exp(l - max) * (1 / sum) differs from this one by at most
    // (2 * spread + terms + 8) * 2^-24 of it: l - max rounded (relative 2^-24 of up to
    // `spread` = max - the lowest finite logit summed, moving exp by that much), expf within
    // 2 ulp, terms - 1 rounded additions of positive values, the reciprocal and the product.
    const double relative = (2 * (max - lowest) + terms + 8) * std::ldexp(1.0, -24);
    for (uint32_t j = 0; j < k; ++j) {
      const int32_t e = order[j];
      const double w = std::exp(static_cast<double>(row[e]) - max) / sum;
      r.ids[size_t{t} * k + j] = e;
      r.weights[size_t{t} * k + j] = w;
      r.weight_error[size_t{t} * k + j] = relative * w + 1e-45;
    }
  }
  return r;
}

MoeReference reference_moe_routed(const MoeModel& model, qmoe_accuracy accuracy,
                                  const std::vector<float>& x, uint32_t m,
                                  const Fp64Routing& routing, uint32_t k,
                                  const std::vector<float>& y0) {
  std::vector<const Int4Matrix*> fc1, fc2;
  for (uint32_t e = 0; e < model.options.experts; ++e) {
    fc1.push_back(&model.fc1[e]);
    fc2.push_back(&model.fc2[e]);
  }
  return reference_moe_weighted(model.options, fc1, fc2, accuracy, x, m, routing.ids,
                                routing.weights, routing.weight_error, k, nullptr, y0);
}

void random_routing(uint32_t m, uint32_t experts, uint32_t k, std::mt19937_64& rng,
                    std::vector<int32_t>* ids, std::vector<float>* weights) {
  ids->resize(size_t{m} * k);
  weights->resize(size_t{m} * k);
  std::vector<int32_t> order(experts);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (uint32_t t = 0; t < m; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t j = 0; j < k; ++j) {
      (*ids)[size_t{t} * k + j] = order[j];
      (*weights)[size_t{t} * k + j] = weight(rng);
    }
  }
}

std::vector<uint32_t> selections_per_expert(const std::vector<int32_t>& ids,
                                            const std::vector<float>& weights, uint32_t m,
                                            uint32_t k, uint32_t experts) {
  std::vector<uint32_t> counts(experts, 0);
  for (size_t s = 0; s < size_t{m} * k; ++s) {
    if (weights[s] != 0.0f) ++counts[static_cast<size_t>(ids[s])];
  }
  return counts;
}

}  // namespace qmoe::testing
