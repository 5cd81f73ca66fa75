#include "run_routing.h"

#include <cmath>
#include <numeric>

#include "synthetic_model.h"

std::vector<uint32_t> popularity_order(uint32_t experts, uint64_t seed, uint32_t layer) {
  std::vector<uint32_t> order(experts);
  std::iota(order.begin(), order.end(), 0u);
  SplitMix64 rng(seed ^ (0xA0761D6478BD642Full * (uint64_t{layer} + 1)));
  for (uint32_t i = experts; i > 1; --i) {  // Fisher-Yates
    const uint32_t j = static_cast<uint32_t>(rng.next() % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

uint64_t drift_period_seed(uint64_t seed, uint64_t period) {
  if (period == 0) return seed;
  // Mixed rather than seed + period, so that seed s's period 1 is not seed s + 1's period 0.
  SplitMix64 mix(seed ^ (0xE7037ED1A0B428DBull * period));
  return mix.next();
}

std::vector<float> routing_bias(RoutingKind kind, const std::vector<uint32_t>& order) {
  std::vector<float> bias(order.size(), 0.0f);
  if (kind == RoutingKind::kZipf || kind == RoutingKind::kDrift) {
    for (size_t rank = 0; rank < order.size(); ++rank) {
      bias[order[rank]] = static_cast<float>(-kZipfExponent * std::log1p(double(rank)));
    }
  }
  return bias;
}

const char* routing_name(RoutingKind kind) {
  switch (kind) {
    case RoutingKind::kZipf:
      return "zipf";
    case RoutingKind::kDrift:
      return "drift";
    case RoutingKind::kUniform:
      break;
  }
  return "uniform";
}

qmoe_status draw_routing(const RoutingDraw& draw, uint32_t steps, RoutingTrace* trace) {
  trace->per_layer = size_t{draw.tokens} * draw.top_k;
  trace->per_step = trace->per_layer * draw.layers;
  trace->ids.resize(size_t{steps} * trace->per_step);
  trace->weights.resize(trace->ids.size());
  const bool drifts = draw.kind == RoutingKind::kDrift;
  const uint32_t period_steps = draw.drift_period > 0 ? draw.drift_period : 1;
  std::vector<std::vector<float>> bias(draw.layers);
  uint64_t biased_period = 0;
  auto set_bias = [&](uint64_t period) {
    const uint64_t seed = drifts ? drift_period_seed(draw.seed, period) : draw.seed;
    for (uint32_t l = 0; l < draw.layers; ++l) {
      bias[l] = routing_bias(draw.kind, popularity_order(draw.experts, seed, l));
    }
    biased_period = period;
  };
  set_bias(0);
  SplitMix64 rng(draw.seed ^ 0x9E6C63D0676A9A99ull);
  std::vector<float> logits(size_t{draw.tokens} * draw.experts);
  for (uint32_t s = 0; s < steps; ++s) {
    if (drifts && s / period_steps != biased_period) set_bias(s / period_steps);
    for (uint32_t l = 0; l < draw.layers; ++l) {
      for (size_t i = 0; i < logits.size(); ++i) {
        logits[i] = rng.normalish() + bias[l][i % draw.experts];
      }
      const size_t at = size_t{s} * trace->per_step + l * trace->per_layer;
      const qmoe_status status =
          qmoe_moe_route_topk(logits.data(), draw.tokens, draw.experts, draw.top_k, 1,
                              trace->ids.data() + at, trace->weights.data() + at);
      if (status != QMOE_STATUS_OK) return status;
    }
  }
  return QMOE_STATUS_OK;
}
