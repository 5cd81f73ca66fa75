#include "model_presets.h"

#include <cmath>
#include <cstring>

namespace {

// From each model's published config.json (num_hidden_layers less the dense ones, the experts
// and experts per token, hidden_size, the experts' intermediate size; gpt-oss's swiglu_limit and
// its alpha 1.702 with up + 1). Qwen3 and Mixtral use SiLU: alpha 1, beta 0, no clamp.
constexpr float kNoLimit = INFINITY;
constexpr ModelPreset kPresets[] = {
    {"qwen3-30b-a3b", "Qwen3-30B-A3B", 48, 128, 8, 2048, 768, QMOE_WEIGHT_FORMAT_INT4, 1.0f, 0.0f,
     kNoLimit},
    {"qwen3-235b-a22b", "Qwen3-235B-A22B", 94, 128, 8, 4096, 1536, QMOE_WEIGHT_FORMAT_INT4, 1.0f,
     0.0f, kNoLimit},
    {"gpt-oss-20b", "gpt-oss-20b", 24, 32, 4, 2880, 2880, QMOE_WEIGHT_FORMAT_MXFP4, 1.702f, 1.0f,
     7.0f},
    {"gpt-oss-120b", "gpt-oss-120b", 36, 128, 4, 2880, 2880, QMOE_WEIGHT_FORMAT_MXFP4, 1.702f, 1.0f,
     7.0f},
    {"mixtral-8x7b", "Mixtral-8x7B", 32, 8, 2, 4096, 14336, QMOE_WEIGHT_FORMAT_INT4, 1.0f, 0.0f,
     kNoLimit},
    // Its routed experts only: the shared expert, the three dense layers and the sigmoid,
    // group-limited router are not modeled (the tool's router is a softmax top-k).
    {"deepseek-v3", "DeepSeek-V3 (routed experts)", 58, 256, 8, 7168, 2048, QMOE_WEIGHT_FORMAT_INT4,
     1.0f, 0.0f, kNoLimit},
};

}  // namespace

const ModelPreset* model_presets(size_t* count) {
  *count = sizeof(kPresets) / sizeof(kPresets[0]);
  return kPresets;
}

const ModelPreset* find_model_preset(const char* name) {
  if (name == nullptr) return nullptr;
  for (const ModelPreset& preset : kPresets) {
    if (std::strcmp(preset.name, name) == 0) return &preset;
  }
  return nullptr;
}

std::string model_preset_names(const char* separator) {
  std::string names;
  for (const ModelPreset& preset : kPresets) {
    if (!names.empty()) names += separator;
    names += preset.name;
  }
  return names;
}
