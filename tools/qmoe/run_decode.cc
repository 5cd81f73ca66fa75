#include "run_decode.h"

#include <algorithm>
#include <cmath>

#include "moe_layer_call.h"
#include "progress.h"
#include "run_check.h"
#include "run_checksum.h"
#include "run_clock.h"
#include "run_routing.h"

namespace {

// Scales each row of x (rows of h floats) to unit RMS.
void rms_normalize(float* x, uint32_t rows, uint32_t h) {
  for (uint32_t r = 0; r < rows; ++r) {
    float* row = x + size_t{r} * h;
    double sum = 0.0;
    for (uint32_t i = 0; i < h; ++i) sum += double{row[i]} * row[i];
    const float scale = sum > 0.0 ? static_cast<float>(1.0 / std::sqrt(sum / h)) : 1.0f;
    for (uint32_t i = 0; i < h; ++i) row[i] *= scale;
  }
}

// The hidden state [rows, hidden] between layers. With 16-bit activations it lives in
// `narrow_`, as in a runtime that keeps FP16 or BF16 activations: each layer reads and writes
// it in place, and the tool widens it for its RMS rescale and rounds it back.
class HiddenState {
 public:
  HiddenState(qmoe_context* context, qmoe_dtype type, uint32_t rows, uint32_t hidden)
      : context_(context),
        type_(type),
        rows_(rows),
        hidden_(hidden),
        wide_(size_t{rows} * hidden),
        narrow_(type == QMOE_DTYPE_F32 ? 0 : wide_.size()) {}

  // Draws the state from `rng`, then rescales it.
  qmoe_status init(SplitMix64& rng) {
    for (float& v : wide_) v = rng.normalish();
    rms_normalize(wide_.data(), rows_, hidden_);
    return narrow() ? round() : QMOE_STATUS_OK;
  }

  // Rescales each row to unit RMS, in FP32.
  qmoe_status normalize() {
    if (narrow()) {
      const qmoe_status status = widen();
      if (status != QMOE_STATUS_OK) return status;
    }
    rms_normalize(wide_.data(), rows_, hidden_);
    return narrow() ? round() : QMOE_STATUS_OK;
  }

  // What the layers read and write, in the activation type.
  void* layer_data() { return narrow() ? static_cast<void*>(narrow_.data()) : wide_.data(); }

  uint64_t checksum() const {
    return narrow() ? fnv1a(narrow_.data(), narrow_.size() * sizeof(uint16_t))
                    : fnv1a(wide_.data(), wide_.size() * sizeof(float));
  }

  // Over the FP32 state, as the last rescale left it.
  void summarize(float* max_abs, bool* finite) const {
    for (float v : wide_) {
      *finite = *finite && std::isfinite(v);
      *max_abs = std::max(*max_abs, std::fabs(v));
    }
  }

 private:
  bool narrow() const { return type_ != QMOE_DTYPE_F32; }
  qmoe_status round() {
    return type_ == QMOE_DTYPE_F16
               ? qmoe_convert_f32_to_f16(context_, wide_.data(), narrow_.data(), wide_.size())
               : qmoe_convert_f32_to_bf16(context_, wide_.data(), narrow_.data(), wide_.size());
  }
  qmoe_status widen() {
    return type_ == QMOE_DTYPE_F16
               ? qmoe_convert_f16_to_f32(context_, narrow_.data(), wide_.data(), wide_.size())
               : qmoe_convert_bf16_to_f32(context_, narrow_.data(), wide_.data(), wide_.size());
  }

  qmoe_context* context_;
  qmoe_dtype type_;
  uint32_t rows_, hidden_;
  std::vector<float> wide_;
  std::vector<uint16_t> narrow_;  // empty with FP32 activations
};

// A layer's router: logits drawn per token, routed top-k.
class Router {
 public:
  Router(uint32_t tokens, uint32_t experts, uint32_t top_k)
      : tokens_(tokens),
        experts_(experts),
        top_k_(top_k),
        logits_(size_t{tokens} * experts),
        weights_(size_t{tokens} * top_k),
        ids_(size_t{tokens} * top_k),
        seen_(experts) {}

  // Each token's logits: unit noise plus the layer's per-expert bias (run_routing.h).
  void draw_logits(SplitMix64& rng, const std::vector<float>& bias) {
    for (size_t i = 0; i < logits_.size(); ++i) logits_[i] = rng.normalish() + bias[i % experts_];
  }
  qmoe_status route() {
    return qmoe_moe_route_topk(logits_.data(), tokens_, experts_, top_k_, 1, ids_.data(),
                               weights_.data());
  }
  // Distinct experts with a nonzero weight: those whose weights the layer reads.
  uint32_t distinct_experts() {
    std::fill(seen_.begin(), seen_.end(), 0);
    uint32_t distinct = 0;
    for (size_t s = 0; s < ids_.size(); ++s) {
      if (weights_[s] != 0.0f && !seen_[ids_[s]]) {
        seen_[ids_[s]] = 1;
        ++distinct;
      }
    }
    return distinct;
  }
  const int32_t* ids() const { return ids_.data(); }
  const float* weights() const { return weights_.data(); }

