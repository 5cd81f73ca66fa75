// `qmoe run --model`'s table (tools/qmoe/model_presets.h) and the synthetic model built from it:
// the table's entries are layers the library runs, its first entry is ModelShape's default, and
// a preset's SwiGLU constants reach the expert set the synthetic layer creates.
#include "tools/qmoe/model_presets.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "tools/qmoe/synthetic_model.h"

namespace {

TEST(ToolModelPresets, EntriesAreRunnableLayersWithDistinctNames) {
  size_t count = 0;
  const ModelPreset* presets = model_presets(&count);
  ASSERT_GT(count, 0u);
  std::set<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    const ModelPreset& p = presets[i];
    SCOPED_TRACE(p.name);
    EXPECT_TRUE(names.insert(p.name).second) << "a name twice";
    for (const char* c = p.name; *c != '\0'; ++c) EXPECT_FALSE(*c >= 'A' && *c <= 'Z');
    EXPECT_EQ(find_model_preset(p.name), &p);
    EXPECT_GT(p.moe_layers, 0u);
    EXPECT_GE(p.top_k, 1u);
    EXPECT_LE(p.top_k, p.experts);
    // The synthetic model's formats need K a multiple of 32 in both projections.
    EXPECT_EQ(p.hidden % 32, 0u);
    EXPECT_EQ(p.intermediate % 32, 0u);
    EXPECT_TRUE(std::isfinite(p.swiglu_alpha));
    EXPECT_TRUE(std::isfinite(p.swiglu_beta));
    EXPECT_GT(p.swiglu_limit, 0.0f);
  }
  EXPECT_EQ(find_model_preset("Qwen3-30B-A3B"), nullptr);  // names are lower case
  EXPECT_EQ(find_model_preset("qwen3"), nullptr);
  EXPECT_EQ(find_model_preset(nullptr), nullptr);
  EXPECT_EQ(model_preset_names(",").find("qwen3-30b-a3b,"), 0u);
}

// ModelShape's defaults are the first preset's, so a run without --model and a run with the
// default name generate the same layers.
TEST(ToolModelPresets, TheFirstPresetIsModelShapesDefault) {
  size_t count = 0;
  const ModelPreset& first = model_presets(&count)[0];
  const ModelShape defaults;
  ModelShape applied;
  applied.layers = 7;
  applied.format = QMOE_WEIGHT_FORMAT_NVFP4;
  apply_model_preset(first, &applied);
  EXPECT_STREQ(defaults.model, first.name);
  EXPECT_STREQ(defaults.title, first.title);
  EXPECT_EQ(defaults.experts, first.experts);
  EXPECT_EQ(defaults.top_k, first.top_k);
  EXPECT_EQ(defaults.hidden, first.hidden);
  EXPECT_EQ(defaults.intermediate, first.intermediate);
  EXPECT_EQ(defaults.format, first.format);
  EXPECT_EQ(defaults.swiglu_alpha, first.swiglu_alpha);
  EXPECT_EQ(defaults.swiglu_beta, first.swiglu_beta);
  EXPECT_EQ(defaults.swiglu_limit, first.swiglu_limit);
  // apply_model_preset leaves the layer count and the format to --layers and --format.
  EXPECT_EQ(applied.layers, 7u);
  EXPECT_EQ(applied.format, QMOE_WEIGHT_FORMAT_NVFP4);
  EXPECT_EQ(applied.hidden, first.hidden);
}

// One small INT4 layer of `shape` (seed 3), run on every token of `x` with the same routing:
// the outputs.
std::vector<float> run_small_layer(const ModelShape& shape, const std::vector<float>& x,
                                   uint32_t m) {
  std::vector<unsigned char> scales(256 * 2);
  for (int i = 0; i < 256; ++i) {  // FP16 1/16 (0x2C00) to about 1/8: positive, finite
    const uint16_t bits = static_cast<uint16_t>(0x2C00 + i);
    std::memcpy(&scales[2 * i], &bits, 2);
  }
  ExpertBytes bytes;
  std::string error;
  EXPECT_TRUE(expert_bytes(shape, &bytes, &error)) << error;
  SyntheticLayer layer;
  EXPECT_TRUE(layer.generate(
      shape, bytes, 3, 0, scales.data(), 1, [](uint32_t) {}, &error))
      << error;
  std::vector<float> y(x.size(), 0.0f);
  if (layer.set() == nullptr) return y;
  qmoe_context* context = nullptr;
  qmoe_context_options options;
  qmoe_context_options_init(&options);
  options.num_threads = 1;
  EXPECT_EQ(qmoe_context_create(&options, &context), QMOE_STATUS_OK);
  std::vector<int32_t> ids(size_t{m} * shape.top_k);
  std::vector<float> weights(ids.size(), 1.0f / static_cast<float>(shape.top_k));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % shape.experts);
  size_t workspace_bytes = 0;
  EXPECT_EQ(qmoe_moe_workspace_size(context, layer.set(), QMOE_ACCURACY_EXACT, m, shape.top_k,
                                    &workspace_bytes),
            QMOE_STATUS_OK);
  std::vector<unsigned char> workspace(workspace_bytes);
  qmoe_moe_params params;
  qmoe_moe_params_init(&params);
  params.accuracy = QMOE_ACCURACY_EXACT;
  params.m = m;
  params.dtype = QMOE_DTYPE_F32;
  params.x = x.data();
  params.ldx = shape.hidden;
  params.y = y.data();
  params.ldy = shape.hidden;
  params.k = shape.top_k;
  params.ids = ids.data();
  params.weights = weights.data();
  params.workspace = workspace.data();
  params.workspace_bytes = workspace.size();
  EXPECT_EQ(qmoe_moe_forward(context, layer.set(), &params), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  qmoe_context_destroy(context);
  return y;
}

TEST(ToolModelPresets, SwigluConstantsReachTheExpertSet) {
  ModelShape shape;
  shape.layers = 1;
  shape.experts = 4;
  shape.top_k = 2;
  shape.hidden = 64;
  shape.intermediate = 32;
  shape.format = QMOE_WEIGHT_FORMAT_INT4;
  const uint32_t m = 2;
  // Large activations: FC1's sums reach well past 7, where gpt-oss's clamp bites.
  std::vector<float> x(size_t{m} * shape.hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -40.0f : 40.0f) + 0.25f * (i % 7);

  const std::vector<float> silu = run_small_layer(shape, x, m);
  ModelShape clamped = shape;
  clamped.swiglu_limit = 7.0f;
  ModelShape gpt_oss = shape;
  gpt_oss.swiglu_alpha = 1.702f;
  gpt_oss.swiglu_beta = 1.0f;
  gpt_oss.swiglu_limit = 7.0f;
  const std::vector<float> with_limit = run_small_layer(clamped, x, m);
  const std::vector<float> with_all = run_small_layer(gpt_oss, x, m);
  // Each constant changes the layer's result: the set was created with it.
  EXPECT_NE(silu, with_limit) << "swiglu_limit did not reach the expert set";
  EXPECT_NE(with_limit, with_all) << "swiglu_alpha / swiglu_beta did not reach the expert set";
  for (float v : with_all) EXPECT_TRUE(std::isfinite(v));
  // The same constants give the same bits (the comparison above is not noise).
  EXPECT_EQ(run_small_layer(gpt_oss, x, m), with_all);
}

}  // namespace
