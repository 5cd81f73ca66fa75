// A synthetic MoE model for `qmoe run`, of one model's layer shape (model_presets.h; Qwen3-30B-A3B
// by default): weights of one format (weight_formats.h) in the canonical layout, generated
// deterministically from a seed, one allocation per layer.
#ifndef QMOE_TOOLS_QMOE_SYNTHETIC_MODEL_H_
#define QMOE_TOOLS_QMOE_SYNTHETIC_MODEL_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model_presets.h"
#include "qmoe/qmoe.h"
#include "qmoe/qmoe_store.h"
#include "weight_formats.h"

// splitmix64: small, fast, and good enough for synthetic weights and router logits.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Approximately N(0, 1): the centred sum of four uniforms, scaled to unit variance.
  float normalish() {
    const double sum = uniform() + uniform() + uniform() + uniform() - 2.0;
    return static_cast<float>(sum * 1.7320508075688772);
  }

 private:
  uint64_t state_;
};

// The layers a run generates: `layers` of the model preset's layer (apply_model_preset) in
// `format`. The defaults are Qwen3-30B-A3B's, the first preset.
struct ModelShape {
  const char* model = "qwen3-30b-a3b";  // the preset's name and title
  const char* title = "Qwen3-30B-A3B";
  uint32_t layers = 4;
  uint32_t experts = 128;
  uint32_t top_k = 8;
  uint32_t hidden = 2048;
  uint32_t intermediate = 768;
  qmoe_weight_format format = QMOE_WEIGHT_FORMAT_INT4;  // --format; run_format() has the rest
  float swiglu_alpha = 1.0f, swiglu_beta = 0.0f, swiglu_limit = INFINITY;
};

// The preset's layer shape and SwiGLU constants into *shape; its layer count and format stay.
void apply_model_preset(const ModelPreset& preset, ModelShape* shape);

// Byte sizes of one expert's planes in the shape's format (codes as
// qmoe_quant_matrix_codes_size gives them, scales in the format's scale type and the grouped
// order; no zero points, no bias): what one expert call reads.
struct ExpertBytes {
  size_t fc1_codes = 0, fc1_scales = 0, fc2_codes = 0, fc2_scales = 0;
  size_t total() const { return fc1_codes + fc1_scales + fc2_codes + fc2_scales; }
};

// Fails (false, message in *error) when qmoe_quant_matrix_codes_size fails.
bool expert_bytes(const ModelShape& shape, ExpertBytes* bytes, std::string* error);

// One layer: its weight buffer, the descriptions pointing into it, and the expert set.
class SyntheticLayer {
 public:
  SyntheticLayer() = default;
  ~SyntheticLayer();
  SyntheticLayer(const SyntheticLayer&) = delete;
  SyntheticLayer& operator=(const SyntheticLayer&) = delete;

  // Allocates and fills the layer's weights from (seed, layer index) on `threads` threads
  // (the result does not depend on the thread count), then creates the expert set.
  // `scale_table` holds 256 scales of the format's scale type (its raw bytes, 256 *
  // scale_bytes of them), one drawn per block. `on_expert_done` is called on the calling
  // thread with the number of experts generated so far.
  bool generate(const ModelShape& shape, const ExpertBytes& bytes, uint64_t seed, uint32_t layer,
                const unsigned char* scale_table, unsigned threads,
                const std::function<void(uint32_t)>& on_expert_done, std::string* error);

  // Or reads layer `layer` of an expert store, every expert's record (CRC-32C checked) into one
  // allocation, and creates the set over the records.
  bool load(const qmoe_expert_store* store, uint32_t layer, const qmoe_expert_store_info& info,
            std::string* error);

  // Or makes the set over the store's file, mapped (no weight memory: weight_data() is null).
  bool map(const qmoe_expert_store* store, uint32_t layer, std::string* error);

  const qmoe_expert_set* set() const { return set_; }
  // The layer's weight allocation (all experts' codes and scales).
  const unsigned char* weight_data() const { return data_; }
  size_t weight_bytes() const { return bytes_; }

 private:
  unsigned char* data_ = nullptr;
  size_t bytes_ = 0;
  std::vector<qmoe_quant_matrix> fc1_, fc2_;
  qmoe_expert_set* set_ = nullptr;
};

#endif  // QMOE_TOOLS_QMOE_SYNTHETIC_MODEL_H_