 private:
  uint32_t tokens_, experts_, top_k_;
  std::vector<float> logits_, weights_;
  std::vector<int32_t> ids_;
  std::vector<uint8_t> seen_;
};

struct LayerTimes {
  double route_s = 0.0, moe_s = 0.0, tool_s = 0.0;
  uint32_t experts = 0;
};

// One layer of one step: router logits, routing, the layer, the rescale and the expert count,
// each timed.
int decode_layer(const SyntheticLayer& layer, const std::vector<float>& bias, SplitMix64& rng,
                 Router& router, HiddenState& state, MoeLayerCall& call, LayerTimes* times) {
  const auto t0 = Clock::now();
  router.draw_logits(rng, bias);
  const auto t1 = Clock::now();
  QMOE_CHECK(router.route());
  const auto t2 = Clock::now();
  call.set = layer.set();
  QMOE_CHECK(run_moe_layer(call));
  const auto t3 = Clock::now();
  QMOE_CHECK(state.normalize());
  times->experts = router.distinct_experts();
  const auto t4 = Clock::now();
  times->route_s = std::chrono::duration<double>(t2 - t1).count();
  times->moe_s = std::chrono::duration<double>(t3 - t2).count();
  times->tool_s = std::chrono::duration<double>((t1 - t0) + (t4 - t3)).count();
  return 0;
}

}  // namespace

int run_decode(const RunOptions& options, qmoe_context* context, const RunModel& model,
               DecodeResult* result) {
  const ModelShape& shape = options.shape;
  SplitMix64 rng(options.seed ^ 0xD1B54A32D192ED03ull);
  HiddenState state(context, options.activations, options.batch, shape.hidden);
  QMOE_CHECK(state.init(rng));
  Router router(options.batch, shape.experts, shape.top_k);
  std::vector<std::vector<float>> bias;
  for (uint32_t l = 0; l < shape.layers; ++l) {
    bias.push_back(routing_bias(options.routing, popularity_order(shape.experts, options.seed, l)));
  }
  std::vector<unsigned char> workspace(std::max<size_t>(model.workspace_bytes, 1));
  MoeLayerCall call;
  call.context = context;
  call.accuracy = options.accuracy;
  call.tokens = options.batch;
  call.top_k = shape.top_k;
  call.activations = options.activations;
  call.state = state.layer_data();
  call.hidden = shape.hidden;
  call.ids = router.ids();
  call.weights = router.weights();
  call.workspace = workspace.data();
  call.workspace_bytes = workspace.size();
  const size_t bytes_per_expert = model.expert_bytes.total();

  result->step_ms.reserve(options.tokens);
  const uint32_t steps = options.tokens + 1;  // the first is the warm-up
  Clock::time_point timed_start = Clock::now();
  Progress progress("decoding", uint64_t{options.tokens} * shape.layers, true);
  for (uint32_t step = 0; step < steps; ++step) {
    const bool timed = step > 0;
    if (step == 1) timed_start = Clock::now();
    const auto step_start = Clock::now();
    double step_moe_s = 0.0;
    uint64_t step_experts = 0;
    for (uint32_t l = 0; l < shape.layers; ++l) {
      LayerTimes times;
      const int code = decode_layer(*model.layers[l], bias[l], rng, router, state, call, &times);
      if (code != 0) return code;
      if (!timed) continue;
      result->route_s += times.route_s;
      result->moe_s += times.moe_s;
      result->tool_s += times.tool_s;
      result->experts_computed += times.experts;
      step_moe_s += times.moe_s;
      step_experts += times.experts;
      progress.update(uint64_t{step - 1} * shape.layers + l + 1);
    }
    if (!timed) continue;
    result->step_ms.push_back(seconds_since(step_start) * 1e3);
    if (step_moe_s > 0) {
      result->best_step_bytes_per_s =
          std::max(result->best_step_bytes_per_s,
                   static_cast<double>(step_experts) * bytes_per_expert / step_moe_s);
    }
  }
  progress.finish();
  result->decode_s = seconds_since(timed_start);
  result->checksum = state.checksum();
  state.summarize(&result->max_abs_x, &result->finite);
  return 0;
}
