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

std::vector<float> routing_bias(RoutingKind kind, const std::vector<uint32_t>& order) {
  std::vector<float> bias(order.size(), 0.0f);
  if (kind == RoutingKind::kZipf) {
    for (size_t rank = 0; rank < order.size(); ++rank) {
      bias[order[rank]] = static_cast<float>(-kZipfExponent * std::log1p(double(rank)));
    }
  }
  return bias;
}

const char* routing_name(RoutingKind kind) {
  return kind == RoutingKind::kZipf ? "zipf" : "uniform";
}
