#include "run_model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "memory_limit.h"
#include "moe_layer_call.h"
#include "parallel_items.h"
#include "progress.h"
#include "run_check.h"
#include "run_clock.h"

namespace {

// 256 scales of `format`'s scale type (raw bytes), from which the generator draws one per
// block. The weights of every format spread about alike (RMS about 0.07, against the unit-RMS
// hidden state), so that a decode's numbers differ by format in what it reads, not in what it
// computes on:
//   INT4   FP16 in [0.01, 0.02] times code - 8 in [-8, 7]   (RMS 0.0708);
//   INT3   FP16 in [0.02, 0.04] times code - 4 in [-4, 3]   (0.0717);
//   MXFP4  E8M0 2^-6 or 2^-5 times E2M1 in [-6, 6]          (0.0723);
//   NVFP4  E4M3 128 to 448 times E2M1, times the global scale 1.375 * 2^-14 (0.0687).
int make_scale_table(qmoe_context* context, const RunFormat& format,
                     std::vector<unsigned char>* table) {
  table->assign(256 * format.scale_bytes, 0);
  switch (format.scale_dtype) {
    case QMOE_DTYPE_F16: {
      const float low = format.format == QMOE_WEIGHT_FORMAT_INT3 ? 0.02f : 0.01f;
      std::vector<float> values(256);
      for (int i = 0; i < 256; ++i) values[i] = low + low * static_cast<float>(i) / 255.0f;
      std::vector<uint16_t> bits(256);
      QMOE_CHECK(qmoe_convert_f32_to_f16(context, values.data(), bits.data(), 256));
      std::memcpy(table->data(), bits.data(), table->size());
      return 0;
    }
    case QMOE_DTYPE_E8M0:  // 2^(e - 127): e = 121 and 122, alternately
      for (int i = 0; i < 256; ++i) (*table)[i] = static_cast<unsigned char>(121 + (i & 1));
      return 0;
    case QMOE_DTYPE_F8_E4M3:  // 0x70 (128) to 0x7E (448, the largest; 0x7F is NaN), evenly
      for (int i = 0; i < 256; ++i) (*table)[i] = static_cast<unsigned char>(0x70 + i * 15 / 256);
      return 0;
    default:
      std::fprintf(stderr, "qmoe run: no scale table for %s weights\n", format.name);
      return 1;
  }
}

// The workspace grows with --batch (gigabytes at 65536 tokens) and needs an expert set to be
// sized: checked against memory as soon as the first layer exists, not after all of them, and
// before the OOM killer could answer instead.
int size_workspace(const RunOptions& options, qmoe_context* context, RunModel* model) {
  MoeLayerCall call;
  call.context = context;
  call.set = model->layers[0]->set();
  call.accuracy = options.accuracy;
  call.tokens = options.batch;
  call.top_k = options.shape.top_k;
  QMOE_CHECK(moe_layer_workspace_size(call, &model->workspace_bytes));
  const double workspace = static_cast<double>(model->workspace_bytes);
  const double weights = model->mapped_sizing ? 0.0 : model->weight_bytes_total;
  if (model->usable_memory > 0 && weights + workspace > 0.8 * model->usable_memory) {
    std::fprintf(stderr,
                 "\nqmoe run: the weights (%.1f GB) and a --batch %u workspace (%.1f GB) are "
                 "over 80%% of the %.1f GB of memory this process may use\n",
                 model->weight_bytes_total * 1e-9, options.batch, workspace * 1e-9,
                 model->usable_memory * 1e-9);
    return 2;
  }
  return 0;
}

}  // namespace

