#include "run_bandwidth.h"

#include "qmoe/qmoe_experimental.h"

#include <algorithm>

#include "run_check.h"
#include "run_clock.h"

int measure_buffer_bandwidth(const RunContext& run, RunBandwidth* bandwidth) {
  const auto start = Clock::now();
  const qmoe_host_info& host = run.host;
  bandwidth->llc_bytes =
      host.l3_cache_bytes
          ? size_t{host.l3_cache_bytes} * (host.l3_cache_instances ? host.l3_cache_instances : 1)
          : size_t{32} << 20;
  bandwidth->buffer_bytes = std::max<size_t>(8 * bandwidth->llc_bytes, size_t{256} << 20);
  QMOE_CHECK(qmoe_measure_read_bandwidth(run.context.get(), bandwidth->buffer_bytes, 3, 0,
                                         &bandwidth->one_thread));
  QMOE_CHECK(qmoe_measure_read_bandwidth(run.context.get(), bandwidth->buffer_bytes, 3, 1,
                                         &bandwidth->all_threads));
  bandwidth->reference = run.threads > 1 ? bandwidth->all_threads : bandwidth->one_thread;
  bandwidth->seconds += seconds_since(start);
  return 0;
}

int measure_buffer_bandwidth_again(const RunContext& run, RunBandwidth* bandwidth) {
  const auto start = Clock::now();
  QMOE_CHECK(qmoe_measure_read_bandwidth(run.context.get(), bandwidth->buffer_bytes, 3,
                                         run.threads > 1 ? 1 : 0, &bandwidth->reference_after));
  bandwidth->seconds += seconds_since(start);
  return 0;
}

double best_read_roof(const RunBandwidth& bandwidth) {
  return std::max({bandwidth.reference, bandwidth.weights, bandwidth.reference_after});
}

// Whole layers from the first (the least recently written) until the buffer's size, each read
// once per pass. On virtual machines the fresh buffer and the weights can land in memory of
// different speed from one process to the next; this is the roof of the pages the decode reads.
int measure_weights_bandwidth(const RunContext& run, const RunModel& model,
                              RunBandwidth* bandwidth) {
  // Mapped layers have no weight memory of their own to measure (the report says so).
  if (model.mapped) return 0;
  const auto start = Clock::now();
  for (int pass = 0; pass < 2; ++pass) {
    double seconds = 0.0;
    size_t bytes = 0;
    uint32_t l = 0;
    for (; l < model.layers.size() && bytes < bandwidth->buffer_bytes; ++l) {
      const SyntheticLayer& layer = *model.layers[l];
      double layer_bw = 0.0;
      QMOE_CHECK(qmoe_measure_read_bandwidth_over(run.context.get(), layer.weight_data(),
                                                  layer.weight_bytes(), 1, run.threads > 1,
                                                  &layer_bw));
      bytes += layer.weight_bytes();
      seconds += layer_bw > 0 ? static_cast<double>(layer.weight_bytes()) / layer_bw : 0;
    }
    const double pass_bw = seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0;
    bandwidth->weights = std::max(bandwidth->weights, pass_bw);
    bandwidth->weights_bytes = bytes;
    bandwidth->weights_layers = l;
  }
  bandwidth->seconds += seconds_since(start);
  return 0;
}
