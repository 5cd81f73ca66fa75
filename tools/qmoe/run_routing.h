// How the qmoe tool draws its router logits: uniform (every expert alike), Zipf-like (a few hot
// experts per layer, as trained routers are) or drifting Zipf (the hot experts change every
// period, as a conversation changes topic); which experts a layer's popularity ranks first (the
// ones a runtime keeps resident on the GPU); and the routing of whole steps, drawn once, so that
// `qmoe run --gpu` and `qmoe cache` route the same seed alike.
#ifndef QMOE_TOOLS_QMOE_RUN_ROUTING_H_
#define QMOE_TOOLS_QMOE_RUN_ROUTING_H_

#include <cstdint>
#include <vector>

#include "qmoe/qmoe.h"

enum class RoutingKind { kUniform, kZipf, kDrift };

// The exponent s of the Zipf-like routing: expert of popularity rank r (0 = hottest) gets the
// logit bias -s * ln(1 + r), so its softmax weight before top-k is proportional to (1 + r)^-s
// times the token's own noise.
constexpr double kZipfExponent = 1.0;

// A layer's experts in popularity order, hottest first: a permutation of [0, experts) drawn
// from (seed, layer), so the hot experts differ by layer as in a trained model.
std::vector<uint32_t> popularity_order(uint32_t experts, uint64_t seed, uint32_t layer);

// The seed of kDrift's popularity order in period `period` (steps [period * P, (period + 1) * P)
// for a drift period of P steps): `seed` itself for period 0, so a drifting trace starts as the
// Zipf one of the same seed, then a fresh order each period.
uint64_t drift_period_seed(uint64_t seed, uint64_t period);

// The per-expert logit bias of `kind` for a layer whose popularity order is `order`: all zero
// for kUniform; kZipf's and kDrift's the same (a drifting order is a Zipf one redrawn).
std::vector<float> routing_bias(RoutingKind kind, const std::vector<uint32_t>& order);

// "uniform", "zipf" or "drift".
const char* routing_name(RoutingKind kind);

// What draw_routing draws: `layers` layers of `experts` experts, `tokens` tokens per step, each
// routed to `top_k` experts, logits from `seed`; with kDrift, a new popularity order every
// `drift_period` steps (>= 1; the other kinds ignore it).
struct RoutingDraw {
  RoutingKind kind = RoutingKind::kUniform;
  uint32_t layers = 1, experts = 1, top_k = 1, tokens = 1;
  uint64_t seed = 1;
  uint32_t drift_period = 500;
};

// Every step's routing, laid out [step][layer][token][slot]: the expert ids and their weights
// (empty for a trace read from a file, routing_trace_file.h: the cache needs the ids only).
struct RoutingTrace {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  size_t per_layer = 0;  // tokens * top_k: one layer's ids of one step
  size_t per_step = 0;   // layers * per_layer
};

// Draws `steps` steps as the CPU decode draws its router logits (per token, unit noise plus the
// layer's bias), routed by qmoe_moe_route_topk with renormalize. One logit stream over steps,
// then layers, so a trace of the first S steps does not depend on how many steps follow.
// Returns qmoe_moe_route_topk's failure, if any (the library's message names it).
qmoe_status draw_routing(const RoutingDraw& draw, uint32_t steps, RoutingTrace* trace);

#endif  // QMOE_TOOLS_QMOE_RUN_ROUTING_H_
