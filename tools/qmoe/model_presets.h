// The MoE models `qmoe run --model` can imitate: each one's routed-expert layer as its published
// configuration gives it (experts a layer, experts a token, hidden size, the experts'
// intermediate size), its MoE depth, its SwiGLU constants and --format's default for it: the
// format its experts ship in where libqmoe has it (gpt-oss: MXFP4), INT4 otherwise (the others
// ship BF16 or FP8, and 4-bit quantizations of them are what a CPU serves). The synthetic model
// generates such layers; attention, dense layers and shared experts are not modeled.
#ifndef QMOE_TOOLS_QMOE_MODEL_PRESETS_H_
#define QMOE_TOOLS_QMOE_MODEL_PRESETS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "qmoe/qmoe.h"

struct ModelPreset {
  const char* name;     // --model's value, lower case
  const char* title;    // the report's name for it
  uint32_t moe_layers;  // MoE layers of the whole model (--layers N runs the first N)
  uint32_t experts, top_k, hidden, intermediate;
  qmoe_weight_format format;                      // --format's default
  float swiglu_alpha, swiglu_beta, swiglu_limit;  // qmoe_expert_set_desc's (limit: INFINITY)
};

// The table, in --help's order; the first entry is the default model.
const ModelPreset* model_presets(size_t* count);

// The entry named `name`, or null (and null for a null name).
const ModelPreset* find_model_preset(const char* name);

// The names joined by `separator`.
std::string model_preset_names(const char* separator);

#endif  // QMOE_TOOLS_QMOE_MODEL_PRESETS_H_
