#include "run_store.h"

#include <cstdio>
#include <vector>

#include "run_check.h"
#include "run_clock.h"
#include "weight_formats.h"

int open_run_store(RunOptions* options, RunStore* store) {
  if (qmoe_expert_store_open(options->store, &store->store) != QMOE_STATUS_OK) {
    std::fprintf(stderr, "qmoe run: --store: %s\n", qmoe_last_error_message());
    return 1;
  }
  store->info.struct_size = sizeof store->info;
  QMOE_CHECK(qmoe_expert_store_get_info(store->store, &store->info));
  const qmoe_expert_store_info& info = store->info;
  ModelShape& shape = options->shape;
  if (info.num_experts != shape.experts || info.hidden != shape.hidden ||
      info.intermediate != shape.intermediate) {
    std::fprintf(stderr,
                 "qmoe run: --store %s holds experts of E, H, I = %u, %u, %u; --model %s has "
                 "%u, %u, %u\n",
                 options->store, info.num_experts, info.hidden, info.intermediate, shape.model,
                 shape.experts, shape.hidden, shape.intermediate);
    return 2;
  }
  if (info.fc1_format != info.fc2_format || find_run_format_of(info.fc1_format) == nullptr ||
      (options->format_given && info.fc1_format != shape.format)) {
    std::fprintf(stderr,
                 "qmoe run: --store %s holds FC1 of format %d and FC2 of format %d; qmoe run "
                 "decodes one format%s\n",
                 options->store, static_cast<int>(info.fc1_format),
                 static_cast<int>(info.fc2_format),
                 options->format_given ? ", the one --format names" : "");
    return 2;
  }
  if (options->layers_given && shape.layers > info.num_layers) {
    std::fprintf(stderr, "qmoe run: --layers %u, but --store %s holds %u layers\n", shape.layers,
                 options->store, info.num_layers);
    return 2;
  }
  shape.format = info.fc1_format;
  if (!options->layers_given) shape.layers = info.num_layers;
  return 0;
}

int write_run_store(const RunOptions& options, RunModel* model) {
  const auto start = Clock::now();
  std::vector<const qmoe_expert_set*> sets;
  for (const auto& layer : model->layers) sets.push_back(layer->set());
  QMOE_CHECK(qmoe_expert_store_write(options.write_store, sets.data(),
                                     static_cast<uint32_t>(sets.size())));
  model->store_write_s = seconds_since(start);
  return 0;
}
