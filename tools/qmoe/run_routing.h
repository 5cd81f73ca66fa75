// How `qmoe run` draws its router logits: uniform (every expert alike) or Zipf-like (a few hot
// experts per layer, as trained routers are), and which experts a layer's popularity ranks first
// (the ones a runtime keeps resident on the GPU).
#ifndef QMOE_TOOLS_QMOE_RUN_ROUTING_H_
#define QMOE_TOOLS_QMOE_RUN_ROUTING_H_

#include <cstdint>
#include <vector>

enum class RoutingKind { kUniform, kZipf };

// The exponent s of the Zipf-like routing: expert of popularity rank r (0 = hottest) gets the
// logit bias -s * ln(1 + r), so its softmax weight before top-k is proportional to (1 + r)^-s
// times the token's own noise.
constexpr double kZipfExponent = 1.0;

// A layer's experts in popularity order, hottest first: a permutation of [0, experts) drawn
// from (seed, layer), so the hot experts differ by layer as in a trained model.
std::vector<uint32_t> popularity_order(uint32_t experts, uint64_t seed, uint32_t layer);

// The per-expert logit bias of `kind` for a layer whose popularity order is `order`: all zero
// for kUniform.
std::vector<float> routing_bias(RoutingKind kind, const std::vector<uint32_t>& order);

// "uniform" or "zipf".
const char* routing_name(RoutingKind kind);

#endif  // QMOE_TOOLS_QMOE_RUN_ROUTING_H_