int size_run_model(const ModelShape& shape, bool mapped, RunModel* model) {
  std::string error;
  if (!expert_bytes(shape, &model->expert_bytes, &error)) {
    std::fprintf(stderr, "qmoe run: qmoe_quant_matrix_codes_size failed: %s\n", error.c_str());
    return 1;
  }
  const double per_layer = static_cast<double>(model->expert_bytes.total()) * shape.experts;
  model->weight_bytes_total = per_layer * shape.layers;
  model->usable_memory = usable_memory_bytes();
  const double usable = model->usable_memory;
  // Mapped weights are the page cache's to hold or drop: they are not this process's memory.
  if (!mapped && usable > 0 && model->weight_bytes_total > 0.7 * usable) {
    std::fprintf(stderr,
                 "qmoe run: %u layers need %.1f GB of weights, over 70%% of the %.1f GB of "
                 "memory this process may use (physical memory, or its cgroup's limit); at "
                 "most %u layers fit here\n",
                 shape.layers, model->weight_bytes_total * 1e-9, usable * 1e-9,
                 static_cast<unsigned>(0.7 * usable / per_layer));
    return 2;
  }
  return 0;
}

int generate_run_model(const RunOptions& options, qmoe_context* context, RunModel* model) {
  const ModelShape& shape = options.shape;
  std::vector<unsigned char> scale_table;
  if (const int code = make_scale_table(context, run_format(shape.format), &scale_table);
      code != 0) {
    return code;
  }

  const auto start = Clock::now();
  model->generate_threads = std::max(1u, std::thread::hardware_concurrency());
  Progress progress("generating weights", uint64_t{shape.layers} * shape.experts, true);
  for (uint32_t l = 0; l < shape.layers; ++l) {
    model->layers.push_back(std::make_unique<SyntheticLayer>());
    const uint64_t before = uint64_t{l} * shape.experts;
    std::string error;
    if (!model->layers.back()->generate(
            shape, model->expert_bytes, options.seed, l, scale_table.data(),
            model->generate_threads, [&](uint32_t done) { progress.update(before + done); },
            &error)) {
      std::fprintf(stderr, "\nqmoe run: %s\n", error.c_str());
      return 1;
    }
    if (l > 0) continue;
    if (const int code = size_workspace(options, context, model); code != 0) return code;
  }
  progress.finish();
  model->generate_s = seconds_since(start);
  return 0;
}

int load_run_model(const RunOptions& options, qmoe_context* context, const qmoe_expert_store* store,
                   const qmoe_expert_store_info& info, RunModel* model) {
  const auto start = Clock::now();
  const uint32_t layers = options.shape.layers;
  for (uint32_t l = 0; l < layers; ++l) model->layers.push_back(std::make_unique<SyntheticLayer>());
  const bool mapped = options.map_store;
  auto take = [&](uint32_t l, std::string* why) {
    return mapped ? model->layers[l]->map(store, l, why)
                  : model->layers[l]->load(store, l, info, why);
  };
  std::string error;
  if (!take(0, &error)) {
    std::fprintf(stderr, "qmoe run: %s\n", error.c_str());
    return 1;
  }
  if (const int code = size_workspace(options, context, model); code != 0) return code;
  // The other layers on every hardware thread (reads of one store may run at once).
  Progress progress("reading weights", layers, true);
  const unsigned threads = std::max(1u, std::min(std::thread::hardware_concurrency(), layers));
  const std::string failure = run_items_in_parallel(
      1, layers, threads,
      [&](uint32_t l, unsigned /*thread*/, std::string* why) { return take(l, why); },
      [&](uint32_t finished) { progress.update(1 + finished); });
  progress.finish();
  if (!failure.empty()) {
    std::fprintf(stderr, "qmoe run: %s\n", failure.c_str());
    return 1;
  }
  model->from_store = true;
  model->mapped = mapped;
  model->store_read_s = seconds_since(start);
  model->store_read_threads = threads;
  return 0;
}

double weight_bytes_on_huge_pages(const RunModel& model) {
  std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return 0.0;
  char line[256];
  double kib = 0.0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "AnonHugePages: %lf kB", &kib) == 1) break;
  }
  std::fclose(f);
  return std::min(kib * 1024.0, model.weight_bytes_total);
}
